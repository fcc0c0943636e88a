//! `outboxd-bench wal` latency: commit to the consumer's committed effect at
//! a fixed arrival rate, through Kafka, with the relay reading the WAL and
//! with it polling, run after run in turn.
//!
//! Producers in this process commit one event per transaction at the rate;
//! an `outboxd run` process relays them to a fresh topic; a consumer in
//! this process (the daemon with no relay workers and a native handler)
//! reads its partitions without a group and writes one effect row per
//! message in its inbox transaction. Latency is that commit's time minus
//! the event's `created_at`; the relay's share is `published_at` minus
//! `created_at`, from the outbox rows.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{Bench, Mode, PARTITIONS, RelaySetup, median, run_order};
use crate::BenchError;
use crate::pipeline::produce;
use outboxd::config::Config;
use outboxd::consumer::inbox::Handler;
use outboxd::consumer::inbox::HandlerError;
use outboxd::daemon::Daemon;
use outboxd::fault::Faults;
use outboxd::message::Delivery;
use outboxd::store::InboxTx;
use outboxd_demo::latency::{LatencySamples, percentile};

const EVENT_TYPE: &str = "walbench.event";

#[derive(Debug, Clone, Serialize)]
pub struct LatencyRun {
    pub run: usize,
    pub mode: Mode,
    pub rate: u64,
    pub events: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub relay_p50_ms: f64,
    pub relay_p99_ms: f64,
}

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

pub(crate) async fn run(bench: &Bench) -> Result<Vec<LatencyRun>, BenchError> {
    let a = &bench.args;
    println!(
        "commit -> consumer effect latency, {} events/s for {} s, Postgres, Kafka at {} (relay: `outboxd run`, polling with {} workers and LISTEN/NOTIFY, or reading the WAL; consumer batch {})",
        a.rate,
        a.seconds,
        bench.brokers(),
        a.poll_workers,
        a.consumer_batch
    );
    println!("| run | mode | events | p50 ms | p99 ms | max ms | relay p50 ms | relay p99 ms |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    let mut runs = Vec::new();
    let nonce = std::process::id();
    for r in 0..a.runs.max(1) {
        for mode in run_order(&bench.modes, r) {
            let topic = format!("outboxd.walbench.lat.{nonce}.{r}.{}", mode.name());
            let row = run_one(bench, mode, r + 1, &topic).await?;
            println!(
                "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                row.run,
                row.mode.name(),
                row.events,
                row.p50_ms,
                row.p99_ms,
                row.max_ms,
                row.relay_p50_ms,
                row.relay_p99_ms
            );
            runs.push(row);
        }
    }
    for mode in &bench.modes {
        let mine: Vec<&LatencyRun> = runs.iter().filter(|r| r.mode == *mode).collect();
        let p99s: Vec<String> = mine.iter().map(|r| format!("{:.1}", r.p99_ms)).collect();
        println!(
            "{:<4}: p50 median {:.1} ms, p99 median {:.1} ms, p99 per run [{}], worst p99 {:.1} ms",
            mode.name(),
            median(mine.iter().map(|r| r.p50_ms).collect()),
            median(mine.iter().map(|r| r.p99_ms).collect()),
            p99s.join(", "),
            mine.iter().map(|r| r.p99_ms).fold(f64::NAN, f64::max)
        );
    }
    Ok(runs)
}

/// The consumer side of one run: `outboxd run`'s pipeline in this process,
/// with no relay workers.
fn consumer_config(bench: &Bench, name: &str, topic: &str) -> Result<Config, BenchError> {
    let mut kafka = String::new();
    for (k, v) in bench.kafka_props() {
        kafka.push_str(&format!("{k:?} = {v:?}\n"));
    }
    let parts: Vec<String> = (0..PARTITIONS).map(|p| p.to_string()).collect();
    let text = format!(
        r#"[database]
url = {url:?}
max_connections = 8
migrate_on_start = false

[transport]
kind = "kafka"

[transport.kafka]
{kafka}
[relay]
workers = 0

[[consumers]]
name = {name:?}
topics = [{topic:?}]
handler = "builtin:effect"
batch_in_transaction = {batch}
kafka_partitions = [{parts}]

[admin]
enabled = false

[retention]
interval_seconds = 86400
"#,
        url = bench.args.url,
        batch = bench.args.consumer_batch,
        parts = parts.join(", "),
    );
    Config::from_toml("(wal latency consumer)", &text, std::iter::empty())
        .map_err(|e| BenchError::Refused(format!("the consumer's config: {e}")))
}

async fn run_one(
    bench: &Bench,
    mode: Mode,
    run: usize,
    topic: &str,
) -> Result<LatencyRun, BenchError> {
    bench.reset().await?;
    let relay = bench
        .start_relay(
            mode,
            &RelaySetup {
                topic: topic.to_string(),
                plugin: None,
                kafka: true,
            },
        )
        .await?;
    let result = measure(bench, mode, run, topic).await;
    relay.stop().await;
    let mut row = result?;
    let (relay_p50_ms, relay_p99_ms): (f64, f64) = sqlx::query_as(
        "SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), 'NaN'::float8),
                coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), 'NaN'::float8)
           FROM (SELECT (extract(epoch FROM published_at - created_at) * 1000)::float8 AS ms
                   FROM outbox WHERE published_at IS NOT NULL AND event_type = $1
                    AND payload->>'warm' IS NULL) AS t",
    )
    .bind(EVENT_TYPE)
    .fetch_one(&bench.pool)
    .await?;
    row.relay_p50_ms = relay_p50_ms;
    row.relay_p99_ms = relay_p99_ms;
    Ok(row)
}

