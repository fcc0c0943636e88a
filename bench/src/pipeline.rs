//! The end-to-end pipeline the `latency` and `drain` benchmarks share, on
//! Postgres: producers commit events at a paced rate with [`enqueue`], two
//! relay workers publish them to the embedded transport (through a
//! publisher the caller picks, so `drain` can wrap it in an outage), and a
//! consumer runs each message through the inbox with a handler that writes
//! one effect row.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::BenchError;
use outboxd::broker::AnySource;
use outboxd::broker::Publisher;
use outboxd::broker::embedded::{EmbeddedConsumer, EmbeddedConsumerConfig};
use outboxd::clock::SystemClock;
use outboxd::consumer::inbox::Handler;
use outboxd::consumer::inbox::HandlerError;
use outboxd::consumer::runner::ConsumerStats;
use outboxd::consumer::{Consumer, ConsumerConfig};
use outboxd::event::NewEvent;
use outboxd::message::Delivery;
use outboxd::relay::Relay;
use outboxd::relay::RelayConfig;
use outboxd::relay::worker::{self, WorkerConfig};
use outboxd::route::Route;
use outboxd::route::Router;
use outboxd::store::Db;
use outboxd::store::InboxTx;
use outboxd::store::backend::notify::listen;
use outboxd::store::outbox::pg_claim::{PgStore, listen_for_events};
use outboxd_demo::latency::LatencySamples;

/// Partitions of the benchmark topic (publisher and consumer agree).
pub(crate) const PARTITIONS: i32 = 4;
/// Producers spread events over this many aggregates, in turn.
pub(crate) const AGGREGATES: u64 = 500;

/// How a benchmark's pipeline runs. `name` makes the route (`NAME.*`), the
/// event type (`NAME.event`), the topic (`outboxd.NAME`) and the consumer
/// group.
#[derive(Debug, Clone)]
pub(crate) struct PipelineConfig {
    pub name: &'static str,
    /// LISTEN/NOTIFY wakes the relay (polling stays as a fallback).
    pub notify: bool,
    pub relay_poll: Duration,
    pub relay: RelayConfig,
    pub consumer_poll: Duration,
    pub consumer_batch: usize,
}

impl PipelineConfig {
    pub fn event_type(&self) -> String {
        format!("{}.event", self.name)
    }
}

/// The consumer's effect: one row per message, in the inbox transaction.
pub(crate) struct Effect;

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

/// Empties the outbox, the transport, the inbox and the effects.
pub(crate) async fn reset(pool: &PgPool) -> Result<(), BenchError> {
    sqlx::query("CREATE TABLE IF NOT EXISTS bench_effects (message_id text PRIMARY KEY)")
        .execute(pool)
        .await?;
    sqlx::query("TRUNCATE outbox, transport_messages, transport_cursors, inbox, bench_effects")
        .execute(pool)
        .await?;
    Ok(())
}

/// Relay workers and a consumer running until [`Pipeline::stop`].
pub(crate) struct Pipeline {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: tokio::task::JoinSet<()>,
    pub stats: Arc<ConsumerStats>,
    /// Commit latency of every handled message.
    pub latencies: Arc<LatencySamples>,
}

impl Pipeline {
    pub async fn start<P: Publisher>(
        db: &Db,
        cfg: &PipelineConfig,
        publisher: Arc<P>,
    ) -> Result<Self, BenchError> {
        Self::start_with(db, cfg, publisher, None).await
    }

    /// The topic of `cfg`'s pipeline (what a `source` must read).
    pub fn topic(cfg: &PipelineConfig) -> String {
        format!("outboxd.{}", cfg.name)
    }

