//! Per-event backoff: `min(base * 2^attempts, cap)`, so a failing broker is retried quickly at first and never hammered
//! (1 s, 2 s, 4 s ... up to 5 minutes) by default.

use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backoff {
    /// Delay after the first failure, in seconds.
    #[serde(default = "default_base")]
    pub base_seconds: f64,
    /// The longest delay, in seconds.
    #[serde(default = "default_cap")]
    pub max_seconds: f64,
}

fn default_base() -> f64 {
    1.0
}
fn default_cap() -> f64 {
    300.0
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base_seconds: default_base(),
            max_seconds: default_cap(),
        }
    }
}

impl Backoff {
    /// The delay after an event that had failed `attempts` times before this
    /// failure (0 for the first failure).
    pub fn delay(&self, attempts: i32) -> Duration {
        let exp = attempts.clamp(0, 62);
        let secs = (self.base_seconds * 2f64.powi(exp))
            .min(self.max_seconds)
            .max(0.0);
        Duration::from_secs_f64(secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_schedule_doubles_and_caps_at_five_minutes() {
        let b = Backoff::default();
        let secs: Vec<u64> = (0..12).map(|a| b.delay(a).as_secs()).collect();
        assert_eq!(secs, vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(b.delay(10_000).as_secs(), 300);
    }
}
