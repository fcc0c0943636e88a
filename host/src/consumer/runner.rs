//! The consumer loop: fetch, handle each partition's messages in order
//! (partitions in parallel, up to a bound), commit offsets past handled
//! messages only.
//!
//! What happens to a failing message (attempts counted, dead-lettered
//! after a permanent failure or `max_attempts`) is in `runner/failures.rs`;
//! per-key parking behind a dead letter, and applying what an operator
//! released, in `runner/parking.rs`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::{StreamExt, stream};
use tokio::sync::watch;

use super::dead_letter::DeadLetterTopic;
use super::inbox::{Handler, Processed, attempt};
use crate::broker::ConsumeError;
use crate::broker::MessageSource;
use crate::config::OnDead;
use crate::fault::{FaultPoint, Faults, InjectedFault};
use crate::message::Delivery;
use crate::message::headers;
use crate::store::Db;

mod failures;
mod parking;

/// Called with every message whose effect committed (a duplicate is not
/// one): what a caller measures around a consumer (the example's and the
/// benchmarks' commit latency), so the product keeps no samples itself.
pub type OnHandled = Arc<dyn Fn(&Delivery) + Send + Sync>;

#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// The consumer's name in the inbox.
    pub name: String,
    pub fetch_max: usize,
    pub poll_interval: Duration,
    /// Pause before redelivering after a failed handler.
    pub retry_delay: Duration,
    /// After this many failed attempts a message is dead-lettered.
    pub max_attempts: u32,
    /// Which handler runs, for dead-letter records: `builtin:NAME` or
    /// `plugin NAME@VERSION`. A plugin handler names the version of each
    /// failed message itself; this is the fallback.
    pub handler_id: String,
    /// Handle up to this many messages of a partition in one transaction,
    /// each in its own savepoint (1 = one transaction per message).
    pub batch_in_transaction: usize,
    /// At most this many partitions are handled side by side, each holding
    /// one transaction, so a consumer never takes more of the pool than
    /// its share (`outboxd run` sets it from `database.max_connections`;
    /// see `Config::consumer_parallel_partitions`). Unbounded by default.
    pub max_parallel_partitions: usize,
    /// What a dead letter does to the later messages of its key.
    pub on_dead: OnDead,
    /// How often the runner reads its parked keys and applies what an
    /// operator released (redriven or discarded dead letters).
    pub parking_check: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            name: "consumer".into(),
            fetch_max: 100,
            poll_interval: Duration::from_millis(100),
            retry_delay: Duration::from_millis(500),
            max_attempts: 5,
            handler_id: "builtin".into(),
            batch_in_transaction: 1,
            max_parallel_partitions: usize::MAX,
            on_dead: OnDead::default(),
            parking_check: Duration::from_millis(500),
        }
    }
}

