//! `outboxd bench relay`: events/s of the relay over a grid, against a
//! sequential poll-and-mark relay (await each send, one UPDATE per row) in
//! the same run, so the speed-up is measured on the same machine and sink.
//!
//! The sinks and the exactly-once, in-order check are in `relay_sink.rs`;
//! the rows and what is printed of them in `relay_report.rs`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sqlx::{PgPool, Row};

use super::BenchError;
use super::relay_report::{Cell, RelayBenchRow, print_ratios, print_row, row};
use super::relay_sink::{Sink, Verifying, check};
use outboxd::broker::Publisher;
use outboxd::clock::SystemClock;
use outboxd::config::PluginSpec;
use outboxd::plugin::EngineConfig;
use outboxd::plugin::PluginEngine;
use outboxd::plugin::lifecycle::chains::Chains;
use outboxd::plugin::lifecycle::chains::build_chains;
use outboxd::relay::Relay;
use outboxd::relay::RelayConfig;
use outboxd::relay::worker::{self, WorkerConfig};
use outboxd::route::Route;
use outboxd::route::Router;
use outboxd::store::outbox::pg_claim::PgStore;
use outboxd::store::{Db, migrate};

#[derive(Debug, Clone, clap::Args)]
pub struct RelayBenchArgs {
    /// A Postgres database the benchmark may empty and fill.
    #[arg(long)]
    pub url: String,
    #[arg(long, default_value_t = 100_000)]
    pub events: i64,
    #[arg(long, default_value_t = 2_000)]
    pub aggregates: i64,
    #[arg(long, value_delimiter = ',', default_value = "50,100,500")]
    pub batch: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub workers: Vec<usize>,
    /// Where messages go, one or several comma-separated (each grid point
    /// runs on each, interleaved, in one run): `null` (acknowledged in
    /// memory, the relay's own cost), `embedded` (the durable SQL transport
    /// in the same database), `kafka` (the idempotent `acks=all` producer,
    /// to `--brokers`), `nats` (JetStream, each PubAck awaited, to `--nats`),
    /// `rabbitmq` (publisher confirms on quorum queues, to `--rabbitmq`) or
    /// `redis` (each XADD's reply awaited, to `--redis`).
    #[arg(long, value_delimiter = ',', default_value = "null")]
    pub sink: Vec<String>,
    #[command(flatten)]
    pub broker: super::brokers::BrokerArgs,
    /// A transformer component (e.g. plugins/dist/cloudevents.wasm): every
    /// grid point then runs twice, without and with it as the route's
    /// chain, and the ratio is printed.
    #[arg(long)]
    pub plugin: Option<std::path::PathBuf>,
    /// Relay pipelining (`relay.pipeline`) for each grid point: `false`,
    /// `true`, or both (`false,true`).
    #[arg(long, value_delimiter = ',', default_value = "true")]
    pub pipeline: Vec<bool>,
    /// Runs of each grid point, the variants interleaved; the best run of
    /// each is kept (shared, noisy machines).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Events for the poll-and-mark baseline run (it is slow; default =
    /// --events / 10).
    #[arg(long)]
    pub seed_events: Option<i64>,
    /// Write the results as JSON here too.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// Topic of every benchmark event (one route, `bench.*`).
const TOPIC: &str = "outboxd.bench";

async fn reset_and_fill(pool: &PgPool, events: i64, aggregates: i64) -> Result<(), BenchError> {
    sqlx::query("TRUNCATE outbox, transport_messages, transport_cursors")
        .execute(pool)
        .await?;
    // Row g belongs to aggregate g % A and is its (g / A + 1)-th event; seq
    // follows g, so per-aggregate order is n = 1, 2, 3 …
    sqlx::query(
        "INSERT INTO outbox (aggregate_id, event_type, payload)
         SELECT 'agg-' || (g % $2), 'bench.event', jsonb_build_object('n', g / $2 + 1, 'pad', repeat('x', 200))
           FROM generate_series(0, $1 - 1) g ORDER BY g",
    )
    .bind(events)
    .bind(aggregates)
    .execute(pool)
    .await?;
    sqlx::query("ANALYZE outbox").execute(pool).await?;
    Ok(())
}

async fn run_ours<P: Publisher>(
    pool: &PgPool,
    sink: Arc<Verifying<P>>,
    chains: &Chains,
    events: i64,
    batch: usize,
    workers: usize,
    pipeline: bool,
) -> Result<f64, BenchError> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut set = tokio::task::JoinSet::new();
    let started = Instant::now();
    for _ in 0..workers {
        let relay = Relay::new(
            PgStore::new(pool.clone()),
            sink.clone(),
            router(),
            RelayConfig {
                batch_size: batch,
                ..RelayConfig::default()
            },
            Arc::new(SystemClock),
        )
        .with_chains(chains.clone());
        let stop = stop_rx.clone();
        set.spawn(async move {
            let cfg = WorkerConfig {
                poll_interval: Duration::from_millis(1),
                pipeline,
                ..WorkerConfig::default()
            };
            worker::run(&relay, &cfg, None, stop)
                .await
                .map_err(|e| e.to_string())
        });
    }
    while (sink.count.load(Ordering::Relaxed) as i64) < events {
        tokio::time::sleep(Duration::from_millis(2)).await;
        if started.elapsed() > Duration::from_secs(900) {
            break;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    while set.join_next().await.is_some() {}
    Ok(seconds)
}

/// The baseline: the simplest correct relay, a poll-and-mark loop with a
/// batch of 50, one send awaited at a time, one UPDATE per row, all in the
/// claim transaction.
async fn run_baseline<P: Publisher>(
    pool: &PgPool,
    sink: &Verifying<P>,
    router: &Relay<PgStore, Arc<Verifying<P>>>,
) -> Result<f64, BenchError> {
    let started = Instant::now();
    loop {
        let mut tx = pool.begin().await?;
        let rows = sqlx::query(
            "SELECT o.seq FROM outbox o
              WHERE o.published_at IS NULL AND o.next_attempt_at <= now()
                AND NOT EXISTS (SELECT 1 FROM outbox a WHERE a.aggregate_id = o.aggregate_id
                                  AND a.published_at IS NULL AND a.seq < o.seq)
              ORDER BY o.seq LIMIT 50 FOR UPDATE OF o SKIP LOCKED",
        )
        .fetch_all(&mut *tx)
        .await?;
        if rows.is_empty() {
            tx.commit().await?;
            break;
        }
        for r in rows {
            let seq: i64 = r.get(0);
            let ev = sqlx::query("SELECT aggregate_id, event_type, payload::text, id, created_at FROM outbox WHERE seq = $1")
                .bind(seq)
                .fetch_one(&mut *tx)
                .await?;
            let event = outboxd::event::OutboxEvent {
                seq,
                id: outboxd::event::EventId(ev.get(3)),
                aggregate_id: ev.get(0),
                event_type: ev.get(1),
                payload: ev.get(2),
                headers: Default::default(),
                created_at: ev.get(4),
                attempts: 0,
                redrive_with: None,
            };
            if sink.publish(router.message_for(&event)).await.is_ok() {
                sqlx::query("UPDATE outbox SET published_at = now() WHERE seq = $1")
                    .bind(seq)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
    }
    Ok(started.elapsed().as_secs_f64())
}

pub async fn relay(args: &RelayBenchArgs) -> Result<Vec<RelayBenchRow>, BenchError> {
    let db = Db::connect(&args.url, 16).await?;
    let Db::Postgres(pool) = &db else {
        return Err(BenchError::Refused(
            "the relay benchmark needs a postgres:// URL".into(),
        ));
    };
    migrate(&db).await?;
    // A sink emptied before each run (NATS and RabbitMQ: the stream or the
    // queues are created again), so no run reads another's backlog.
    let sink = async |name: &str| -> Result<Sink, BenchError> {
        Ok(match name {
            "null" => Sink::Null,
            other => Sink::Broker(Box::new(
                args.broker.fresh_publisher(other, &db, TOPIC, 8).await?,
            )),
        })
    };
    let Some(first) = args.sink.first() else {
        return Err(BenchError::Refused("--sink names no sink".into()));
    };
    let mut variants = vec![("none".to_string(), Chains::default())];
    if let Some(path) = &args.plugin {
        let engine = PluginEngine::new(EngineConfig::default())
            .map_err(|e| BenchError::Refused(format!("--plugin: {e}")))?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "plugin".into());
        let chains = build_chains(
            &engine,
            &[PluginSpec::new(name.clone(), path.clone())],
            &[Route::new("bench.*", TOPIC).with_transformers(&[name.as_str()])],
        )
        .map_err(|e| BenchError::Refused(format!("--plugin {}: {e}", path.display())))?;
        variants.push((name, chains));
    }
    let mut rows = Vec::new();
    let baseline_events = args.seed_events.unwrap_or((args.events / 10).max(1));
    reset_and_fill(pool, baseline_events, args.aggregates.min(baseline_events)).await?;
    let baseline_sink = Arc::new(Verifying::new(Some(sink(first).await?)));
    let router = Relay::new(
        PgStore::new(pool.clone()),
        baseline_sink.clone(),
        router(),
        RelayConfig::default(),
        Arc::new(SystemClock),
    );
    let seconds = run_baseline(pool, &baseline_sink, &router).await?;
    check(&baseline_sink, baseline_events)?;
    rows.push(row(
        "baseline",
        first,
        "none",
        Cell {
            batch: 50,
            workers: 1,
            pipeline: false,
        },
        baseline_events,
        seconds,
    ));
    print_row(rows.last());
    for &batch in &args.batch {
        for &workers in &args.workers {
            for pipeline in args.pipeline.iter().copied() {
                // The best of each (sink, variant), the runs interleaved.
                let mut best: Vec<Vec<Option<f64>>> =
                    vec![vec![None; variants.len()]; args.sink.len()];
                for _ in 0..args.repeat.max(1) {
                    for (si, name) in args.sink.iter().enumerate() {
                        for (vi, (_, chains)) in variants.iter().enumerate() {
                            reset_and_fill(pool, args.events, args.aggregates).await?;
                            let verifying = Arc::new(Verifying::new(Some(sink(name).await?)));
                            let seconds = run_ours(
                                pool,
                                verifying.clone(),
                                chains,
                                args.events,
                                batch,
                                workers,
                                pipeline,
                            )
                            .await?;
                            check(&verifying, args.events)?;
                            best[si][vi] =
                                Some(best[si][vi].map_or(seconds, |b: f64| b.min(seconds)));
                        }
                    }
                }
                for (name, best) in args.sink.iter().zip(best) {
                    for ((transformer, _), seconds) in variants.iter().zip(best) {
                        rows.push(row(
                            "outboxd",
                            name,
                            transformer,
                            Cell {
                                batch,
                                workers,
                                pipeline,
                            },
                            args.events,
                            seconds.unwrap_or(f64::NAN),
                        ));
                        print_row(rows.last());
                    }
                }
            }
        }
    }
    print_ratios(&rows);
    super::relay_report::print_sink_ratios(&rows);
    if let Some(path) = &args.json {
        super::write_json(path, &rows)?;
    }
    Ok(rows)
}

/// One route for every benchmark event; a plugin variant's chain hangs
/// off route 0 ([`build_chains`] with the same route).
fn router() -> Router {
    Router::new(vec![Route::new("bench.*", TOPIC)])
}
