//! The outbox gauges (`outboxd_outbox_*`): the backlog an operator watches,
//! from [`OutboxStats`], which the scrape reads from the database.
//!
//! A collector over a snapshot: the scrape reads the stats first (async,
//! with the store's timeout) and encodes this collector over them
//! (`Metrics::render`). prometheus-client's `Collector::encode` is
//! synchronous, so it cannot await the database itself, and a snapshot
//! kept in the process's registry would let one scrape show another's
//! numbers; each scrape carries its own.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::store::OutboxStats;

#[derive(Debug, Clone)]
pub struct OutboxGauges(pub OutboxStats);

impl OutboxGauges {
    /// Registers the gauges into `registry` (prefix `outboxd`).
    pub fn register(self, registry: &mut Registry) {
        registry
            .sub_registry_with_prefix("outbox")
            .register_collector(Box::new(self));
    }
}

fn gauge<N: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: N,
) -> std::fmt::Result {
    let gauge = ConstGauge::new(value);
    gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)
}

impl Collector for OutboxGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        let e = &mut encoder;
        gauge(e, "pending", "Pending (not dead) outbox events.", s.pending)?;
        gauge(
            e,
            "oldest_pending_age_seconds",
            "Age of the oldest pending event: the alert that matters.",
            s.oldest_pending_age_seconds,
        )?;
        gauge(
            e,
            "failing",
            "Pending events with 5 or more failed attempts.",
            s.failing,
        )?;
        gauge(
            e,
            "dead",
            "Dead events waiting for redrive or discard.",
            s.dead,
        )?;
        gauge(
            e,
            "blocked_aggregates",
            "Aggregates whose oldest unpublished event is dead.",
            s.blocked_aggregates,
        )
    }
}
