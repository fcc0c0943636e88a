//! What `outboxd bench drain` reports: the figures, as JSON and as the
//! printed line that compares them with the formula (backlog = rate × T,
//! drain = backlog / (capacity − rate)).

use serde::Serialize;

use super::outage::{MIB, Samples};

#[derive(Debug, Clone, Serialize)]
pub struct DrainReport {
    pub outage_kind: String,
    /// Consumed rate with a backlog and arrivals at `load` × the unloaded
    /// rate: the capacity the formula uses.
    pub capacity_eps: f64,
    /// Consumed rate with a backlog and no arrivals.
    pub unloaded_capacity_eps: f64,
    pub target_rate_eps: f64,
    /// Arrivals actually committed during the outage, per second.
    pub arrival_rate_eps: f64,
    pub outage_seconds: f64,
    pub backoff_base_seconds: f64,
    pub backoff_max_seconds: f64,
    /// The highest backlog sampled in the steady warm-up.
    pub steady_backlog: u64,
    /// rate × T.
    pub predicted_backlog: f64,
    pub backlog_at_outage_end: u64,
    pub peak_backlog: u64,
    /// The outbox's pending rows and the transport lag at the peak sample.
    pub peak_outbox_pending: i64,
    pub peak_transport_lag: i64,
    /// backlog / (capacity − rate).
    pub predicted_drain_seconds: f64,
    /// End of the outage → backlog back at `steady_backlog` (NaN: not within
    /// `max_drain_seconds`).
    pub measured_drain_seconds: f64,
    pub drain_ratio: f64,
    /// Handled per second during the measured drain.
    pub drain_consumed_eps: f64,
    /// Committed by producers per second during the measured drain.
    pub drain_arrival_eps: f64,
    /// End of the outage → the first acknowledged publish.
    pub first_publish_after_outage_seconds: f64,
    /// Publishes refused during the outage (relay attempts).
    pub failed_publishes: u64,
    pub outage_samples: Samples,
    pub drain_samples: Samples,
    pub events: u64,
}

pub(crate) fn print(r: &DrainReport, max_drain: f64) {
    let o = &r.outage_samples;
    let mib = |b: i64| b as f64 / MIB;
    let rss_growth = (o.max_rss_kib as f64 - o.first.rss_kib as f64) / 1024.0;
    println!(
        "drain: capacity {:.0} ev/s, arrivals {:.0} ev/s ({:.0} %, target {:.0}), outage T {:.1} s; \
         backlog predicted {:.0} (rate × T), measured peak {} (at the peak 0.5 s sample: {} outbox pending + {} transport lag); \
         drain predicted {:.1} s (backlog / (capacity − rate)), measured {:.1} s, measured/predicted {:.2}; \
         during the outage RSS max {:.1} MiB (+{:.1} MiB), outbox table {:.2} / {:.2} / {:.2} MiB \
         (start / peak / end, {:.0} rows/MiB)",
        r.capacity_eps,
        r.arrival_rate_eps,
        100.0 * r.arrival_rate_eps / r.capacity_eps,
        r.target_rate_eps,
        r.outage_seconds,
        r.predicted_backlog,
        r.peak_backlog,
        r.peak_outbox_pending,
        r.peak_transport_lag,
        r.predicted_drain_seconds,
        r.measured_drain_seconds,
        r.drain_ratio,
        o.max_rss_kib as f64 / 1024.0,
        rss_growth,
        mib(o.first.outbox_bytes),
        mib(o.max_outbox_bytes.max(r.drain_samples.max_outbox_bytes)),
        mib(o.last.outbox_bytes),
        o.rows_per_mib(),
    );
    println!(
        "  capacity = consumed rate with a backlog while arrivals go on at the load \
         ({:.0} ev/s with no arrivals)",
        r.unloaded_capacity_eps
    );
    println!(
        "  outage: {}; {} publishes refused; relay backoff base {} s, max {} s; \
         first publish {:.1} s after the outage ended; backlog at the outage's end {}",
        r.outage_kind,
        r.failed_publishes,
        r.backoff_base_seconds,
        r.backoff_max_seconds,
        r.first_publish_after_outage_seconds,
        r.backlog_at_outage_end,
    );
    println!(
        "  drain = end of the outage → backlog (committed − handled) back at the steady level {} \
         (highest in the warm-up){}; while draining {:.0} ev/s consumed, {:.0} ev/s arrived; \
         {} events, each handled once",
        r.steady_backlog,
        if r.measured_drain_seconds.is_nan() {
            format!(", NOT reached within {max_drain:.0} s")
        } else {
            String::new()
        },
        r.drain_consumed_eps,
        r.drain_arrival_eps,
        r.events,
    );
}
