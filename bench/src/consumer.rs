//! `outboxd bench consumer`: inbox throughput on Postgres, one transaction
//! per message against savepoint batches, and the native `BillingHandler`
//! against billing plugins (the same effect in Rust, Python or JavaScript:
//! `--plugin` once per component). Messages are handed to `process` /
//! `process_batch` directly, so the numbers are the consumer's own cost
//! (inbox mark, handler, commit) without a broker.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::BenchError;
use outboxd::config::PluginSpec;
use outboxd::config::TxnPolicy;
use outboxd::consumer::batch::process_batch;
use outboxd::consumer::inbox::{Handler, process};
use outboxd::consumer::{PluginHandler, Processed};
use outboxd::message::Delivery;
use outboxd::message::headers;
use outboxd::plugin::ConsumerPlugin;
use outboxd::plugin::EngineConfig;
use outboxd::plugin::PluginEngine;
use outboxd::store::{Db, migrate};
use outboxd_demo::billing::{self, BillingHandler};

#[derive(Debug, Clone, clap::Args)]
pub struct ConsumerBenchArgs {
    /// A Postgres URL of a database the benchmark may write `invoices` and
    /// `inbox` rows to.
    #[arg(long)]
    pub url: String,
    /// A billing plugin component; repeat it to compare several
    /// (`plugins/dist/billing.wasm`, `py-billing.wasm`, `js-billing.wasm`).
    /// Each is labelled with its file name.
    #[arg(long, default_value = "plugins/dist/billing.wasm")]
    pub plugin: Vec<PathBuf>,
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
    if !outboxd::store::plugin_sql::roles::may_create_roles(pool).await? {
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
    outboxd::store::plugin_sql::roles::provision(pool, std::slice::from_ref(&c))
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
    let mut plugins = Vec::new();
    for path in &args.plugin {
        let label = path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into_owned(),
        );
        let mut spec = PluginSpec::new("billing", path);
        spec.limits.timeout = std::time::Duration::from_secs(5);
        let plugin = Arc::new(
            ConsumerPlugin::load(&engine, &spec)
                .map_err(|e| BenchError::Refused(format!("{}: {e}", path.display())))?,
        );
        let handler = Arc::new(PluginHandler::new(plugin.clone(), policy.clone()));
        plugins.push((label, plugin, handler));
    }
    let native = Arc::new(BillingHandler);
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    // A warm-up run of each fills its Store pool and the connection pool.
    for (label, _, handler) in &plugins {
        run(
            &db,
            &format!("warm-{label}-{tag}"),
            handler.clone(),
            args,
            args.batch,
        )
        .await?;
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // One row per mode: the native median, then each plugin's median.
    let mut rows: Vec<(&str, usize, f64, Vec<f64>)> = Vec::new();
    for (mode, batch) in [("per message", 1), ("batched", args.batch)] {
        let mut native_runs = Vec::new();
        let mut plugin_runs = vec![Vec::new(); plugins.len()];
        for i in 0..args.repeat.max(1) {
            native_runs.push(
                run(
                    &db,
                    &format!("native-{batch}-{i}-{tag}"),
                    native.clone(),
                    args,
                    batch,
                )
                .await?,
            );
            for (k, (label, _, handler)) in plugins.iter().enumerate() {
                plugin_runs[k].push(
                    run(
                        &db,
                        &format!("{label}-{batch}-{i}-{tag}"),
                        handler.clone(),
                        args,
                        batch,
                    )
                    .await?,
                );
            }
        }
        println!("  {mode}: native runs {native_runs:.0?}");
        for ((label, _, _), runs) in plugins.iter().zip(&plugin_runs) {
            println!("  {mode}: {label} runs {runs:.0?}");
        }
        rows.push((
            mode,
            batch,
            median(&native_runs),
            plugin_runs.iter().map(|r| median(r)).collect(),
        ));
    }
    println!(
        "consumer throughput, {} messages over {} partitions (messages/s, median of {} interleaved runs):",
        args.messages,
        args.partitions,
        args.repeat.max(1)
    );
    let labels: Vec<&str> = plugins.iter().map(|(l, _, _)| l.as_str()).collect();
    println!(
        "| mode | batch | native BillingHandler | {} |",
        labels
            .iter()
            .map(|l| format!("{l} (of native)"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|---|---|{}", "---|".repeat(labels.len()));
    for (mode, batch, n, ps) in &rows {
        let cells: Vec<String> = ps
            .iter()
            .map(|p| format!("{p:.0} ({:.0}%)", 100.0 * p / n))
            .collect();
        println!("| {mode} | {batch} | {n:.0} | {} |", cells.join(" | "));
    }
    for (label, plugin, _) in &plugins {
        let m = plugin.metrics().snapshot();
        println!(
            "{label}: {} calls (mean {:.1} µs each, including its statements' round trips), {} instances created",
            m.calls,
            m.total_time.as_secs_f64() * 1e6 / m.calls.max(1) as f64,
            m.instantiations
        );
    }
    Ok(())
}
