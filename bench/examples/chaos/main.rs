//! The chaos soak (the faults deploys and outages bring, all at once): producers commit events continuously over
//! 10,000 aggregates while two relay processes and two consumer processes
//! are SIGKILLed and restarted, the broker is killed and restarted, Postgres
//! connections are terminated and a transformer and a consumer plugin are
//! hot-swapped. Then it drains and checks, from the database alone, that
//! nothing was lost, no effect happened twice and every aggregate's effects
//! ran in commit order. It prints one line of figures and exits non-zero
//! when a check fails.
//!
//! Run it through `tests/chaos.sh` (it builds everything and starts tansu
//! with durable storage); `--help` lists the knobs.

mod checks;
mod cluster;
mod faults;
mod producers;
mod rng;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use outboxd::store::{Db, migrate};
use sqlx::Executor;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::watch;
use tokio::task::JoinSet;

use cluster::{Broker, Proc};
use faults::{Fault, Kills, broker_hung, schedule, supervise, unhang};
use rng::Rng;

#[derive(Debug, Parser)]
struct Args {
    /// How long producers run and faults are injected.
    #[arg(long, default_value_t = 100)]
    seconds: u64,
    /// Give up waiting for the drain after this long.
    #[arg(long, default_value_t = 240)]
    drain_timeout: u64,
    /// Events per second, all producers together.
    #[arg(long, default_value_t = 200)]
    rate: u32,
    #[arg(long, default_value_t = 10_000)]
    aggregates: u32,
    /// Replays a run's fault schedule and producer choices.
    #[arg(long)]
    seed: Option<u64>,
    /// A Postgres URL whose user may CREATE DATABASE.
    #[arg(long, env = "OUTBOXD_TEST_DATABASE_URL")]
    database_url: String,
    #[arg(long, env = "OUTBOXD_TEST_KAFKA")]
    bootstrap: String,
    #[arg(long, default_value = "target/debug/outboxd")]
    outboxd: PathBuf,
    #[arg(long, default_value = "tests/tansu.sh")]
    tansu_script: PathBuf,
    #[arg(long, default_value = "plugins/dist")]
    plugins: PathBuf,
    /// Broker kills (at least 3, so recovery is exercised more than once;
    /// 0 isolates the other faults when diagnosing).
    #[arg(long, default_value_t = 3)]
    broker_kills: u32,
    /// Keeps the database and the logs for a post-mortem.
    #[arg(long)]
    keep: bool,
    /// Also write the figures as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir()?;
    let dir_path = if args.keep {
        dir.keep()
    } else {
        dir.path().to_path_buf()
    };

