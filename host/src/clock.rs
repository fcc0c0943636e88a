//! Where the relay reads the time. Backoff and leases are computed from this
//! clock, so tests can drive them with paused tokio time instead of sleeping.

use chrono::{DateTime, Utc};

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// Wall time anchored at creation and advanced by tokio's clock, so that
/// `tokio::time::pause()` and `advance()` move it.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    wall: DateTime<Utc>,
    start: tokio::time::Instant,
}

impl TokioClock {
    pub fn starting_now() -> Self {
        Self {
            wall: Utc::now(),
            start: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> DateTime<Utc> {
        let elapsed = tokio::time::Instant::now() - self.start;
        self.wall + chrono::Duration::from_std(elapsed).unwrap_or(chrono::Duration::MAX)
    }
}
