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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use super::BenchError;
use super::pipeline::{self, PARTITIONS, Pipeline, PipelineConfig};
use outboxd::broker::embedded::EmbeddedPublisher;
use outboxd::relay::RelayConfig;
use outboxd::store::{Db, migrate};
use outboxd_demo::latency::percentile;

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
    /// The relay's poll interval (`relay.poll_interval`).
    #[arg(long, default_value_t = 500)]
    pub poll_ms: u64,
    /// The consumer's poll interval on the embedded transport.
    #[arg(long, default_value_t = 5)]
    pub consumer_poll_ms: u64,
    /// Messages per consumer transaction (`consumers[].batch_in_transaction`).
    #[arg(long, default_value_t = 20)]
    pub consumer_batch: usize,
    /// Where the relay publishes and the consumer reads, one or several
    /// comma-separated: `embedded`, `kafka`, `nats`, `rabbitmq`, `redis`.
    #[arg(long, value_delimiter = ',', default_value = "embedded")]
    pub transports: Vec<String>,
    #[command(flatten)]
    pub broker: super::brokers::BrokerArgs,
    /// Write the results as JSON here too.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LatencyRow {
    pub transport: String,
    pub mode: String,
    pub rate: u64,
    pub events: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The relay's share: commit to the outbox row marked published (the
    /// rest is the transport and the consumer).
    pub relay_p50_ms: f64,
    pub relay_p99_ms: f64,
}

async fn run_one(
    args: &LatencyBenchArgs,
    db: &Db,
    transport: &str,
    mode: &str,
    rate: u64,
) -> Result<LatencyRow, BenchError> {
    let Db::Postgres(pool) = db else {
        unreachable!("checked by the caller")
    };
    pipeline::reset(pool).await?;
    let cfg = PipelineConfig {
        // Kafka topics cannot be emptied: a topic (and event type) of its
        // own per run there, so a run never reads an earlier one's events.
        name: if transport == "kafka" {
            Box::leak(format!("latency{}", uuid::Uuid::new_v4().simple()).into_boxed_str())
        } else {
            "latency"
        },
        notify: mode == "notify",
        relay_poll: Duration::from_millis(args.poll_ms),
        relay: RelayConfig::default(),
        consumer_poll: Duration::from_millis(args.consumer_poll_ms),
        consumer_batch: args.consumer_batch,
    };
    let pipe = if transport == "embedded" {
        let publisher = Arc::new(EmbeddedPublisher::new(db.clone(), PARTITIONS));
        Pipeline::start(db, &cfg, publisher).await?
    } else {
        // A group of its own per run (Kafka keeps its offsets); NATS and
        // RabbitMQ start from an emptied topic.
        let topic = Pipeline::topic(&cfg);
        let publisher = Arc::new(
            args.broker
                .fresh_publisher(transport, db, &topic, PARTITIONS)
                .await?,
        );
        let group = format!("latency-{}", uuid::Uuid::new_v4().simple());
        let prefetch = u16::try_from(cfg.consumer_batch.max(1)).unwrap_or(u16::MAX);
        let source = args
            .broker
            .source(transport, db, &group, &topic, PARTITIONS, prefetch)
            .await?;
        Pipeline::start_with(db, &cfg, publisher, Some(source)).await?
    };
    let produced = Arc::new(AtomicU64::new(0));
    pipeline::produce(
        pool.clone(),
        cfg.event_type(),
        rate as f64,
        Duration::from_secs(args.seconds),
        true,
        Arc::new(AtomicBool::new(false)),
        produced.clone(),
    )
    .await;
    let total = produced.load(Ordering::Relaxed);
    pipe.wait_handled(total, Duration::from_secs(120)).await;
    let stats = pipe.stats.clone();
    let latencies = pipe.latencies.clone();
    pipe.stop().await;
    let handled = stats.handled.load(Ordering::Relaxed);
    if handled != total {
        return Err(BenchError::Incorrect(format!(
            "{transport} {mode} at {rate}/s: produced {total} events, the consumer handled {handled}"
        )));
    }
    let lat = latencies.sorted_ms();
    let (relay_p50_ms, relay_p99_ms): (f64, f64) = sqlx::query_as(
        "SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), 'NaN'::float8),
                coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), 'NaN'::float8)
           FROM (SELECT (extract(epoch FROM published_at - created_at) * 1000)::float8 AS ms
                   FROM outbox WHERE published_at IS NOT NULL) AS t",
    )
    .fetch_one(pool)
    .await?;
    Ok(LatencyRow {
        relay_p50_ms,
        relay_p99_ms,
        transport: transport.into(),
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
        "end-to-end latency, commit -> consumer effect committed (Postgres, relay poll {} ms, consumer poll {} ms, consumer batch {})",
        args.poll_ms, args.consumer_poll_ms, args.consumer_batch
    );
    println!(
        "| transport | mode   | rate/s | events | p50 ms | p99 ms | max ms | relay p50 ms | relay p99 ms |"
    );
    let mut rows = Vec::new();
    for mode in &args.modes {
        for &rate in &args.rates {
            for transport in &args.transports {
                let r = run_one(args, &db, transport, mode, rate).await?;
                println!(
                    "| {:<9} | {:<6} | {:>6} | {:>6} | {:>6.1} | {:>6.1} | {:>6.1} | {:>12.1} | {:>12.1} |",
                    r.transport,
                    r.mode,
                    r.rate,
                    r.events,
                    r.p50_ms,
                    r.p99_ms,
                    r.max_ms,
                    r.relay_p50_ms,
                    r.relay_p99_ms
                );
                rows.push(r);
            }
        }
    }
    if let Some(path) = &args.json {
        super::write_json(path, &rows)?;
    }
    Ok(rows)
}
