//! `outboxd bench drain`: the backlog arithmetic of a broker outage,
//! measured at reduced scale. For example, arrivals of 400/s against a
//! consumer capacity of 500/s
//! and a ten-minute outage leave backlog = rate × T = 240,000 events, which
//! drain in backlog / (capacity − rate) = 2,400 s.
//!
//! Phases, on one running pipeline ([`super::pipeline`], Postgres and the
//! embedded transport):
//! 0. capacity: a prefilled outbox drained through relay and consumer, once
//!    alone and once while producers add `--load` × the first rate; the
//!    second consumed rate (the cores are shared with the producers, as in
//!    a drain) is the capacity;
//! 1. steady: producers paced at `--load` × capacity, for the warm-up; the
//!    highest backlog seen is the steady-state level;
//! 2. outage: for `--outage-seconds` every publish fails as retryable (the
//!    broker is unavailable); arrivals go on;
//! 3. recovery: publishes succeed again; the drain ends when the backlog is
//!    back at the steady-state level.
//!
//! Backlog = events committed by producers and not yet handled by the
//! consumer = outbox pending + transport lag (messages published, not yet
//! handled).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::BenchError;
use super::drain_report::{DrainReport, print};
use super::outage::{OutagePublisher, SAMPLE_EVERY, Samples, TableSample};
use super::pipeline::{self, AGGREGATES, PARTITIONS, Pipeline, PipelineConfig};
use outboxd::backoff::Backoff;
use outboxd::broker::embedded::EmbeddedPublisher;
use outboxd::relay::RelayConfig;
use outboxd::store::{Db, migrate};

#[derive(Debug, Clone, clap::Args)]
pub struct DrainBenchArgs {
    /// A Postgres database the benchmark may empty and fill.
    #[arg(long)]
    pub url: String,
    /// Events prefilled to measure the pipeline's capacity (phase 0).
    #[arg(long, default_value_t = 20_000)]
    pub capacity_events: i64,
    /// Skip phase 0 and take this capacity, events/s.
    #[arg(long)]
    pub capacity: Option<f64>,
    /// Arrival rate as a fraction of the capacity.
    #[arg(long, default_value_t = 0.8)]
    pub load: f64,
    /// Seconds of steady arrivals before the outage.
    #[arg(long, default_value_t = 5.0)]
    pub warmup_seconds: f64,
    /// Length T of the broker outage, seconds.
    #[arg(long, default_value_t = 10.0)]
    pub outage_seconds: f64,
    /// Give up on the drain after this many seconds (default: 10 × the
    /// predicted drain, at least 60).
    #[arg(long)]
    pub max_drain_seconds: Option<f64>,
    /// The relay's retry backoff (`relay.backoff.base_seconds`).
    #[arg(long, default_value_t = 1.0)]
    pub backoff_base_seconds: f64,
    /// The relay's longest retry delay (`relay.backoff.max_seconds`).
    #[arg(long, default_value_t = 300.0)]
    pub backoff_max_seconds: f64,
    /// Messages per consumer transaction (`consumers[].batch_in_transaction`).
    #[arg(long, default_value_t = 20)]
    pub consumer_batch: usize,
    /// Write the report as JSON here too.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

const NAME: &str = "drain";
const TICK: Duration = Duration::from_millis(100);

/// The backlog counters: committed by producers against handled since
/// phase 1 began.
struct Counters<'a> {
    pipe: &'a Pipeline,
    produced: Arc<AtomicU64>,
    handled_before: u64,
}

impl Counters<'_> {
    fn produced(&self) -> u64 {
        self.produced.load(Ordering::Relaxed)
    }
    fn handled(&self) -> u64 {
        self.pipe.handled().saturating_sub(self.handled_before)
    }
    fn backlog(&self) -> u64 {
        self.produced().saturating_sub(self.handled())
    }
}

