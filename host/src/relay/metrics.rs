//! The relay's metrics (`outboxd_relay_*`): batches, published and dead
//! events, failed publishes by cause, and the lag from commit to broker
//! acknowledgement. The relay holds these handles (clones of the
//! registered metrics), so a batch's update is a few atomic adds.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Bucket bounds in seconds of the relay's lag histogram (commit to
/// acknowledged publish).
const LAG_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0,
];

#[derive(Debug, Clone)]
pub struct RelayMetrics {
    pub batches: Counter,
    pub published: Counter,
    pub dead: Counter,
    /// Publish failures by reason: retryable, permanent, timeout,
    /// topic_missing, plugin.
    pub failures: PublishFailures,
    /// From the event's commit to the broker's acknowledgement.
    pub lag: Histogram,
}

impl Default for RelayMetrics {
    fn default() -> Self {
        Self {
            batches: Counter::default(),
            published: Counter::default(),
            dead: Counter::default(),
            failures: PublishFailures::default(),
            lag: Histogram::new(LAG_BUCKETS),
        }
    }
}

impl RelayMetrics {
    /// Registers `outboxd_relay_*` into `registry` (prefix `outboxd`).
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("relay");
        r.register(
            "batches",
            "Batches the relay claimed and settled",
            self.batches.clone(),
        );
        r.register(
            "published",
            "Events acknowledged by the broker and marked",
            self.published.clone(),
        );
        r.register("dead", "Events moved to the dead state", self.dead.clone());
        r.register(
            "publish_failures",
            "Failed publishes by reason",
            self.failures.0.clone(),
        );
        r.register(
            "lag_seconds",
            "From commit to broker acknowledgement",
            self.lag.clone(),
        );
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// `outboxd_relay_publish_failures_total{reason}`; a reason appears with
/// its first failure.
#[derive(Debug, Clone, Default)]
pub struct PublishFailures(Family<ReasonLabel, Counter>);

impl PublishFailures {
    pub fn inc(&self, reason: &'static str) {
        self.0.get_or_create(&ReasonLabel { reason }).inc();
    }

    pub fn get(&self, reason: &'static str) -> u64 {
        self.0
            .get(&ReasonLabel { reason })
            .map(|c| c.get())
            .unwrap_or(0)
    }
}