    let (base, _) = args
        .database_url
        .rsplit_once('/')
        .context("--database-url must end in /DBNAME")?;
    let name = format!("outboxd_chaos_{}", std::process::id());
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&args.database_url)
        .await
        .context("connect to --database-url")?;
    admin
        .execute(format!("DROP DATABASE IF EXISTS {name}").as_str())
        .await?;
    admin
        .execute(format!("CREATE DATABASE {name}").as_str())
        .await?;
    let url = format!("{base}/{name}");
    // The driver's own connections are named, so the faults spare them.
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(outboxd::store::host_pg_options(&format!(
            "{url}?application_name=chaos-driver"
        ))?)
        .await?;
    let db = Db::Postgres(pool.clone());
    migrate(&db).await?;
    outboxd_demo::orders::create_schema(&db).await?;
    outboxd::store::execute_in_app_schema(&db, producers::BUSINESS_SCHEMA).await?;
    let props = [("bootstrap.servers".to_string(), args.bootstrap.clone())].into();
    outboxd::broker::kafka::ensure_topics(&props, &[cluster::TOPIC.to_string()], 4)
        .await
        .map_err(|e| anyhow::anyhow!("create {}: {e}", cluster::TOPIC))?;

    let (relay_cfg, [consumer_cfg, consumer2_cfg]) =
        cluster::write_configs(&dir_path, &url, &args.bootstrap)?;
    cluster::plugin_roles(&args.outboxd, &consumer_cfg).await?;
    let wasm = |f: &str| args.plugins.join(f);
    for (cfg, file, plugin) in [
        (&relay_cfg, "redact-pii.wasm", "shape"),
        (&consumer_cfg, "ledger.wasm", "ledger"),
    ] {
        println!(
            "chaos: {}",
            cluster::deploy(&args.outboxd, cfg, &wasm(file), plugin).await?
        );
    }
    let mut procs = vec![
        Proc::new("relay-1", &args.outboxd, &relay_cfg, &dir_path),
        Proc::new("relay-2", &args.outboxd, &relay_cfg, &dir_path),
        Proc::new("consumer-1", &args.outboxd, &consumer_cfg, &dir_path),
        Proc::new("consumer-2", &args.outboxd, &consumer2_cfg, &dir_path),
    ];
    for p in &mut procs {
        p.start()?;
    }
    let tansu_log = std::env::var_os("TANSU_STATE_DIR")
        .map_or_else(|| PathBuf::from("/tmp/outboxd-tansu"), PathBuf::from)
        .join("log");
    let mut broker = Broker {
        script: args.tansu_script.clone(),
        read: std::fs::metadata(&tansu_log).map_or(0, |m| m.len()),
        log: tansu_log,
    };
    println!(
        "chaos: seed {seed}, {} s at {} events/s over {} aggregates; logs in {}",
        args.seconds,
        args.rate,
        args.aggregates,
        dir_path.display()
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut producer_set = JoinSet::new();
    let produced = producers::spawn(
        &mut producer_set,
        pool.clone(),
        args.rate,
        args.aggregates,
        seed,
        stop_rx,
    );

    let run = Duration::from_secs(args.seconds);
    let plan = schedule(&mut rng, run, args.broker_kills);
    let start = Instant::now();
    let mut kills = Kills::default();
    let mut last_fault = start;
    let mut max_backlog_ms = 0i64;
    let mut next_sample = start;
    let mut plan = plan;
    plan.reverse(); // popped from the end, earliest first
    let mut broker_started = Instant::now();
    let mut backlog_ms = 0i64;
    while let Some((when, fault)) = plan.pop() {
        while start.elapsed() < when {
            if Instant::now() >= next_sample {
                backlog_ms = checks::backlog_age_ms(&pool).await?;
                max_backlog_ms = max_backlog_ms.max(backlog_ms);
                next_sample += Duration::from_millis(500);
            }
            for p in &mut procs {
                p.check_alive()?;
            }
            if broker.crashed() {
                supervise(&mut broker, &mut kills).await?;
                broker_started = Instant::now();
            } else if broker_hung(&broker, backlog_ms, broker_started.elapsed()) {
                unhang(&mut broker, &mut kills).await?;
                broker_started = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let now = start.elapsed();
        // Restarts are scheduled like faults, so a slow one never delays
        // the rest of the plan.
        let mut later = None;
        match fault {
            Fault::KillProc(i) => {
                procs[i].kill().await;
                if i < 2 {
                    kills.relay += 1
                } else {
                    kills.consumer += 1
                }
                later = Some((now + rng.millis(200, 1_500), Fault::StartProc(i)));
            }
            Fault::StartProc(i) => procs[i].start()?,
            Fault::Broker => {
                broker.kill().await?;
                // Down on purpose: not a hang.
                broker_started = Instant::now();
                kills.broker += 1;
                later = Some((now + rng.millis(1_000, 4_000), Fault::BrokerBack));
            }
            Fault::BrokerBack => {
                broker.restart().await?;
                broker_started = Instant::now();
            }
            Fault::PgTerminate => {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                      WHERE datname = current_database() AND pid <> pg_backend_pid()
                        AND application_name <> 'chaos-driver'
                        AND random() < 0.5",
                )
                .fetch_one(&pool)
                .await?;
                kills.pg_backends += n as u32;
            }
            Fault::SwapTransformer | Fault::SwapConsumer => {
                let (cfg, file, name) = match fault {
                    Fault::SwapTransformer => (&relay_cfg, "cloudevents.wasm", "shape"),
                    _ => (&consumer_cfg, "ledger-v2.wasm", "ledger"),
                };
                let out = cluster::deploy(&args.outboxd, cfg, &wasm(file), name).await?;
                println!("chaos: [{:>5.1}s] {out}", start.elapsed().as_secs_f64());
                kills.swaps += 1;
            }
        }
        if let Some(event) = later {
            let at = plan.partition_point(|(t, _)| *t > event.0);
            plan.insert(at, event);
        }
        last_fault = Instant::now();
    }
    while start.elapsed() < run {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let fault_phase = start.elapsed();
    let _ = stop_tx.send(true);
    while producer_set.join_next().await.is_some() {}
    let producers_stopped = Instant::now();

    // Drain: wait until every committed event has its effect (or was given
    // up on with a reason), while the processes keep running.
    let drain_deadline = Instant::now() + Duration::from_secs(args.drain_timeout);
    let mut drained = false;
    while Instant::now() < drain_deadline {
        for p in &mut procs {
            p.check_alive()?;
        }
        backlog_ms = checks::backlog_age_ms(&pool).await?;
        if broker.crashed() {
            supervise(&mut broker, &mut kills).await?;
            broker_started = Instant::now();
            last_fault = Instant::now();
        } else if broker_hung(&broker, backlog_ms, broker_started.elapsed()) {
            unhang(&mut broker, &mut kills).await?;
            broker_started = Instant::now();
            last_fault = Instant::now();
        }
        max_backlog_ms = max_backlog_ms.max(backlog_ms);
        if checks::outstanding(&pool).await? == 0 {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let drain_ms = last_fault.elapsed().as_millis();
    let drain_after_stop_ms = producers_stopped.elapsed().as_millis();
    for p in &mut procs {
        p.kill().await;
    }
    let verdict = checks::verdict(&pool).await?;
    let produced_events = produced
        .account_events
        .load(std::sync::atomic::Ordering::Relaxed)
        + produced.orders.load(std::sync::atomic::Ordering::Relaxed);
    let line = format!(
        "chaos: seconds={} events={} relay_kills={} consumer_kills={} broker_kills={} broker_crashes={} broker_hangs={} pg_kills={} swaps={} \
         lost={} duplicate_effects={} order_violations={} atomicity_violations={} unpublished={} \
         dead={} consumer_dead_letters={} max_backlog_age_ms={} drain_ms={} drain_after_stop_ms={}{}",
        fault_phase.as_secs(),
        verdict.events,
        kills.relay,
        kills.consumer,
        kills.broker,
        kills.broker_crashes,
        kills.broker_hangs,
        kills.pg_backends,
        kills.swaps,
        verdict.lost,
        verdict.duplicate_effects,
        verdict.order_violations,
        verdict.atomicity_violations,
        verdict.unpublished,
        verdict.dead,
        verdict.consumer_dead_letters,
        max_backlog_ms,
        drain_ms,
        drain_after_stop_ms,
        if drained { "" } else { " (drain timed out)" },
    );
    println!(
        "chaos: producers committed {produced_events} events ({} commit errors); effects by \
         version {:?}; payload shapes {:?}; transformed by {:?}",
        produced.errors.load(std::sync::atomic::Ordering::Relaxed),
        verdict.by_writer,
        verdict.by_shape,
        verdict.by_transformer
    );
    println!("{line}");
    if let Some(path) = &args.json {
        let doc = serde_json::json!({ "seed": seed, "kills": kills, "verdict": verdict,
            "max_backlog_age_ms": max_backlog_ms, "drain_ms": drain_ms as u64,
            "drain_after_stop_ms": drain_after_stop_ms as u64, "drained": drained });
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)?;
    }
    let swapped = verdict.by_writer.len() == 2 && verdict.by_shape.len() == 2;
    let ok = drained && verdict.ok() && kills.broker >= args.broker_kills && swapped;
    pool.close().await;
    if !args.keep {
        admin
            .execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
            .await?;
    }
    if !ok {
        anyhow::bail!(
            "the soak failed (seed {seed}): drained={drained}, both versions and shapes seen={swapped}; \
             rerun with --seed {seed} --keep for the logs"
        );
    }
    Ok(())
}