/// Starts the consumer, warms the path with a few events, then produces at
/// the rate and waits for every event's effect.
async fn measure(
    bench: &Bench,
    mode: Mode,
    run: usize,
    topic: &str,
) -> Result<LatencyRun, BenchError> {
    let a = &bench.args;
    let name = format!("walbench_{}_{run}_{}", mode.name(), std::process::id());
    let config = consumer_config(bench, &name, topic)?;
    let samples = Arc::new(LatencySamples::default());
    let measuring = Arc::new(AtomicBool::new(false));
    let handled = Arc::new(AtomicU64::new(0));
    let hook = {
        let (samples, measuring, handled) = (samples.clone(), measuring.clone(), handled.clone());
        Arc::new(move |d: &Delivery| {
            handled.fetch_add(1, Ordering::Relaxed);
            if measuring.load(Ordering::Relaxed) {
                samples.record(d);
            }
        })
    };
    let daemon = Daemon::builder()
        .handler("effect", Effect)
        .on_handled(hook)
        .build();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (set, _handles) = daemon
        .spawn_pipeline(&config, &bench.db, Faults::default(), stop_rx)
        .await
        .map_err(|e| BenchError::Refused(format!("the consumer: {e}")))?;
    let outcome = async {
        // Warm-up: a few events through relay, broker and consumer, not
        // measured (the first fetch, the first produce, the first plans).
        let warm = 20u64;
        for i in 0..warm {
            sqlx::query(
                "INSERT INTO outbox (aggregate_id, event_type, payload) VALUES ($1, $2, jsonb_build_object('warm', $3::int))",
            )
            .bind(format!("warm-{i}"))
            .bind(EVENT_TYPE)
            .bind(i as i32)
            .execute(&bench.pool)
            .await?;
        }
        wait_handled(&handled, warm, Duration::from_secs(60)).await.then_some(()).ok_or_else(|| {
            BenchError::Refused(format!(
                "{} run {run}: the warm-up events did not reach the consumer within 60 s (is Kafka at {} up?)",
                mode.name(),
                bench.brokers()
            ))
        })?;
        measuring.store(true, Ordering::Relaxed);
        let produced = Arc::new(AtomicU64::new(0));
        produce(
            bench.pool.clone(),
            EVENT_TYPE.to_string(),
            a.rate as f64,
            Duration::from_secs(a.seconds),
            true,
            Arc::new(AtomicBool::new(false)),
            produced.clone(),
        )
        .await;
        let total = produced.load(Ordering::Relaxed);
        wait_handled(&handled, warm + total, Duration::from_secs(120)).await;
        let got = handled.load(Ordering::Relaxed) - warm;
        if got != total {
            return Err(BenchError::Incorrect(format!(
                "{} run {run}: produced {total} events, the consumer handled {got}",
                mode.name()
            )));
        }
        let lat = samples.sorted_ms();
        Ok(LatencyRun {
            run,
            mode,
            rate: a.rate,
            events: total,
            p50_ms: percentile(&lat, 0.50),
            p99_ms: percentile(&lat, 0.99),
            max_ms: lat.last().copied().unwrap_or(f64::NAN),
            relay_p50_ms: f64::NAN,
            relay_p99_ms: f64::NAN,
        })
    }
    .await;
    let _ = stop_tx.send(true);
    let _ = outboxd::daemon::join_all_workers(set).await;
    outcome
}

async fn wait_handled(handled: &AtomicU64, total: u64, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while handled.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handled.load(Ordering::Relaxed) >= total
}
