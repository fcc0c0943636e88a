//! The relay: claims due events, publishes each batch concurrently, awaits
//! every broker acknowledgement, then marks successes and failures.
//!
//! [`Relay::step`] is one batch; [`worker::run`] is the thin loop around it.
//! Events whose route names transformers go through that plugin chain first
//! ([`transform`]); the others take the plain path, untouched.

pub mod metrics;
pub mod transform;
pub mod wal;
pub mod worker;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use opentelemetry::Context;
use opentelemetry::trace::SpanKind;

use crate::backoff::Backoff;
use crate::broker::{PublishError, Publisher};
use crate::clock::Clock;
use crate::event::OutboxEvent;
use crate::fault::{FaultPoint, Faults, InjectedFault};
use crate::message::{OutgoingMessage, message_for_event};
use crate::plugin::lifecycle::chains::{Chains, RouteChain};
use crate::route::Router;
use crate::store::truncate;
use crate::store::{BatchOutcome, ClaimedBatch, FailedEvent, OutboxStore, StoreError};
use crate::telemetry::Span;

/// `last_error` is cut to this many characters (an error must not bloat the row).
pub const MAX_ERROR_CHARS: usize = 500;

#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub batch_size: usize,
    pub backoff: Backoff,
    /// After this many failed attempts the event is dead.
    pub max_attempts: i32,
    /// Caps one batch's broker round trip, and so how long claims are held.
    pub publish_timeout: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            batch_size: 100,
            backoff: Backoff::default(),
            max_attempts: 10,
            publish_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepReport {
    pub published: usize,
    /// Failed and scheduled for another attempt.
    pub retried: usize,
    /// Failed for the last time: moved to the dead state.
    pub dead: usize,
    /// Dropped on purpose by a transformer (no output): done, not lost.
    pub filtered: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepOutcome {
    /// A batch was claimed and settled.
    Published(StepReport),
    /// Nothing was due.
    Idle,
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Fault(#[from] InjectedFault),
}

pub struct Relay<S, P> {
    store: S,
    publisher: P,
    router: Router,
    config: RelayConfig,
    clock: Arc<dyn Clock>,
    faults: Faults,
    metrics: Option<metrics::RelayMetrics>,
    chains: Chains,
}

/// A claimed batch whose events were sent, waiting to be marked.
pub struct Sent<B> {
    batch: B,
    results: Vec<EventResult>,
}

/// What became of one claimed event.
enum EventResult {
    /// Every message acknowledged; `Some(label)` when plugins ran.
    Published(Option<String>),
    /// A plugin chain returned no output.
    Filtered(String),
    Failed {
        error: String,
        permanent: bool,
        cause: FailureCause,
        /// At least this long before the next attempt (`Retry-After`).
        retry_after: Option<Duration>,
    },
}

/// How soon an event of a paused route looks again whether its route was
/// resumed (no attempt is counted meanwhile).
pub const PAUSED_RECHECK: Duration = Duration::from_secs(5);

/// What made an event fail, for the `relay_failures` metric's label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FailureCause {
    /// The broker refused the message or failed.
    Broker,
    /// The broker did not acknowledge within `relay.publish_timeout`.
    BrokerTimeout,
    /// The broker has no such topic.
    TopicMissing,
    /// A plugin of the event's chain failed, or its task stopped.
    Plugin,
    /// The destination is paused (not an attempt).
    Paused,
}

impl EventResult {
    /// The failure of publishing one message.
    fn send_failed(e: SendError, error: String) -> Self {
        let (permanent, cause) = match &e {
            SendError::Broker(PublishError::TopicMissing { .. }) => {
                (false, FailureCause::TopicMissing)
            }
            SendError::Broker(PublishError::Paused { .. }) => (false, FailureCause::Paused),
            SendError::Broker(p) => (p.is_permanent(), FailureCause::Broker),
            SendError::Timeout(_) => (false, FailureCause::BrokerTimeout),
        };
        let retry_after = match &e {
            SendError::Broker(p) => p.retry_after(),
            SendError::Timeout(_) => None,
        };
        EventResult::Failed {
            error,
            permanent,
            cause,
            retry_after,
        }
    }
}

/// Why one publish failed.
#[derive(Debug, thiserror::Error)]
enum SendError {
    #[error(transparent)]
    Broker(PublishError),
    /// Worded as the broker's retryable errors are: the stored
    /// `last_error` reads the same whichever way the publish failed.
    #[error(
        "retryable broker error: no broker acknowledgement within {0:?} (relay.publish_timeout)"
    )]
    Timeout(std::time::Duration),
}

