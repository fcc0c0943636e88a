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

/// A clock that moves only when told to. Used where tokio's paused time
/// cannot be: SQLite's driver runs on its own thread, and while the runtime
/// waits for it, paused tokio time auto-advances to the next timer.
#[derive(Debug)]
pub struct ManualClock {
    now: std::sync::Mutex<DateTime<Utc>>,
}

impl ManualClock {
    pub fn starting_now() -> Self {
        Self {
            now: std::sync::Mutex::new(Utc::now()),
        }
    }

    pub fn advance(&self, by: std::time::Duration) {
        if let Ok(mut now) = self.now.lock() {
            *now += chrono::Duration::from_std(by).unwrap_or(chrono::Duration::zero());
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        self.now
            .lock()
            .map(|n| *n)
            .unwrap_or_else(|p| *p.into_inner())
    }
}