/// Phase 0: fills the outbox with `events` and, while producers add
/// `rate` events/s more (none when 0), measures the consumed rate from 10 %
/// of the prefill handled until the backlog is down to 10 % of it (or 60 s
/// passed), events/s. Returns once everything is handled.
async fn measure_capacity(
    pool: &PgPool,
    pipe: &Pipeline,
    cfg: &PipelineConfig,
    events: i64,
    rate: f64,
) -> Result<f64, BenchError> {
    let c = Counters {
        pipe,
        produced: Arc::new(AtomicU64::new(0)),
        handled_before: pipe.handled(),
    };
    sqlx::query(
        "INSERT INTO outbox (aggregate_id, event_type, payload)
         SELECT 'agg-' || (g % $2), 'drain.event', jsonb_build_object('t', g, 'i', 0)
           FROM generate_series(1, $1) g ORDER BY g",
    )
    .bind(events)
    .bind(AGGREGATES as i64)
    .execute(pool)
    .await?;
    let n = events.max(10) as u64;
    let stop = Arc::new(AtomicBool::new(false));
    let producer = (rate > 0.0).then(|| {
        tokio::spawn(pipeline::produce(
            pool.clone(),
            cfg.event_type(),
            rate,
            Duration::from_secs(900),
            false,
            stop.clone(),
            c.produced.clone(),
        ))
    });
    let timeout = Duration::from_secs(600);
    pipe.wait_handled(c.handled_before + n / 10, timeout).await;
    let (t1, h1) = (Instant::now(), c.handled());
    while n + c.produced() > c.handled() + n / 10 && t1.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(TICK).await;
    }
    let (t2, h2) = (Instant::now(), c.handled());
    stop.store(true, Ordering::Relaxed);
    if let Some(p) = producer {
        let _ = p.await;
    }
    let total = c.handled_before + n + c.produced();
    if !pipe.wait_handled(total, timeout).await {
        return Err(BenchError::Incorrect(format!(
            "capacity phase: {} of {} events handled after {} s",
            c.handled(),
            total - c.handled_before,
            timeout.as_secs()
        )));
    }
    Ok((h2 - h1) as f64 / (t2 - t1).as_secs_f64().max(1e-3))
}

/// Splits a backlog into outbox pending rows and transport lag (published,
/// not yet handled). The two counts are read a moment apart, so the lag is
/// clamped at 0.
fn split(backlog: u64, pending: i64) -> (i64, i64) {
    (pending, (backlog as i64 - pending).max(0))
}

