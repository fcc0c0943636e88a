//! The loop around [`Relay::step`]: sleep when idle, wake early on a
//! notification, back off when the database is in trouble, and drain the
//! in-flight batch on shutdown.

use std::time::Duration;

use tokio::sync::watch;

use super::{Relay, RelayError, StepOutcome};
use crate::broker::Publisher;
use crate::store::OutboxStore;

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Sleep after an idle step (seed 000: 500 ms).
    pub poll_interval: Duration,
    /// Longest pause after repeated store errors.
    pub max_error_backoff: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_millis(500),
            max_error_backoff: Duration::from_secs(30),
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
            Err(RelayError::Store(e)) => {
                error_streak = error_streak.saturating_add(1);
                let pause = Duration::from_millis(100)
                    .saturating_mul(2u32.saturating_pow(error_streak.min(16)))
                    .min(config.max_error_backoff);
                tracing::error!(error = %e, retry_in = ?pause, "relay step failed; backing off");
                pause
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = wait_for_wake(&mut wake), if error_streak == 0 => {}
            _ = shutdown.changed() => {}
        }
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
