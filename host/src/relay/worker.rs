//! The loop around [`Relay::step`]: sleep when idle, wake early on a
//! notification, back off when the database is in trouble, and drain the
//! in-flight batch on shutdown.

use std::time::Duration;

use tokio::sync::watch;

use super::{Relay, RelayError, Sent, StepOutcome};
use crate::broker::Publisher;
use crate::store::OutboxStore;

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Sleep after an idle step (500 ms by default: idle polling stays cheap).
    pub poll_interval: Duration,
    /// Longest pause after repeated store errors.
    pub max_error_backoff: Duration,
    /// Claim and send the next batch while the previous one is being
    /// marked. Faster (the plugin and broker work of one batch overlaps the
    /// database work of the other), at a cost on a crash: up to two
    /// batches, not one, are published again.
    pub pipeline: bool,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_millis(500),
            max_error_backoff: Duration::from_secs(30),
            pipeline: false,
        }
    }
}

/// Runs the relay until `shutdown` turns true. A step that has started is
/// never cancelled: shutdown is only observed between steps, so the
/// in-flight batch is published and marked before the loop returns.
///
/// `wake` ticks when new events may be due (Postgres LISTEN/NOTIFY).
pub async fn run<S: OutboxStore, P: Publisher>(
    relay: &Relay<S, P>,
    config: &WorkerConfig,
    mut wake: Option<watch::Receiver<u64>>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), RelayError> {
    if config.pipeline {
        return run_pipelined(relay, config, wake, shutdown).await;
    }
    let mut error_streak: u32 = 0;
    loop {
        if *shutdown.borrow() {
            return Ok(());
        }
        if let Some(w) = wake.as_mut() {
            w.borrow_and_update();
        }
        let pause = match relay.step().await {
            Ok(StepOutcome::Published(_)) => {
                error_streak = 0;
                continue;
            }
            Ok(StepOutcome::Idle) => {
                error_streak = 0;
                config.poll_interval
            }
            Err(RelayError::Fault(f)) => return Err(RelayError::Fault(f)),
            Err(RelayError::Store(e)) => error_pause(&mut error_streak, config, &e),
        };
        pause_or_wake(pause, error_streak, &mut wake, &mut shutdown).await;
    }
}

/// The pipelined loop: batch N is marked while batch N+1 is claimed and
/// sent. Ordering holds because a claim never takes an event while an older
/// event of its aggregate is unpublished, and batch N's events stay
/// unpublished until its mark commits. Shutdown is observed between rounds;
/// the batch in flight is always marked before returning.
async fn run_pipelined<S: OutboxStore, P: Publisher>(
    relay: &Relay<S, P>,
    config: &WorkerConfig,
    mut wake: Option<watch::Receiver<u64>>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), RelayError> {
    let mut error_streak: u32 = 0;
    let mut in_flight: Option<Sent<S::Batch>> = None;
    loop {
        if *shutdown.borrow() {
            if let Some(sent) = in_flight.take() {
                relay.settle(sent).await?;
            }
            return Ok(());
        }
        if let Some(w) = wake.as_mut() {
            w.borrow_and_update();
        }
        let overlapped = in_flight.is_some();
        let (settled, sent) = match in_flight.take() {
            None => (Ok(()), relay.send().await),
            Some(previous) => {
                let (settled, sent) = tokio::join!(relay.settle(previous), relay.send());
                (settled.map(|_| ()), sent)
            }
        };
        let failed = match (settled, sent) {
            (Err(RelayError::Fault(f)), _) | (_, Err(RelayError::Fault(f))) => {
                return Err(RelayError::Fault(f));
            }
            (Ok(()), Ok(Some(next))) => {
                error_streak = 0;
                in_flight = Some(next);
                continue;
            }
            // Nothing was claimable while the previous batch was unmarked
            // (its aggregates' next events wait for it): try again now
            // that it is marked, without the concurrent settle.
            (Ok(()), Ok(None)) if overlapped => {
                error_streak = 0;
                continue;
            }
            (Ok(()), Ok(None)) => {
                error_streak = 0;
                None
            }
            // A batch that was sent is kept, and marked on the next round.
            (Err(RelayError::Store(e)), Ok(next)) => {
                in_flight = next;
                Some(e)
            }
            (_, Err(RelayError::Store(e))) => Some(e),
        };
        let pause = match failed {
            None => config.poll_interval,
            Some(e) => error_pause(&mut error_streak, config, &e),
        };
        pause_or_wake(pause, error_streak, &mut wake, &mut shutdown).await;
    }
}

fn error_pause(streak: &mut u32, config: &WorkerConfig, e: &impl std::fmt::Display) -> Duration {
    *streak = streak.saturating_add(1);
    let pause = Duration::from_millis(100)
        .saturating_mul(2u32.saturating_pow((*streak).min(16)))
        .min(config.max_error_backoff);
    tracing::error!(error = %e, retry_in = ?pause, "relay step failed; backing off");
    pause
}

async fn pause_or_wake(
    pause: Duration,
    error_streak: u32,
    wake: &mut Option<watch::Receiver<u64>>,
    shutdown: &mut watch::Receiver<bool>,
) {
    tokio::select! {
        _ = tokio::time::sleep(pause) => {}
        _ = wait_for_wake(wake), if error_streak == 0 => {}
        _ = shutdown.changed() => {}
    }
}

async fn wait_for_wake(wake: &mut Option<watch::Receiver<u64>>) {
    match wake {
        Some(w) => {
            if w.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}
