//! `outboxd bench latency`: end-to-end latency, from the producing commit to
//! the consumer's committed effect, at fixed arrival rates, with the relay
//! woken by LISTEN/NOTIFY and with polling only.
//!
//! The pipeline is the production one on Postgres: producers commit events
//! with [`enqueue`], two relay workers publish them to the embedded
//! transport, and a consumer runs each message through the inbox with a
//! handler that writes one effect row. Latency is the consumer's commit time
//! minus the event's `created_at`, which Postgres sets at the start of the
//! producing transaction (a single insert here, so well under a millisecond
//! before its commit).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::BenchError;
use crate::broker::Delivery;
use crate::broker::embedded::{EmbeddedConsumer, EmbeddedConsumerConfig, EmbeddedPublisher};
use crate::clock::SystemClock;
use crate::consumer::inbox::{Handler, HandlerError, InboxTx};
use crate::consumer::runner::percentile;
use crate::consumer::{Consumer, ConsumerConfig};
use crate::event::NewEvent;
use crate::relay::worker::{self, WorkerConfig};
use crate::relay::{Relay, RelayConfig, Route, Router};
use crate::store::postgres::{PgStore, listen_for_events};
use crate::store::{Db, enqueue, migrate};

#[derive(Debug, Clone, clap::Args)]
pub struct LatencyBenchArgs {
    /// A Postgres database the benchmark may empty and fill.
    #[arg(long)]
    pub url: String,
    /// Arrival rates, events/s.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,5000")]
    pub rates: Vec<u64>,
    /// How long events arrive at each rate.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// `notify` (LISTEN/NOTIFY wakes the relay, polling as a fallback) and/or
    /// `poll` (the relay only polls).
    #[arg(long, value_delimiter = ',', default_value = "notify,poll")]
    pub modes: Vec<String>,
    /// The relay's poll interval (`relay.poll_interval_ms`).
    #[arg(long, default_value_t = 500)]
    pub poll_ms: u64,
    /// The consumer's poll interval on the embedded transport.
    #[arg(long, default_value_t = 5)]
    pub consumer_poll_ms: u64,
    /// Messages per consumer transaction (`consumers[].batch_in_transaction`).
    #[arg(long, default_value_t = 20)]
    pub consumer_batch: usize,
    /// Write the results as JSON here too.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LatencyRow {
    pub mode: String,
    pub rate: u64,
    pub events: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

const TOPIC: &str = "outboxd.latency";

/// The consumer's effect: one row per message, in the inbox transaction.
struct Effect;

impl Handler for Effect {
    async fn handle(&self, tx: &mut InboxTx, d: &Delivery) -> Result<(), HandlerError> {
        let id = d.message_id().map_err(HandlerError::Permanent)?.to_string();
        if let InboxTx::Postgres(t) = tx {
            sqlx::query("INSERT INTO bench_effects (message_id) VALUES ($1)")
                .bind(id)
                .execute(&mut **t)
                .await?;
        }
        Ok(())
    }
}

/// Enqueues `rate` events/s for `seconds`, in 10 ms ticks; each event is its
/// own transaction, spread over a few connections so 5,000/s is reachable.
async fn produce(db: &Db, rate: u64, seconds: u64, produced: Arc<AtomicU64>) {
    let Db::Postgres(pool) = db else { return };
    let tick = Duration::from_millis(10);
    let ticks = seconds * 100;
    let per_tick = rate as f64 / 100.0;
    let mut owed = 0.0;
    let mut next: u64 = 0;
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for t in 0..ticks {
        interval.tick().await;
        owed += per_tick;
        let n = owed.floor() as u64;
        owed -= n as f64;
        let mut set = tokio::task::JoinSet::new();
        for i in 0..n {
            let seq = next;
            next += 1;
            let pool = pool.clone();
            let produced = produced.clone();
            set.spawn(async move {
                let mut tx = pool.begin().await?;
                // 500 aggregates, in turn: consecutive events never share one.
                let ev = NewEvent::new(
                    format!("agg-{}", seq % 500),
                    "latency.event",
                    serde_json::json!({ "t": t, "i": i }),
                );
                enqueue(&mut tx, ev)
                    .await
                    .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
                tx.commit().await?;
                produced.fetch_add(1, Ordering::Relaxed);
                Ok::<(), sqlx::Error>(())
            });
        }
        while let Some(r) = set.join_next().await {
            if let Ok(Err(e)) = r {
                tracing::warn!(error = %e, "latency bench: an enqueue failed");
            }
        }
    }
}

async fn reset(db: &Db) -> Result<(), BenchError> {
    let Db::Postgres(pool) = db else {
        return Ok(());
    };
    sqlx::query("CREATE TABLE IF NOT EXISTS bench_effects (message_id text PRIMARY KEY)")
        .execute(pool)
        .await?;
    sqlx::query("TRUNCATE outbox, transport_messages, transport_cursors, inbox, bench_effects")
        .execute(pool)
        .await?;
    Ok(())
}

async fn run_one(
    args: &LatencyBenchArgs,
    db: &Db,
    mode: &str,
    rate: u64,
) -> Result<LatencyRow, BenchError> {
    let Db::Postgres(pool) = db else {
        unreachable!("checked by the caller")
    };
    reset(db).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let router = Router::new(vec![Route::new("latency.*", TOPIC)]);
    for _ in 0..2 {
        let relay = Relay::new(
            PgStore::new(pool.clone()),
            EmbeddedPublisher::new(db.clone(), 4),
            router.clone(),
            RelayConfig::default(),
            Arc::new(SystemClock),
        );
        let wake = match mode {
            "notify" => Some(listen_for_events(pool).await?),
            _ => None,
        };
        let cfg = WorkerConfig {
            poll_interval: Duration::from_millis(args.poll_ms),
            pipeline: true,
            ..WorkerConfig::default()
        };
        let stop = stop_rx.clone();
        tasks.spawn(async move {
            if let Err(e) = worker::run(&relay, &cfg, wake, stop).await {
                tracing::error!(error = %e, "latency bench relay stopped");
            }
        });
    }
    let source = EmbeddedConsumer::new(
        db.clone(),
        EmbeddedConsumerConfig {
            group: "latency".into(),
            topics: vec![TOPIC.into()],
            partitions: 4,
            lease: Duration::from_secs(30),
        },
    );
    let mut consumer = Consumer::new(
        db.clone(),
        source,
        Arc::new(Effect),
        ConsumerConfig {
            name: "latency".into(),
            poll_interval: Duration::from_millis(args.consumer_poll_ms),
            batch_in_transaction: args.consumer_batch,
            ..ConsumerConfig::default()
        },
    );
    let stats = consumer.stats();
    let stop = stop_rx.clone();
    tasks.spawn(async move {
        if let Err(e) = consumer.run(stop).await {
            tracing::error!(error = %e, "latency bench consumer stopped");
        }
    });
    let produced = Arc::new(AtomicU64::new(0));
    produce(db, rate, args.seconds, produced.clone()).await;
    let total = produced.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(120);
    while stats.handled.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    let handled = stats.handled.load(Ordering::Relaxed);
    if handled != total {
        return Err(BenchError::Incorrect(format!(
            "{mode} at {rate}/s: produced {total} events, the consumer handled {handled}"
        )));
    }
    let lat = stats.sorted_latencies_ms();
    Ok(LatencyRow {
        mode: mode.into(),
        rate,
        events: total,
        p50_ms: percentile(&lat, 0.50),
        p99_ms: percentile(&lat, 0.99),
        max_ms: lat.last().copied().unwrap_or(f64::NAN),
    })
}

pub async fn latency(args: &LatencyBenchArgs) -> Result<Vec<LatencyRow>, BenchError> {
    let db = Db::connect(&args.url, 24).await?;
    if !matches!(db, Db::Postgres(_)) {
        return Err(BenchError::Refused(
            "the latency benchmark needs a postgres:// URL".into(),
        ));
    }
    migrate(&db).await?;
    for m in &args.modes {
        if m != "notify" && m != "poll" {
            return Err(BenchError::Refused(format!(
                "unknown --modes value `{m}`; use notify and/or poll"
            )));
        }
    }
    println!(
        "end-to-end latency, commit -> consumer effect committed (Postgres, embedded transport, relay poll {} ms, consumer poll {} ms, consumer batch {})",
        args.poll_ms, args.consumer_poll_ms, args.consumer_batch
    );
    println!("| mode   | rate/s | events | p50 ms | p99 ms | max ms |");
    let mut rows = Vec::new();
    for mode in &args.modes {
        for &rate in &args.rates {
            let r = run_one(args, &db, mode, rate).await?;
            println!(
                "| {:<6} | {:>6} | {:>6} | {:>6.1} | {:>6.1} | {:>6.1} |",
                r.mode, r.rate, r.events, r.p50_ms, r.p99_ms, r.max_ms
            );
            rows.push(r);
        }
    }
    if let Some(path) = &args.json {
        super::write_json(path, &rows)?;
    }
    Ok(rows)
}