/// Counters a caller can read while the consumer runs.
#[derive(Debug, Default)]
pub struct ConsumerStats {
    pub handled: AtomicU64,
    pub duplicates: AtomicU64,
    pub failed: AtomicU64,
    pub dead_lettered: AtomicU64,
    /// Messages parked behind a dead letter of their key.
    pub parked: AtomicU64,
    /// Dead or parked messages applied after a redrive or discard.
    pub redriven: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error(transparent)]
    Source(#[from] ConsumeError),
    #[error(transparent)]
    Fault(#[from] InjectedFault),
}

pub struct Consumer<S, H> {
    db: Db,
    source: S,
    handler: Arc<H>,
    config: ConsumerConfig,
    stats: Arc<ConsumerStats>,
    faults: Faults,
    metrics: Option<Arc<crate::consumer::metrics::ConsumerMetrics>>,
    /// Failed attempts per message not yet handled or dead-lettered.
    attempts: std::sync::Mutex<HashMap<(String, i32, i64), u32>>,
    dlq_topic: Option<DeadLetterTopic>,
    on_handled: Option<OnHandled>,
    parking: parking::Parking,
}

impl<S: MessageSource, H: Handler> Consumer<S, H> {
    pub fn new(db: Db, source: S, handler: Arc<H>, config: ConsumerConfig) -> Self {
        Self {
            db,
            source,
            handler,
            config,
            stats: Arc::default(),
            faults: Faults::none(),
            metrics: None,
            attempts: std::sync::Mutex::default(),
            dlq_topic: None,
            on_handled: None,
            parking: parking::Parking::default(),
        }
    }

    /// Calls `hook` with every message whose effect committed.
    pub fn with_on_handled(mut self, hook: OnHandled) -> Self {
        self.on_handled = Some(hook);
        self
    }

    /// Also publish dead letters to `<topic>.dlq` (Kafka).
    pub fn with_dead_letter_topic(mut self, dlq: DeadLetterTopic) -> Self {
        self.dlq_topic = Some(dlq);
        self
    }

    pub fn with_metrics(mut self, metrics: Arc<crate::consumer::metrics::ConsumerMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    pub fn stats(&self) -> Arc<ConsumerStats> {
        self.stats.clone()
    }

    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    /// Fetches once and handles what came (and what parking released).
    pub async fn step(&mut self) -> Result<ConsumerStep, ConsumerError> {
        let (redriven, redrive_failed) = self.check_parking().await?;
        let fetch_started = crate::telemetry::enabled().then(std::time::SystemTime::now);
        let mut batch = self.source.fetch(self.config.fetch_max).await?;
        if batch.is_empty() {
            return Ok(ConsumerStep::new(redriven, redrive_failed));
        }
        crate::telemetry::fetched(&mut batch, &self.config.name, fetch_started);
        let mut by_partition: BTreeMap<(String, i32), Vec<Delivery>> = BTreeMap::new();
        for d in batch {
            by_partition
                .entry((d.topic.clone(), d.partition))
                .or_default()
                .push(d);
        }
        // Partitions are handled side by side where the database runs
        // writers in parallel, up to the bound (the results keep partition
        // order); on SQLite, with one writer at a time, side by side only
        // makes their transactions queue for the lock.
        let results: Vec<_> = if self.db.writes_in_parallel() {
            stream::iter(
                by_partition
                    .into_values()
                    .map(|msgs| self.handle_partition(msgs)),
            )
            .buffered(self.config.max_parallel_partitions.max(1))
            .collect()
            .await
        } else {
            let mut results = Vec::with_capacity(by_partition.len());
            for msgs in by_partition.into_values() {
                results.push(self.handle_partition(msgs).await);
            }
            results
        };
        let mut done = redriven;
        let mut any_failed = redrive_failed;
        let mut handled = Vec::new();
        for (last_ok, count, failed) in results {
            done += count;
            any_failed |= failed;
            if let Some(d) = last_ok {
                self.faults
                    .check(FaultPoint::AfterHandleBeforeCommitOffset)
                    .await?;
                handled.push(d);
            }
        }
        // Every partition's position together: one database commit for
        // the sources that keep cursors, instead of one per partition.
        if !handled.is_empty() {
            self.source.commit_all(handled).await?;
        }
        Ok(ConsumerStep::new(done, any_failed))
    }

    /// Handles one partition's messages in order; stops at the first failure
    /// so nothing after it is committed.
    async fn handle_partition(&self, msgs: Vec<Delivery>) -> (Option<Delivery>, usize, bool) {
        if self.config.batch_in_transaction > 1 {
            return self.handle_partition_batched(msgs).await;
        }
        let mut last_ok = None;
        let mut count = 0;
        for mut d in msgs {
            if self.is_parked(&d) {
                if !self.park(&d).await {
                    return (last_ok, count, true);
                }
                count += 1;
                last_ok = Some(d);
                continue;
            }
            d.attempt = self.failed_attempts(&d);
            let a = attempt(&self.db, &self.config.name, &d, self.handler.as_ref()).await;
            match a.result {
                Ok(outcome) => self.count_processed(&d, outcome),
                Err(err) => {
                    self.count_failed();
                    if !self.give_up(&d, &err, a.handled_by.as_deref()).await {
                        tracing::warn!(topic = %d.topic, partition = d.partition, offset = d.offset, error = %err, "handler failed; will redeliver");
                        return (last_ok, count, true);
                    }
                }
            }
            self.forget_attempts(&d);
            count += 1;
            last_ok = Some(d);
        }
        (last_ok, count, false)
    }

    /// The batched variant: savepoint per message, one commit per chunk.
    async fn handle_partition_batched(
        &self,
        mut msgs: Vec<Delivery>,
    ) -> (Option<Delivery>, usize, bool) {
        for d in &mut msgs {
            d.attempt = self.failed_attempts(d);
        }
        let mut last_ok = None;
        let mut count = 0;
        let mut start = 0;
        while start < msgs.len() {
            if self.is_parked(&msgs[start]) {
                if !self.park(&msgs[start]).await {
                    return (last_ok, count, true);
                }
                count += 1;
                last_ok = Some(msgs[start].clone());
                start += 1;
                continue;
            }
            // The chunk stops before the next message of a parked key.
            let limit = (start + self.config.batch_in_transaction).min(msgs.len());
            let end = (start + 1..limit)
                .find(|&i| self.is_parked(&msgs[i]))
                .unwrap_or(limit);
            let chunk = &msgs[start..end];
            let results = match super::batch::attempt_batch(
                &self.db,
                &self.config.name,
                chunk,
                self.handler.as_ref(),
            )
            .await
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "batch transaction failed; will redeliver");
                    return (last_ok, count, true);
                }
            };
            // Every result is settled below (handled, duplicate, or dead-
            // lettered) unless we return; the next chunk starts after them.
            let settled = results.len();
            for (d, a) in chunk.iter().zip(results) {
                match a.result {
                    Ok(outcome) => self.count_processed(d, outcome),
                    Err(err) => {
                        self.count_failed();
                        if !self.give_up(d, &err, a.handled_by.as_deref()).await {
                            return (last_ok, count, true);
                        }
                    }
                }
                self.forget_attempts(d);
                count += 1;
                last_ok = Some(d.clone());
            }
            start += settled.max(1);
        }
        (last_ok, count, false)
    }

    pub(super) fn count_processed(&self, d: &Delivery, outcome: Processed) {
        match outcome {
            Processed::Handled => {
                self.stats.handled.fetch_add(1, Ordering::Relaxed);
                if let Some(m) = &self.metrics {
                    m.processed.inc();
                    if let Some(ms) = lag_ms(d) {
                        m.lag.observe(ms / 1000.0);
                    }
                }
                if let Some(hook) = &self.on_handled {
                    hook(d);
                }
            }
            Processed::Duplicate => {
                self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
                if let Some(m) = &self.metrics {
                    m.duplicates.inc();
                }
            }
        }
    }

    fn count_failed(&self) {
        self.stats.failed.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = &self.metrics {
            m.failed.inc();
        }
    }

    /// Runs until `shutdown` turns true, finishing the in-flight batch.
    pub async fn run(&mut self, mut shutdown: watch::Receiver<bool>) -> Result<(), ConsumerError> {
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            let pause = match self.step().await {
                Ok(ConsumerStep::Handled(_)) => continue,
                // The fetch already waited for messages (a long poll).
                Ok(ConsumerStep::Idle) if self.source.waits_for_messages() => continue,
                Ok(ConsumerStep::Idle) => self.config.poll_interval,
                Ok(ConsumerStep::Failed { .. }) => self.config.retry_delay,
                Err(ConsumerError::Fault(f)) => return Err(ConsumerError::Fault(f)),
                Err(ConsumerError::Source(e @ ConsumeError::Fatal(_))) => {
                    tracing::error!(error = %e, "consumer stopped");
                    return Err(ConsumerError::Source(e));
                }
                Err(ConsumerError::Source(e)) => {
                    tracing::warn!(error = %e, "consumer fetch or commit failed; retrying");
                    self.config.retry_delay
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
}

/// What one [`Consumer::step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerStep {
    /// Nothing came and parking released nothing.
    Idle,
    /// This many messages were handled, dropped as duplicates or released
    /// from parking, and none failed: the consumer fetches again at once.
    Handled(usize),
    /// A message failed (it is tried again after `retry_delay`), after
    /// `handled` others were handled.
    Failed { handled: usize },
}

impl ConsumerStep {
    fn new(handled: usize, failed: bool) -> Self {
        match (handled, failed) {
            (_, true) => Self::Failed { handled },
            (0, false) => Self::Idle,
            (n, false) => Self::Handled(n),
        }
    }

    /// Messages handled, dropped as duplicates or released from parking.
    pub fn handled(self) -> usize {
        match self {
            Self::Idle => 0,
            Self::Handled(n) | Self::Failed { handled: n } => n,
        }
    }

    /// Whether a message failed in this step.
    pub fn failed(self) -> bool {
        matches!(self, Self::Failed { .. })
    }
}

/// Milliseconds from a message's `created-at` header (the producer's
/// commit) to now; `None` without a readable header.
pub fn lag_ms(d: &Delivery) -> Option<f64> {
    let created = d
        .header(headers::CREATED_AT)
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())?;
    Some(
        (chrono::Utc::now() - created.with_timezone(&chrono::Utc))
            .num_microseconds()
            .unwrap_or(0) as f64
            / 1000.0,
    )
}