    /// [`start`](Self::start) with the consumer reading `source` (`None`:
    /// the embedded transport).
    pub async fn start_with<P: Publisher>(
        db: &Db,
        cfg: &PipelineConfig,
        publisher: Arc<P>,
        source: Option<AnySource>,
    ) -> Result<Self, BenchError> {
        let Db::Postgres(pool) = db else {
            return Err(BenchError::Refused(
                "the pipeline benchmarks need a postgres:// URL".into(),
            ));
        };
        let topic = format!("outboxd.{}", cfg.name);
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let mut tasks = tokio::task::JoinSet::new();
        let router = Router::new(vec![Route::new(format!("{}.*", cfg.name), &topic)]);
        for _ in 0..2 {
            let relay = Relay::new(
                PgStore::new(pool.clone()),
                publisher.clone(),
                router.clone(),
                cfg.relay.clone(),
                Arc::new(SystemClock),
            );
            let wake = match cfg.notify {
                true => Some(listen_for_events(pool).await?),
                false => None,
            };
            let wcfg = WorkerConfig {
                poll_interval: cfg.relay_poll,
                pipeline: true,
                ..WorkerConfig::default()
            };
            let stop = stop_rx.clone();
            tasks.spawn(async move {
                if let Err(e) = worker::run(&relay, &wcfg, wake, stop).await {
                    tracing::error!(error = %e, "bench relay stopped");
                }
            });
        }
        let source = match source {
            Some(s) => s,
            None => {
                let mut source = EmbeddedConsumer::new(
                    db.clone(),
                    EmbeddedConsumerConfig {
                        group: cfg.name.into(),
                        topics: vec![topic],
                        partitions: PARTITIONS,
                        lease: Duration::from_secs(30),
                    },
                );
                if cfg.notify {
                    // As `outboxd run` does on Postgres: publishes wake the
                    // consumer.
                    let wake = listen(pool, outboxd::store::transport::NOTIFY_CHANNEL).await?;
                    source = source.with_wake(wake, Duration::from_millis(500));
                }
                AnySource::Embedded(source)
            }
        };
        let mut consumer = Consumer::new(
            db.clone(),
            source,
            Arc::new(Effect),
            ConsumerConfig {
                name: cfg.name.into(),
                poll_interval: cfg.consumer_poll,
                batch_in_transaction: cfg.consumer_batch,
                ..ConsumerConfig::default()
            },
        );
        let latencies = Arc::new(LatencySamples::default());
        consumer = consumer.with_on_handled(latencies.hook());
        let stats = consumer.stats();
        tasks.spawn(async move {
            if let Err(e) = consumer.run(stop_rx).await {
                tracing::error!(error = %e, "bench consumer stopped");
            }
        });
        Ok(Self {
            stop,
            tasks,
            stats,
            latencies,
        })
    }

    /// Messages the consumer has handled (duplicates not counted).
    pub fn handled(&self) -> u64 {
        self.stats.handled.load(Ordering::Relaxed)
    }

    /// Waits until the consumer has handled `total` messages or `timeout`
    /// passed; true when it got there.
    pub async fn wait_handled(&self, total: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.handled() < total && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.handled() >= total
    }

    /// Stops the relay workers and the consumer after their batch in flight.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Producer transactions in flight at once, at most.
const IN_FLIGHT: usize = 32;

/// A paced producer: `rate` events/s in 10 ms ticks, each event its own
/// transaction, up to [`IN_FLIGHT`] of them committing at once so the rate
/// does not hinge on one commit's latency. It stops after `max` or once
/// `stop` is set. With `catch_up`, ticks that fell behind are made up in a
/// burst (a fixed number of events); without, they are skipped, so the
/// rate never exceeds `rate` (a steady arrival rate). Either way
/// `produced` / elapsed is the rate actually reached.
pub(crate) async fn produce(
    pool: PgPool,
    event_type: String,
    rate: f64,
    max: Duration,
    catch_up: bool,
    stop: Arc<AtomicBool>,
    produced: Arc<AtomicU64>,
) {
    let tick = Duration::from_millis(10);
    let ticks = max.as_millis() as u64 / 10;
    let per_tick = rate / 100.0;
    let mut owed = 0.0;
    let mut next: u64 = 0;
    let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(match catch_up {
        true => tokio::time::MissedTickBehavior::Burst,
        false => tokio::time::MissedTickBehavior::Skip,
    });
    'ticks: for t in 0..ticks {
        interval.tick().await;
        owed += per_tick;
        let n = owed.floor() as u64;
        owed -= n as f64;
        for i in 0..n {
            if stop.load(Ordering::Relaxed) {
                break 'ticks;
            }
            let Ok(slot) = slots.clone().acquire_owned().await else {
                break 'ticks;
            };
            let seq = next;
            next += 1;
            let (pool, produced, event_type) = (pool.clone(), produced.clone(), event_type.clone());
            tokio::spawn(async move {
                let _slot = slot;
                // Aggregates in turn: consecutive events never share one.
                let ev = NewEvent::new(
                    format!("agg-{}", seq % AGGREGATES),
                    event_type,
                    serde_json::json!({ "t": t, "i": i }),
                );
                match enqueue_one(&pool, ev).await {
                    Ok(()) => {
                        produced.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => tracing::warn!(error = %e, "bench producer: an enqueue failed"),
                }
            });
        }
    }
    // Every transaction started has finished once all slots are free.
    let _ = slots.acquire_many(IN_FLIGHT as u32).await;
}

async fn enqueue_one(pool: &PgPool, ev: NewEvent) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    outboxd::store::enqueue(&mut tx, ev)
        .await
        .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
    tx.commit().await
}
