//! `outboxd-bench wal` throughput: how fast each relay source drains a
//! backlog, plugin-free and with a transformer on the route, the cells
//! interleaved run after run.
//!
//! The backlog must reach the WAL relay through its slot, so it is written
//! while the relay runs but is frozen: the benchmark starts `outboxd run`,
//! waits until it has published a probe event (the WAL reader is streaming
//! by then), stops it with SIGSTOP, writes the backlog in transactions of
//! `--insert-batch` events, and lets it go on with SIGCONT. The polling
//! relay gets the same treatment. The rate is the backlog over the time
//! from SIGCONT to the last `published_at`, both on the database's clock.
//! With `--verify`, every message is read back from Kafka and checked:
//! each event exactly once, in per-aggregate order.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{Bench, Mode, RelaySetup, median, run_order};
use crate::BenchError;
use crate::relay_sink::counter;
use outboxd::broker::MessageSource;
use outboxd::broker::kafka::{KafkaConsumer, KafkaConsumerConfig};

#[derive(Debug, Clone, Serialize)]
pub struct ThroughputRun {
    pub run: usize,
    pub mode: Mode,
    /// `none` or the transformer's file name.
    pub transformer: String,
    pub events: i64,
    pub seconds: f64,
    pub events_per_second: f64,
}

pub(crate) async fn run(bench: &Bench) -> Result<Vec<ThroughputRun>, BenchError> {
    let a = &bench.args;
    let mut variants: Vec<(String, Option<std::path::PathBuf>)> = vec![("none".into(), None)];
    if let Some(p) = &a.plugin {
        if !p.is_file() {
            return Err(BenchError::Refused(format!(
                "--plugin {}: no such file (bash plugins/build.sh builds plugins/dist)",
                p.display()
            )));
        }
        let name = p
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "plugin".into());
        // The child resolves the path from its own directory.
        let abs = std::fs::canonicalize(p)
            .map_err(|e| BenchError::Refused(format!("--plugin {}: {e}", p.display())))?;
        variants.push((name, Some(abs)));
    }
    println!(
        "relay throughput draining a backlog of {} events over {} aggregates (written in transactions of {} while the relay is frozen), Postgres, Kafka at {}; polling: {} workers, batch 100; wal: one reader, relay.workers batches in flight{}",
        a.backlog,
        a.aggregates,
        a.insert_batch,
        bench.brokers(),
        a.poll_workers,
        if a.verify {
            "; every message read back and checked (exactly once, in order)"
        } else {
            ""
        }
    );
    println!("| run | mode | transformer | events | seconds | events/s |");
    println!("|---:|---|---|---:|---:|---:|");
    let nonce = std::process::id();
    let mut runs = Vec::new();
    for r in 0..a.runs.max(1) {
        for mode in run_order(&bench.modes, r) {
            for (vi, (transformer, plugin)) in variants.iter().enumerate() {
                let topic = format!("outboxd.walbench.tp.{nonce}.{r}.{}.{vi}", mode.name());
                let setup = RelaySetup {
                    topic,
                    plugin: plugin.clone(),
                    kafka: true,
                };
                let row = run_one(bench, mode, r + 1, transformer, &setup).await?;
                println!(
                    "| {} | {} | {} | {} | {:.2} | {:.0} |",
                    row.run,
                    row.mode.name(),
                    row.transformer,
                    row.events,
                    row.seconds,
                    row.events_per_second
                );
                runs.push(row);
            }
        }
    }
    summarize(&runs, &bench.modes, &variants);
    Ok(runs)
}

fn summarize(
    runs: &[ThroughputRun],
    modes: &[Mode],
    variants: &[(String, Option<std::path::PathBuf>)],
) {
    let med = |mode: Mode, t: &str| {
        median(
            runs.iter()
                .filter(|r| r.mode == mode && r.transformer == t)
                .map(|r| r.events_per_second)
                .collect(),
        )
    };
    for mode in modes {
        for (t, _) in variants {
            let all: Vec<String> = runs
                .iter()
                .filter(|r| r.mode == *mode && r.transformer == *t)
                .map(|r| format!("{:.0}", r.events_per_second))
                .collect();
            println!(
                "{:<4} {:<12}: median {:.0} events/s over [{}]",
                mode.name(),
                t,
                med(*mode, t),
                all.join(", ")
            );
        }
    }
    if modes.contains(&Mode::Wal) && modes.contains(&Mode::Poll) {
        println!(
            "wal / poll, plugin-free: {:.1} % (medians)",
            100.0 * med(Mode::Wal, "none") / med(Mode::Poll, "none")
        );
    }
    for (t, _) in variants.iter().skip(1) {
        for mode in modes {
            println!(
                "{:<4} with {t}: {:.1} % of its plugin-free throughput (medians)",
                mode.name(),
                100.0 * med(*mode, t) / med(*mode, "none")
            );
        }
    }
}