impl SendError {
    fn is_permanent(&self) -> bool {
        matches!(self, SendError::Broker(e) if e.is_permanent())
    }
}

/// One `claim` span per traced event of a batch, from when the claim
/// started; empty while telemetry is off.
fn claim_spans(events: &[OutboxEvent], started: Option<std::time::SystemTime>) -> Vec<Span> {
    if started.is_none() {
        return Vec::new();
    }
    events
        .iter()
        .map(|ev| {
            let parent = crate::telemetry::remote(
                ev.headers
                    .get(crate::telemetry::TRACEPARENT)
                    .map(String::as_str),
            );
            let span = Span::child_at(parent.as_ref(), "claim", SpanKind::Internal, started);
            span.attr("outboxd.seq", || ev.seq);
            span.attr("messaging.message.id", || ev.id.0.to_string());
            // The claim is over; the span stays the parent of what follows.
            span.finish();
            span
        })
        .collect()
}

/// The `relay_failures` label of a failure.
fn failure_label(permanent: bool, cause: FailureCause) -> &'static str {
    match (permanent, cause) {
        (true, _) => "permanent",
        (false, FailureCause::BrokerTimeout) => "timeout",
        (false, FailureCause::TopicMissing) => "topic_missing",
        (false, FailureCause::Plugin) => "plugin",
        (false, FailureCause::Paused) => "paused",
        (false, FailureCause::Broker) => "retryable",
    }
}

