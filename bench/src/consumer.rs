//! `outboxd bench consumer`: inbox throughput on Postgres, one transaction
//! per message against savepoint batches, and the native `BillingHandler`
//! against the billing plugin. Messages are handed to `process` /
//! `process_batch` directly, so the numbers are the consumer's own cost
//! (inbox mark, handler, commit) without a broker.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::BenchError;
use outboxd::broker::{Delivery, headers};
use outboxd::consumer::inbox::{Handler, process, process_batch};
use outboxd::consumer::{PluginHandler, Processed};
use outboxd::plugin::{ConsumerPlugin, EngineConfig, PluginEngine, PluginSpec, TxnPolicy};
use outboxd::store::{Db, migrate};
use outboxd_demo::billing::{self, BillingHandler};

#[derive(Debug, Clone, clap::Args)]
pub struct ConsumerBenchArgs {
    /// A Postgres URL of a database the benchmark may write `invoices` and
    /// `inbox` rows to.
    #[arg(long)]
    pub url: String,
    /// The billing plugin component (`plugins/dist/billing.wasm`).
    #[arg(long, default_value = "plugins/dist/billing.wasm")]
    pub plugin: PathBuf,
    /// Messages per run.
    #[arg(long, default_value_t = 2_000)]
    pub messages: usize,
    /// Messages per transaction in the batched runs.
    #[arg(long, default_value_t = 50)]
    pub batch: usize,
    /// Concurrent partitions (each handled in order by one task).
    #[arg(long, default_value_t = 4)]
    pub partitions: usize,
    /// Runs of each cell, interleaved (native, plugin, native, …); the best
    /// of each is reported, so a burst of noise on a shared machine hits
    /// one run rather than one side of the comparison.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
}

fn deliveries(run: &str, n: usize, partition: i32) -> Vec<Delivery> {
    (0..n)
        .map(|i| Delivery {
            attempt: 0,
            topic: "order.confirmed".into(),
            partition,
            offset: i as i64,
            key: None,
            payload: format!(
                r#"{{"order_id":"{run}-{partition}-{i}","customer_id":"c","total_cents":{i}}}"#
            )
            .into_bytes(),
            headers: vec![(
                headers::MESSAGE_ID.into(),
                uuid::Uuid::new_v4().to_string().into_bytes(),
            )],
        })
        .collect()
}