async fn run_one(
    bench: &Bench,
    mode: Mode,
    run: usize,
    transformer: &str,
    setup: &RelaySetup,
) -> Result<ThroughputRun, BenchError> {
    let a = &bench.args;
    bench.reset().await?;
    let mut relay = bench.start_relay(mode, setup).await?;
    let drained = async {
        relay.pause()?;
        fill(bench, a.backlog, a.aggregates, a.insert_batch).await?;
        let t0: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&bench.pool)
            .await?;
        relay.resume()?;
        let started = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            relay.check_alive()?;
            let pending: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM outbox WHERE published_at IS NULL)",
            )
            .fetch_one(&bench.pool)
            .await?;
            if !pending {
                break;
            }
            if started.elapsed() > Duration::from_secs(600) {
                return Err(BenchError::Incorrect(format!(
                    "{} run {run}: the backlog was not drained within 600 s: {}",
                    mode.name(),
                    relay.log_tail()
                )));
            }
        }
        let seconds: f64 = sqlx::query_scalar(
            "SELECT extract(epoch FROM max(published_at) - $1)::float8 FROM outbox WHERE event_type = 'walbench.event'",
        )
        .bind(t0)
        .fetch_one(&bench.pool)
        .await?;
        Ok(seconds)
    }
    .await;
    relay.stop().await;
    let seconds = drained?;
    if a.verify {
        read_back(bench, &setup.topic, a.backlog)
            .await
            .map_err(|e| match e {
                BenchError::Incorrect(m) => {
                    BenchError::Incorrect(format!("{} run {run}, {transformer}: {m}", mode.name()))
                }
                other => other,
            })?;
    }
    Ok(ThroughputRun {
        run,
        mode,
        transformer: transformer.into(),
        events: a.backlog,
        seconds,
        events_per_second: a.backlog as f64 / seconds.max(1e-9),
    })
}

/// Writes `events` events over `aggregates` aggregates, `batch` per
/// transaction. Event g belongs to aggregate g % A and is its (g / A + 1)th
/// event, so each aggregate's payload counter runs 1, 2, 3 … in commit
/// order.
async fn fill(bench: &Bench, events: i64, aggregates: i64, batch: i64) -> Result<(), BenchError> {
    let batch = batch.max(1);
    let mut from = 0;
    while from < events {
        let to = (from + batch).min(events);
        sqlx::query(
            "INSERT INTO outbox (aggregate_id, event_type, payload)
             SELECT 'agg-' || (g % $3), 'walbench.event', jsonb_build_object('n', g / $3 + 1, 'pad', repeat('x', 200))
               FROM generate_series($1::bigint, $2::bigint - 1) g ORDER BY g",
        )
        .bind(from)
        .bind(to)
        .bind(aggregates)
        .execute(&bench.pool)
        .await?;
        from = to;
    }
    Ok(())
}

/// Reads `topic` from the start and checks that each aggregate's counter
/// arrives as 1, 2, 3 … exactly once, `events` messages in all.
async fn read_back(bench: &Bench, topic: &str, events: i64) -> Result<(), BenchError> {
    let group = format!("walbench-verify-{}", uuid::Uuid::new_v4());
    let mut cfg = KafkaConsumerConfig::new(group, vec![topic.to_string()]);
    // The read-back's per-partition buffer; above the backlog, it never
    // pauses a partition, so it never fetches from the middle of a stored
    // batch, which tansu's memory storage answers by skipping the batch
    // (see BENCHMARKS.md).
    if let Ok(v) = std::env::var("OUTBOXD_BENCH_PARTITION_LIMIT") {
        cfg.partition_limit = v.parse().map_err(|_| {
            BenchError::Refused(format!(
                "OUTBOXD_BENCH_PARTITION_LIMIT={v}: write a whole number of messages, such as 1000000"
            ))
        })?;
    }
    let mut consumer = KafkaConsumer::new(&bench.kafka_props(), cfg)
        .map_err(|e| BenchError::Refused(format!("reading {topic} back: {e}")))?;
    let mut last: HashMap<Vec<u8>, i64> = HashMap::new();
    let mut offsets: HashMap<i32, i64> = HashMap::new();
    let mut got = 0i64;
    let mut first_error = None;
    let started = Instant::now();
    let mut quiet_since: Option<Instant> = None;
    loop {
        let batch = consumer
            .fetch(1000)
            .await
            .map_err(|e| BenchError::Refused(format!("reading {topic} back: {e}")))?;
        // A fetch mixes partitions; each one's last message is committed,
        // or the source would serve the rest again.
        let mut ends: HashMap<i32, &outboxd::message::Delivery> = HashMap::new();
        for d in &batch {
            ends.insert(d.partition, d);
        }
        for d in ends.values() {
            consumer
                .commit(d)
                .await
                .map_err(|e| BenchError::Refused(format!("reading {topic} back: {e}")))?;
        }
        if !batch.is_empty() {
            quiet_since = None;
        } else if got >= events {
            // Everything is there; a short quiet spell shows no duplicate
            // follows.
            let q = *quiet_since.get_or_insert_with(Instant::now);
            if q.elapsed() > Duration::from_secs(1) {
                break;
            }
        }
        for d in &batch {
            got += 1;
            let key = d.key.clone().unwrap_or_default();
            let n = counter(&d.payload).unwrap_or(-1);
            let prev = last.entry(key.clone()).or_insert(0);
            let prev_offset = offsets.insert(d.partition, d.offset);
            if n != *prev + 1 && first_error.is_none() {
                first_error = Some(format!(
                    "{}: got n={n} after n={prev} (partition {} offset {}, the partition's previous offset {prev_offset:?})",
                    String::from_utf8_lossy(&key),
                    d.partition,
                    d.offset
                ));
            }
            *prev = n;
        }
        if started.elapsed() > Duration::from_secs(180) {
            break;
        }
    }
    if let Some(e) = first_error {
        return Err(BenchError::Incorrect(format!("order or duplicate: {e}")));
    }
    if got != events {
        return Err(BenchError::Incorrect(format!(
            "read {got} messages back from {topic} for {events} events"
        )));
    }
    Ok(())
}
