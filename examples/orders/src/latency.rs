//! Commit-to-effect latency, measured around a consumer: the demo and the
//! benchmarks hand [`LatencySamples::hook`] to the daemon's `on_handled`
//! (or a consumer's `with_on_handled`), so the product keeps no samples.

use std::sync::{Arc, Mutex};

use outboxd::consumer::runner::{OnHandled, lag_ms};
use outboxd::message::Delivery;

/// At most this many samples are kept; a long run keeps its first ones.
pub const MAX_SAMPLES: usize = 200_000;

/// Milliseconds from each message's producer commit (`created-at`) to its
/// effect's commit.
#[derive(Debug, Default)]
pub struct LatencySamples {
    samples: Mutex<Vec<f64>>,
}

impl LatencySamples {
    /// A hook that records every handled message into `self`.
    pub fn hook(self: &Arc<Self>) -> OnHandled {
        let me = self.clone();
        Arc::new(move |d: &Delivery| me.record(d))
    }

    pub fn record(&self, d: &Delivery) {
        if let Some(ms) = lag_ms(d)
            && let Ok(mut v) = self.samples.lock()
            && v.len() < MAX_SAMPLES
        {
            v.push(ms);
        }
    }

    /// The samples so far, sorted, for [`percentile`].
    pub fn sorted_ms(&self) -> Vec<f64> {
        let mut v = self.samples.lock().map(|v| v.clone()).unwrap_or_default();
        v.sort_by(f64::total_cmp);
        v
    }
}

/// The `p` quantile (0..=1) of sorted samples, nearest rank; 0 when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 51.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
