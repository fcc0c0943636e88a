//! Where the relay reads the time. Backoff and leases are computed from this
//! clock, so tests can move it instead of sleeping.

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

/// A clock that moves only when told to, for tests. (Not tokio's paused
/// time: SQLite's driver runs on its own thread, and while the runtime waits
/// for it, paused time auto-advances to the next timer; and tokio's
/// `test-util` feature in the tests' build alone would make every crate
/// that uses tokio compile twice in CI, once for the binaries and once for
/// the tests.)
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