async fn run<H: Handler>(
    db: &Db,
    name: &str,
    handler: Arc<H>,
    args: &ConsumerBenchArgs,
    batch: usize,
) -> Result<f64, BenchError> {
    let per_partition = args.messages / args.partitions.max(1);
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..args.partitions.max(1) {
        let msgs = deliveries(name, per_partition, p as i32);
        let (db, handler, name) = (db.clone(), handler.clone(), name.to_string());
        tasks.spawn(async move {
            for chunk in msgs.chunks(batch) {
                if batch == 1 {
                    let r = process(&db, &name, &chunk[0], handler.as_ref()).await;
                    if !matches!(r, Ok(Processed::Handled)) {
                        return Err(format!("{r:?}"));
                    }
                } else {
                    let results = process_batch(&db, &name, chunk, handler.as_ref())
                        .await
                        .map_err(|e| e.to_string())?;
                    if results.len() != chunk.len()
                        || results.iter().any(|r| !matches!(r, Ok(Processed::Handled)))
                    {
                        return Err(format!("{results:?}"));
                    }
                }
            }
            Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.map_err(|e| BenchError::Incorrect(e.to_string()))?
            .map_err(BenchError::Incorrect)?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let total = per_partition * args.partitions.max(1);
    let Db::Postgres(pool) = db else {
        unreachable!("checked by the caller")
    };
    let invoices: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices WHERE order_id LIKE $1")
        .bind(format!("{name}-%"))
        .fetch_one(pool)
        .await?;
    if invoices != total as i64 {
        return Err(BenchError::Incorrect(format!(
            "{name}: {invoices} invoices for {total} messages"
        )));
    }
    Ok(total as f64 / seconds)
}

/// The plugin's SQL runs under a role of its own, as `outboxd run` demands
/// on Postgres, so the figures include switching to it: provisioned here
/// when the login may create roles (else the plugin's SQL runs as the host,
/// and the output says so).
async fn plugin_role(
    db: &Db,
    tables: &outboxd::config::TableGrants,
) -> Result<Option<String>, BenchError> {
    let Db::Postgres(pool) = db else {
        return Ok(None);
    };
    if !outboxd::store::plugin_roles::may_create_roles(pool).await? {
        println!("  (this login may not create roles: the plugin's SQL runs as the host)");
        return Ok(None);
    }
    let role = "outboxd_bench_billing".to_string();
    let mut c = outboxd::config::ConsumerSection::new(
        "billing",
        vec!["order.confirmed".into()],
        "plugin:billing",
    );
    c.tables = tables.clone();
    c.db_role = Some(role.clone());
    outboxd::store::plugin_roles::provision(pool, std::slice::from_ref(&c))
        .await
        .map_err(BenchError::Refused)?;
    println!("  plugin SQL runs as role {role}");
    Ok(Some(role))
}

pub async fn consumer(args: &ConsumerBenchArgs) -> Result<(), BenchError> {
    let db = Db::connect(&args.url, (args.partitions as u32).max(1) + 2).await?;
    if !matches!(db, Db::Postgres(_)) {
        return Err(BenchError::Refused(
            "the consumer benchmark needs a postgres:// URL".into(),
        ));
    }
    migrate(&db).await?;
    billing::create_schema(&db).await?;
    let engine = PluginEngine::new(EngineConfig::default())
        .map_err(|e| BenchError::Refused(e.to_string()))?;
    let mut spec = PluginSpec::new("billing", &args.plugin);
    spec.limits.timeout = std::time::Duration::from_secs(5);
    let plugin =
        ConsumerPlugin::load(&engine, &spec).map_err(|e| BenchError::Refused(e.to_string()))?;
    let plugin_ref = Arc::new(plugin);
    let tables = outboxd::config::TableGrants {
        read: vec![],
        write: vec!["invoices".into()],
    };
    let db_role = plugin_role(&db, &tables).await?;
    let policy = TxnPolicy {
        consumer: "billing".into(),
        tables,
        db_role,
        ..TxnPolicy::default()
    };
    let plugin = Arc::new(PluginHandler::new(plugin_ref.clone(), policy));
    let native = Arc::new(BillingHandler);
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    // A warm-up run fills the plugin's Store pool and the connection pool.
    run(
        &db,
        &format!("warm-{tag}"),
        plugin.clone(),
        args,
        args.batch,
    )
    .await?;
    let mut rows = Vec::new();
    for (label, batch) in [("per message", 1), ("batched", args.batch)] {
        let (mut n, mut p) = (Vec::new(), Vec::new());
        for i in 0..args.repeat.max(1) {
            n.push(
                run(
                    &db,
                    &format!("native-{batch}-{i}-{tag}"),
                    native.clone(),
                    args,
                    batch,
                )
                .await?,
            );
            p.push(
                run(
                    &db,
                    &format!("plugin-{batch}-{i}-{tag}"),
                    plugin.clone(),
                    args,
                    batch,
                )
                .await?,
            );
        }
        let best = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "  {label}: native runs {n:.0?}, plugin runs {p:.0?}; medians {:.0} / {:.0} = {:.0}%",
            median(&n),
            median(&p),
            100.0 * median(&p) / median(&n)
        );
        rows.push((label, batch, best(&n), best(&p)));
    }
    println!(
        "consumer throughput, {} messages over {} partitions (messages/s, best of {}):",
        args.messages,
        args.partitions,
        args.repeat.max(1)
    );
    println!("| mode | batch | native BillingHandler | billing plugin | plugin/native |");
    println!("|---|---|---|---|---|");
    for (label, batch, n, p) in &rows {
        println!(
            "| {label} | {batch} | {n:.0} | {p:.0} | {:.0}% |",
            100.0 * p / n
        );
    }
    let m = plugin_ref.metrics().snapshot();
    println!(
        "plugin calls: {} (mean {:.1} µs each, including its statements' round trips), {} instances created",
        m.calls,
        m.total_time.as_secs_f64() * 1e6 / m.calls.max(1) as f64,
        m.instantiations
    );
    let (_, _, n1, p1) = rows[0];
    let (_, _, nb, pb) = rows[1];
    println!(
        "batching speed-up: native {:.1}x, plugin {:.1}x",
        nb / n1,
        pb / p1
    );
    Ok(())
}