pub async fn drain(args: &DrainBenchArgs) -> Result<DrainReport, BenchError> {
    if !(args.load > 0.0 && args.load < 1.0) {
        return Err(BenchError::Refused(format!(
            "--load {} cannot drain: arrivals must be below capacity; use 0 < load < 1 (default 0.8)",
            args.load
        )));
    }
    let db = Db::connect(&args.url, 48).await?;
    let Db::Postgres(pool) = &db else {
        return Err(BenchError::Refused(
            "the drain benchmark needs a postgres:// URL".into(),
        ));
    };
    migrate(&db).await?;
    pipeline::reset(pool).await?;
    let backoff = Backoff {
        base_seconds: args.backoff_base_seconds,
        max_seconds: args.backoff_max_seconds,
    };
    let cfg = PipelineConfig {
        name: NAME,
        notify: true,
        relay_poll: Duration::from_millis(500),
        relay: RelayConfig {
            backoff,
            ..RelayConfig::default()
        },
        consumer_poll: Duration::from_millis(5),
        consumer_batch: args.consumer_batch,
    };
    let publisher = Arc::new(OutagePublisher::new(EmbeddedPublisher::new(
        db.clone(),
        PARTITIONS,
    )));
    let pipe = Pipeline::start(&db, &cfg, publisher.clone()).await?;
    // Unloaded, then with arrivals at `load` × that: the consumed rate
    // under arrivals is what a drain gets (producers share the cores).
    let (unloaded, capacity) = match args.capacity {
        Some(c) => (f64::NAN, c),
        None => {
            let c0 = measure_capacity(pool, &pipe, &cfg, args.capacity_events, 0.0).await?;
            let c1 =
                measure_capacity(pool, &pipe, &cfg, args.capacity_events, args.load * c0).await?;
            (c0, c1)
        }
    };
    let rate = capacity * args.load;
    let outage = Duration::from_secs_f64(args.outage_seconds);
    let guess = rate * args.outage_seconds / (capacity - rate);
    let max_drain = args.max_drain_seconds.unwrap_or((10.0 * guess).max(60.0));

    // Phase 1: steady arrivals.
    let c = Counters {
        pipe: &pipe,
        produced: Arc::new(AtomicU64::new(0)),
        handled_before: pipe.handled(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn(pipeline::produce(
        pool.clone(),
        cfg.event_type(),
        rate,
        Duration::from_secs_f64(args.warmup_seconds + args.outage_seconds + max_drain + 10.0),
        false,
        stop.clone(),
        c.produced.clone(),
    ));
    let mut steady_backlog = 0;
    let warm_end = Instant::now() + Duration::from_secs_f64(args.warmup_seconds);
    while Instant::now() < warm_end {
        tokio::time::sleep(TICK).await;
        steady_backlog = steady_backlog.max(c.backlog());
    }

    // Phase 2: the broker is unavailable for T.
    let mut outage_samples = Samples::default();
    let mut peak = (0u64, 0i64);
    let produced_at_start = c.produced();
    publisher.go_down();
    let started = Instant::now();
    let mut next_sample = started;
    let mut peak_backlog = 0;
    while started.elapsed() < outage {
        let b = c.backlog();
        peak_backlog = peak_backlog.max(b);
        if Instant::now() >= next_sample {
            let s = TableSample::take(pool).await?;
            let b = c.backlog();
            if b >= peak.0 {
                peak = (b, s.pending);
            }
            outage_samples.add(s);
            next_sample += SAMPLE_EVERY;
        }
        tokio::time::sleep(TICK.min(outage.saturating_sub(started.elapsed()))).await;
    }
    let arrival_rate =
        (c.produced() - produced_at_start) as f64 / started.elapsed().as_secs_f64().max(1e-3);
    let end_sample = TableSample::take(pool).await?;
    let backlog_at_outage_end = c.backlog();
    outage_samples.add(end_sample);
    publisher.come_up();
    let ended = Instant::now();
    let handled_at_end = c.handled();
    let produced_at_end = c.produced();

    // Phase 3: recovery, until the backlog is back at the steady level.
    let mut drain_samples = Samples::default();
    let mut next_sample = ended;
    let mut drained = None;
    while ended.elapsed().as_secs_f64() < max_drain {
        let b = c.backlog();
        peak_backlog = peak_backlog.max(b);
        if b <= steady_backlog {
            drained = Some((ended.elapsed().as_secs_f64(), c.handled(), c.produced()));
            break;
        }
        if Instant::now() >= next_sample {
            let s = TableSample::take(pool).await?;
            let b = c.backlog();
            if b >= peak.0 {
                peak = (b, s.pending);
            }
            drain_samples.add(s);
            next_sample += SAMPLE_EVERY;
        }
        tokio::time::sleep(TICK).await;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = producer.await;
    let events = c.produced();
    let all_handled = pipe
        .wait_handled(
            c.handled_before + events,
            Duration::from_secs(max_drain as u64 + 60),
        )
        .await;
    let handled = c.handled();
    pipe.stop().await;
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !all_handled || dead > 0 {
        return Err(BenchError::Incorrect(format!(
            "produced {events} events, the consumer handled {handled}, {dead} went dead \
             (dead ones: raise relay max attempts or --backoff-max-seconds)"
        )));
    }

    let predicted_backlog = arrival_rate * args.outage_seconds;
    let predicted_drain = predicted_backlog / (capacity - arrival_rate);
    let (measured_drain, drain_consumed, drain_arrivals) = match drained {
        Some((s, h, p)) => (
            s,
            (h - handled_at_end) as f64 / s.max(1e-3),
            (p - produced_at_end) as f64 / s.max(1e-3),
        ),
        None => (f64::NAN, f64::NAN, f64::NAN),
    };
    let (peak_pending, peak_lag) = split(peak.0, peak.1);
    let report = DrainReport {
        outage_kind: "simulated: embedded transport, every publish fails as retryable".into(),
        capacity_eps: capacity,
        unloaded_capacity_eps: unloaded,
        target_rate_eps: rate,
        arrival_rate_eps: arrival_rate,
        outage_seconds: args.outage_seconds,
        backoff_base_seconds: backoff.base_seconds,
        backoff_max_seconds: backoff.max_seconds,
        steady_backlog,
        predicted_backlog,
        backlog_at_outage_end,
        peak_backlog: peak_backlog.max(backlog_at_outage_end),
        peak_outbox_pending: peak_pending,
        peak_transport_lag: peak_lag,
        predicted_drain_seconds: predicted_drain,
        measured_drain_seconds: measured_drain,
        drain_ratio: measured_drain / predicted_drain,
        drain_consumed_eps: drain_consumed,
        drain_arrival_eps: drain_arrivals,
        first_publish_after_outage_seconds: publisher.first_ack_after_up().unwrap_or(f64::NAN),
        failed_publishes: publisher.failed(),
        outage_samples,
        drain_samples,
        events,
    };
    print(&report, max_drain);
    if let Some(path) = &args.json {
        super::write_json(path, &report)?;
    }
    Ok(report)
}