impl<S: OutboxStore, P: Publisher> Relay<S, P> {
    pub fn new(
        store: S,
        publisher: P,
        router: Router,
        config: RelayConfig,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            store,
            publisher,
            router,
            config,
            clock,
            faults: Faults::none(),
            metrics: None,
            chains: Chains::default(),
        }
    }

    /// Counts into the relay series (`Metrics::relay`, `relay/metrics.rs`).
    pub fn with_metrics(mut self, metrics: metrics::RelayMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Transformer chains per route, as [`build_chains`] makes them.
    pub fn with_chains(mut self, chains: Chains) -> Self {
        self.chains = chains;
        self
    }

    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// Claims one batch, publishes it, and marks the outcome.
    ///
    /// A row is marked published only after the broker acknowledged it. If
    /// this step is interrupted after publishing and before marking, the
    /// claim is released and the events are published again: at least once.
    pub async fn step(&self) -> Result<StepOutcome, RelayError> {
        match self.send().await? {
            Some(sent) => self.settle(sent).await.map(StepOutcome::Published),
            None => Ok(StepOutcome::Idle),
        }
    }

    /// The first half of a step: claims a batch and publishes it (through
    /// the plugin chains), awaiting every acknowledgement, but marks
    /// nothing. `None` when nothing was due. The claim stays held until
    /// [`Relay::settle`]; a pipelining worker claims and sends the next
    /// batch while this one is being marked (see [`worker::run`]).
    pub async fn send(&self) -> Result<Option<Sent<S::Batch>>, RelayError> {
        let now = self.clock.now();
        let claim_started = crate::telemetry::enabled().then(std::time::SystemTime::now);
        let batch = self.store.claim(self.config.batch_size, now).await?;
        if batch.events().is_empty() {
            return Ok(None);
        }
        let claims = claim_spans(batch.events(), claim_started);
        let mut pinned = self.pinned_chains(batch.events()).await;
        let transformed = self.run_chains(batch.events(), &pinned, &claims).await;
        let results = join_all(
            batch
                .events()
                .iter()
                .zip(transformed)
                .zip(pinned.iter_mut().map(Option::take))
                .enumerate()
                .map(|(i, ((ev, t), pin))| {
                    let claim = claims.get(i).and_then(Span::context);
                    async move {
                        match pin {
                            // A redriven event whose version cannot run is never
                            // published through the live chain instead.
                            Some(Err(e)) => EventResult::Failed {
                                permanent: e.permanent,
                                error: e.to_string(),
                                cause: FailureCause::Plugin,
                                retry_after: None,
                            },
                            _ => self.handle_event(ev, t, claim).await,
                        }
                    }
                }),
        )
        .await;
        Ok(Some(Sent { batch, results }))
    }

    /// The second half of a step: marks what [`Relay::send`] published,
    /// filtered or failed, in one statement per outcome.
    pub async fn settle(&self, sent: Sent<S::Batch>) -> Result<StepReport, RelayError> {
        let Sent { batch, results } = sent;
        self.faults
            .check(FaultPoint::AfterPublishBeforeMark)
            .await?;

        let now = self.clock.now();
        let batch_events_lag: Vec<f64> = if self.metrics.is_some() {
            batch
                .events()
                .iter()
                .zip(&results)
                .filter(|(_, r)| matches!(r, EventResult::Published(_)))
                .map(|(ev, _)| (now - ev.created_at).num_microseconds().unwrap_or(0) as f64 / 1e6)
                .collect()
        } else {
            Vec::new()
        };
        if let Some(m) = &self.metrics {
            for r in &results {
                if let EventResult::Failed {
                    permanent, cause, ..
                } = r
                {
                    m.failures.inc(failure_label(*permanent, *cause));
                }
            }
        }
        let mut outcome = BatchOutcome::default();
        let mut report = StepReport::default();
        for (ev, result) in batch.events().iter().zip(results) {
            match result {
                EventResult::Published(transformed_by) => {
                    outcome.published.push(ev.seq);
                    if let Some(label) = transformed_by {
                        outcome.transformed.push((ev.seq, label));
                    }
                    report.published += 1;
                }
                EventResult::Filtered(label) => {
                    outcome.filtered.push(ev.seq);
                    outcome.transformed.push((ev.seq, label));
                    report.filtered += 1;
                }
                EventResult::Failed {
                    error,
                    permanent,
                    cause,
                    retry_after,
                } => {
                    let error = truncate(&error, MAX_ERROR_CHARS);
                    let counts_attempt = cause != FailureCause::Paused;
                    let (dead, delay) = if counts_attempt {
                        let attempts = ev.attempts + 1;
                        let dead = permanent || attempts >= self.config.max_attempts;
                        tracing::warn!(seq = ev.seq, id = %ev.id, attempts, dead, error = %error, "publish failed");
                        let backoff = self.config.backoff.delay(ev.attempts);
                        (
                            dead,
                            retry_after.map_or(backoff, |after| after.max(backoff)),
                        )
                    } else {
                        tracing::debug!(seq = ev.seq, id = %ev.id, error = %error, "destination paused; the event waits");
                        (false, PAUSED_RECHECK)
                    };
                    outcome.failed.push(FailedEvent {
                        seq: ev.seq,
                        error,
                        retry_at: now
                            + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX),
                        dead,
                        counts_attempt,
                    });
                    if dead {
                        report.dead += 1;
                    } else {
                        report.retried += 1;
                    }
                }
            }
        }
        batch.complete(outcome, now).await?;
        if let Some(m) = &self.metrics {
            self.record(m, batch_events_lag, &report);
        }
        self.faults.check(FaultPoint::AfterMark).await?;
        Ok(report)
    }

    fn record(&self, m: &metrics::RelayMetrics, lags: Vec<f64>, report: &StepReport) {
        m.batches.inc();
        m.published.inc_by(report.published as u64);
        m.dead.inc_by(report.dead as u64);
        for lag in lags {
            m.lag.observe(lag);
        }
    }

    async fn handle_event(
        &self,
        ev: &OutboxEvent,
        transformed: Option<(RouteChain, transform::ChainOutput)>,
        claim: Option<&Context>,
    ) -> EventResult {
        if let Some((route, output)) = transformed {
            return self.publish_outputs(ev, &route, output, claim).await;
        }
        match self.publish(self.message_for(ev), claim).await {
            Ok(()) => EventResult::Published(None),
            Err(e) => {
                let error = e.to_string();
                EventResult::send_failed(e, error)
            }
        }
    }

    /// Publishes one message and waits for the broker's acknowledgement.
    /// Under a traced event the `publish` span covers that wait, and the
    /// message carries the span as its `traceparent`.
    async fn publish(
        &self,
        mut msg: OutgoingMessage,
        parent: Option<&Context>,
    ) -> Result<(), SendError> {
        let span = Span::child(parent, "publish", SpanKind::Producer);
        if let Some(traceparent) = span.traceparent() {
            span.attr("messaging.destination.name", || msg.topic.clone());
            span.attr("messaging.message.id", || msg.message_id.to_string());
            crate::telemetry::set_traceparent(&mut msg.headers, traceparent);
        }
        let result =
            match tokio::time::timeout(self.config.publish_timeout, self.publisher.publish(msg))
                .await
            {
                Ok(result) => result.map_err(SendError::Broker),
                Err(_) => Err(SendError::Timeout(self.config.publish_timeout)),
            };
        span.record(&result);
        result
    }

    /// The message for an event: keyed by aggregate, carrying the message id,
    /// type, aggregate, creation time and every event header.
    pub fn message_for(&self, ev: &OutboxEvent) -> OutgoingMessage {
        message_for_event(&self.router, ev)
    }
}
