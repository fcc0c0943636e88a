//! Process metrics in Prometheus text format, kept by hand: a few atomics,
//! labelled counters and fixed-bucket histograms, so the hot path is an
//! atomic add and nothing else.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::store::OutboxStats;

/// Bucket bounds in seconds for lag histograms.
const LAG_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0,
];

/// Bucket bounds in seconds for plugin call latency.
pub const CALL_BUCKETS: [f64; 10] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.005, 0.025, 0.1,
];

#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::with_buckets(&LAG_BUCKETS)
    }
}

impl Histogram {
    pub fn with_buckets(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, seconds: f64) {
        let seconds = seconds.max(0.0);
        let idx = self
            .bounds
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[idx].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }

    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, bound) in self.bounds.iter().enumerate() {
            cumulative += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
            );
        }
        cumulative += self.counts[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cumulative}"
        );
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(
            out,
            "{name}_sum{braces} {}",
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{braces} {cumulative}");
    }

    /// The `q` quantile (0 to 1) of what was observed, estimated as
    /// Prometheus's `histogram_quantile` does: linear within the bucket the
    /// rank falls in, and the largest finite bound when it falls beyond it.
    /// `None` before the first observation.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total as f64;
        let mut below = 0u64;
        for (i, n) in counts.iter().enumerate() {
            let upto = below + n;
            if (upto as f64) >= rank && *n > 0 {
                let Some(upper) = self.bounds.get(i) else {
                    break;
                };
                let lower = if i == 0 { 0.0 } else { self.bounds[i - 1] };
                let within = (rank - below as f64) / *n as f64;
                return Some(lower + (upper - lower) * within);
            }
            below = upto;
        }
        self.bounds.last().copied()
    }
}

/// Counters keyed by a label value.
#[derive(Debug, Default)]
pub struct LabelledCounter(Mutex<BTreeMap<String, u64>>);

impl LabelledCounter {
    pub fn inc(&self, label: &str) {
        self.add(label, 1);
    }

    pub fn add(&self, label: &str, n: u64) {
        if let Ok(mut m) = self.0.lock() {
            *m.entry(label.to_string()).or_default() += n;
        }
    }

    pub fn get(&self, label: &str) -> u64 {
        self.0
            .lock()
            .map(|m| m.get(label).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    fn snapshot(&self) -> Vec<(String, u64)> {
        self.0
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), *v)).collect())
            .unwrap_or_default()
    }
}

#[derive(Debug, Default)]
pub struct ConsumerMetrics {
    pub processed: AtomicU64,
    pub duplicates: AtomicU64,
    pub failed: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub lag: Histogram,
    /// Kafka group members: rejoins because the group stopped making
    /// progress, by reason (`broker::kafka` liveness).
    pub recoveries: LabelledCounter,
    /// Kafka group members: partitions with lag and no progress for the
    /// stall time, at the last look.
    pub stalled_partitions: AtomicU64,
    /// Per-key parking (`on_dead = "park_key"`): see [`ParkingMetrics`].
    pub parking: ParkingMetrics,
}

/// A consumer's parked keys: counters of messages parked and applied back
/// from dead letters, and gauges of what is held back now (set each time
/// the runner reads its parked keys).
#[derive(Debug, Default)]
pub struct ParkingMetrics {
    /// Messages recorded as parked behind a dead letter of their key.
    pub parked: AtomicU64,
    /// Dead or parked messages applied after a redrive or a discard.
    pub redriven: AtomicU64,
    pub parked_keys: AtomicU64,
    pub parked_messages: AtomicU64,
    /// Seconds since the oldest parked key's dead letter (0 when none).
    pub oldest_parked_seconds: AtomicU64,
}

impl ParkingMetrics {
    fn render(out: &mut String, consumers: &[(String, std::sync::Arc<ConsumerMetrics>)]) {
        for (name, kind, help, pick) in [
            (
                "outboxd_consumer_parked_total",
                "counter",
                "Messages parked behind a dead letter of their key.",
                0,
            ),
            (
                "outboxd_consumer_redriven_total",
                "counter",
                "Dead or parked messages applied after a redrive or discard.",
                1,
            ),
            (
                "outboxd_consumer_parked_keys",
                "gauge",
                "Keys held back by an unresolved dead letter.",
                2,
            ),
            (
                "outboxd_consumer_parked_messages",
                "gauge",
                "Messages waiting behind a dead letter of their key.",
                3,
            ),
            (
                "outboxd_consumer_oldest_parked_seconds",
                "gauge",
                "Age of the oldest parked key's dead letter (0 when none).",
                4,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (c, m) in consumers {
                let p = &m.parking;
                let v = [
                    &p.parked,
                    &p.redriven,
                    &p.parked_keys,
                    &p.parked_messages,
                    &p.oldest_parked_seconds,
                ][pick]
                    .load(Ordering::Relaxed);
                let _ = writeln!(out, "{name}{{consumer=\"{}\"}} {v}", escape(c));
            }
        }
    }
}

/// What the WAL relay reports of its slot and its hand-offs.
#[derive(Debug, Default)]
pub struct WalMetrics {
    /// 1 while this process reads the slot.
    pub active: AtomicU64,
    /// Server WAL end minus the confirmed flush position, as the stream
    /// reports it.
    pub lag_bytes: AtomicU64,
    /// 1 once this process fell back to polling (relay.wal.max_lag_bytes).
    pub fallback: AtomicU64,
    /// Aggregates handed to polling (a failed or dead event, or rows the
    /// slot does not replay).
    pub handed_aggregates: AtomicU64,
    /// Times this process became the slot's reader.
    pub takeovers: AtomicU64,
}

impl WalMetrics {
    fn render(&self, out: &mut String) {
        for (name, help, value) in [
            (
                "outboxd_relay_wal_active",
                "1 while this process reads the replication slot (relay.source = \"wal\").",
                &self.active,
            ),
            (
                "outboxd_relay_wal_lag_bytes",
                "Server WAL end minus the slot's confirmed flush position, as the stream reports it.",
                &self.lag_bytes,
            ),
            (
                "outboxd_relay_wal_fallback",
                "1 once this process fell back from the WAL to polling (relay.wal.max_lag_bytes).",
                &self.fallback,
            ),
            (
                "outboxd_relay_wal_handed_aggregates",
                "Aggregates the WAL relay handed to polling (failed or dead events, rows the slot does not replay).",
                &self.handed_aggregates,
            ),
        ] {
            gauge(out, name, help, value.load(Ordering::Relaxed) as f64);
        }
        counter(
            out,
            "outboxd_relay_wal_takeovers_total",
            "Times this process became the reader of the replication slot.",
            self.takeovers.load(Ordering::Relaxed),
        );
    }
}

#[derive(Debug, Default)]
pub struct Metrics {
    pub relay_batches: AtomicU64,
    pub relay_published: AtomicU64,
    pub relay_dead: AtomicU64,
    /// Publish failures by reason: retryable, permanent, timeout,
    /// topic_missing, plugin.
    pub relay_failures: LabelledCounter,
    /// From the event's commit to the broker's acknowledgement.
    pub relay_lag: Histogram,
    /// The WAL relay (relay.source = "wal"); zero in polling mode.
    pub wal: WalMetrics,
    consumers: Mutex<BTreeMap<String, std::sync::Arc<ConsumerMetrics>>>,
    /// Business rows missing their event, per reconciliation rule (last run).
    reconcile_missing: Mutex<BTreeMap<String, u64>>,
    /// Rows removed by retention, by table.
    pub retention_deleted: LabelledCounter,
    /// Plugins loaded in this process, for their per-version metrics.
    plugins: Mutex<Vec<std::sync::Arc<dyn PluginReport>>>,
    /// `relay.source = "wal"`: WAL bytes the replication slot keeps on the
    /// server (`pg_current_wal_lsn() - restart_lsn`), as the admin sampler
    /// last read it; see [`Metrics::set_wal_retained`].
    pub relay_wal_retained_bytes: AtomicI64,
    /// The slot those bytes belong to; `None` until first sampled, and then
    /// the gauge is not rendered (polling processes have no slot).
    relay_wal_slot: Mutex<Option<String>>,
}

/// What `/metrics` and the admin API show of one loaded plugin version.
/// The plugin host implements it, so this module needs nothing of the host.
pub trait PluginReport: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &str;
    fn version(&self) -> &str;
    /// `transformer` or `consumer`.
    fn world(&self) -> &'static str;
    fn counters(&self) -> PluginCounters;
    fn latency(&self) -> &Histogram;
    /// A consumer plugin's outbound HTTP requests.
    fn http(&self) -> Option<&HttpMetrics> {
        None
    }
}

/// One plugin version's outbound HTTP: requests by listed host and outcome
/// (`2xx`..`5xx`, `error`, `refused`), latency by host. The host label is
/// an `allowed_outbound_hosts` entry or `unlisted`, never a name the
/// plugin chose, so a plugin cannot grow the label set.
#[derive(Debug, Default)]
pub struct HttpMetrics {
    requests: Mutex<BTreeMap<(String, &'static str), u64>>,
    seconds: Mutex<BTreeMap<String, std::sync::Arc<Histogram>>>,
}

impl HttpMetrics {
    pub fn record(&self, host: &str, outcome: &'static str, took: std::time::Duration) {
        if let Ok(mut r) = self.requests.lock() {
            *r.entry((host.to_string(), outcome)).or_default() += 1;
        }
        let h = match self.seconds.lock() {
            Ok(mut s) => s.entry(host.to_string()).or_default().clone(),
            Err(_) => return,
        };
        h.observe(took.as_secs_f64());
    }

    /// `(host, outcome, count)`, sorted.
    pub fn requests(&self) -> Vec<(String, &'static str, u64)> {
        self.requests
            .lock()
            .map(|r| r.iter().map(|((h, o), n)| (h.clone(), *o, *n)).collect())
            .unwrap_or_default()
    }
}

fn render_http(out: &mut String, plugins: &[std::sync::Arc<dyn PluginReport>]) {
    let _ = writeln!(
        out,
        "# HELP outboxd_plugin_http_requests_total Consumer plugins' outbound HTTP requests by host and outcome.\n# TYPE outboxd_plugin_http_requests_total counter"
    );
    for p in plugins {
        let Some(m) = p.http() else { continue };
        for (host, outcome, n) in m.requests() {
            let _ = writeln!(
                out,
                "outboxd_plugin_http_requests_total{{plugin=\"{}\",version=\"{}\",host=\"{}\",outcome=\"{outcome}\"}} {n}",
                escape(p.name()),
                escape(p.version()),
                escape(&host)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP outboxd_plugin_http_request_seconds Consumer plugins' outbound HTTP request latency.\n# TYPE outboxd_plugin_http_request_seconds histogram"
    );
    for p in plugins {
        let Some(m) = p.http() else { continue };
        let hosts: Vec<_> = m
            .seconds
            .lock()
            .map(|s| s.iter().map(|(h, v)| (h.clone(), v.clone())).collect())
            .unwrap_or_default();
        for (host, h) in hosts {
            let labels = format!("plugin=\"{}\",host=\"{}\"", escape(p.name()), escape(&host));
            h.render(out, "outboxd_plugin_http_request_seconds", &labels);
        }
    }
}

/// A point-in-time copy of one plugin version's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginCounters {
    pub calls: u64,
    /// Failures by kind.
    pub errors: Vec<(&'static str, u64)>,
    pub total_time: std::time::Duration,
    /// The most linear memory one instance held, in bytes.
    pub memory_high_water: u64,
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    pub fn consumer(&self, name: &str) -> std::sync::Arc<ConsumerMetrics> {
        let mut map = match self.consumers.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        map.entry(name.to_string()).or_default().clone()
    }

    /// Every consumer this process runs, with its counters, by name.
    pub fn consumers(&self) -> Vec<(String, std::sync::Arc<ConsumerMetrics>)> {
        self.consumers
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    /// Adds plugin versions to those reported; whoever loads a version
    /// registers it (the daemon at start, the rollout whenever it loads
    /// one), so a version activated later is reported too. A version
    /// registered again, or another copy of a `name@version` already
    /// registered, is ignored: one series per version.
    pub fn register_plugins(
        &self,
        plugins: impl IntoIterator<Item = std::sync::Arc<dyn PluginReport>>,
    ) {
        if let Ok(mut v) = self.plugins.lock() {
            for p in plugins {
                let known = v.iter().any(|q| {
                    std::sync::Arc::ptr_eq(q, &p)
                        || (q.name() == p.name() && q.version() == p.version())
                });
                if !known {
                    v.push(p);
                }
            }
        }
    }

    pub fn plugins(&self) -> Vec<std::sync::Arc<dyn PluginReport>> {
        self.plugins.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Records a sample of the WAL relay's slot: `bytes` of WAL retained.
    pub fn set_wal_retained(&self, slot: &str, bytes: i64) {
        if let Ok(mut s) = self.relay_wal_slot.lock()
            && s.as_deref() != Some(slot)
        {
            *s = Some(slot.to_string());
        }
        self.relay_wal_retained_bytes
            .store(bytes, Ordering::Relaxed);
    }

    pub fn set_reconcile_missing(&self, rule: &str, missing: u64) {
        if let Ok(mut m) = self.reconcile_missing.lock() {
            m.insert(rule.to_string(), missing);
        }
    }

    /// Renders everything, with the outbox gauges from `stats` when given.
    pub fn render(&self, stats: Option<&OutboxStats>) -> String {
        let mut out = String::with_capacity(4096);
        if let Some(s) = stats {
            gauge(
                &mut out,
                "outboxd_outbox_pending",
                "Pending (not dead) outbox events.",
                s.pending as f64,
            );
            gauge(
                &mut out,
                "outboxd_outbox_oldest_pending_age_seconds",
                "Age of the oldest pending event: the alert that matters.",
                s.oldest_pending_age_seconds,
            );
            gauge(
                &mut out,
                "outboxd_outbox_failing",
                "Pending events with 5 or more failed attempts.",
                s.failing as f64,
            );
            gauge(
                &mut out,
                "outboxd_outbox_dead",
                "Dead events waiting for redrive or discard.",
                s.dead as f64,
            );
            gauge(
                &mut out,
                "outboxd_outbox_blocked_aggregates",
                "Aggregates whose oldest unpublished event is dead.",
                s.blocked_aggregates as f64,
            );
        }
        counter(
            &mut out,
            "outboxd_relay_batches_total",
            "Batches the relay claimed and settled.",
            self.relay_batches.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "outboxd_relay_published_total",
            "Events acknowledged by the broker and marked.",
            self.relay_published.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "outboxd_relay_dead_total",
            "Events moved to the dead state.",
            self.relay_dead.load(Ordering::Relaxed),
        );
        let _ = writeln!(
            out,
            "# HELP outboxd_relay_publish_failures_total Failed publishes by reason."
        );
        let _ = writeln!(out, "# TYPE outboxd_relay_publish_failures_total counter");
        for (reason, n) in self.relay_failures.snapshot() {
            let _ = writeln!(
                out,
                "outboxd_relay_publish_failures_total{{reason=\"{}\"}} {n}",
                escape(&reason)
            );
        }
        let _ = writeln!(
            out,
            "# HELP outboxd_relay_lag_seconds From commit to broker acknowledgement."
        );
        let _ = writeln!(out, "# TYPE outboxd_relay_lag_seconds histogram");
        self.relay_lag
            .render(&mut out, "outboxd_relay_lag_seconds", "");
        self.wal.render(&mut out);

        let consumers = self.consumers();
        for (name, help, pick) in [
            (
                "outboxd_consumer_processed_total",
                "Messages whose effect committed.",
                0,
            ),
            (
                "outboxd_consumer_duplicates_total",
                "Redelivered messages dropped by the inbox.",
                1,
            ),
            (
                "outboxd_consumer_failed_total",
                "Handler failures (rolled back, redelivered).",
                2,
            ),
            (
                "outboxd_consumer_dead_lettered_total",
                "Messages moved to a dead-letter record.",
                3,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            for (c, m) in &consumers {
                let v = [&m.processed, &m.duplicates, &m.failed, &m.dead_lettered][pick]
                    .load(Ordering::Relaxed);
                let _ = writeln!(out, "{name}{{consumer=\"{}\"}} {v}", escape(c));
            }
        }
        let _ = writeln!(
            out,
            "# HELP outboxd_consumer_lag_seconds From the event's commit to the consumer's commit."
        );
        let _ = writeln!(out, "# TYPE outboxd_consumer_lag_seconds histogram");
        for (c, m) in &consumers {
            m.lag.render(
                &mut out,
                "outboxd_consumer_lag_seconds",
                &format!("consumer=\"{}\"", escape(c)),
            );
        }
        ParkingMetrics::render(&mut out, &consumers);
        render_liveness(&mut out, &consumers);
        render_plugins(&mut out, &self.plugins());
        let _ = writeln!(
            out,
            "# HELP outboxd_reconcile_missing Business rows without their event at the last reconciliation."
        );
        let _ = writeln!(out, "# TYPE outboxd_reconcile_missing gauge");
        for (rule, n) in self
            .reconcile_missing
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default()
        {
            let _ = writeln!(
                out,
                "outboxd_reconcile_missing{{rule=\"{}\"}} {n}",
                escape(&rule)
            );
        }
        let _ = writeln!(
            out,
            "# HELP outboxd_retention_deleted_total Rows removed by retention, by table."
        );
        let _ = writeln!(out, "# TYPE outboxd_retention_deleted_total counter");
        for (table, n) in self.retention_deleted.snapshot() {
            let _ = writeln!(
                out,
                "outboxd_retention_deleted_total{{table=\"{}\"}} {n}",
                escape(&table)
            );
        }
        self.render_wal_retained(&mut out);
        out
    }

    fn render_wal_retained(&self, out: &mut String) {
        let slot = self.relay_wal_slot.lock().ok().and_then(|s| s.clone());
        if let Some(slot) = slot {
            let name = "outboxd_relay_wal_retained_bytes";
            let _ = writeln!(
                out,
                "# HELP {name} WAL the relay's replication slot keeps on the server (pg_current_wal_lsn() - restart_lsn), sampled by the admin sampler.\n# TYPE {name} gauge\n{name}{{slot=\"{}\"}} {}",
                escape(&slot),
                self.relay_wal_retained_bytes.load(Ordering::Relaxed)
            );
        }
    }
}

fn render_liveness(out: &mut String, consumers: &[(String, std::sync::Arc<ConsumerMetrics>)]) {
    let name = "outboxd_consumer_recoveries_total";
    let _ = writeln!(
        out,
        "# HELP {name} Kafka group rejoins (a new client) because the group had lag and made no progress, by reason.\n# TYPE {name} counter"
    );
    for (c, m) in consumers {
        for (reason, n) in m.recoveries.snapshot() {
            let _ = writeln!(
                out,
                "{name}{{consumer=\"{}\",reason=\"{}\"}} {n}",
                escape(c),
                escape(&reason)
            );
        }
    }
    let name = "outboxd_consumer_stalled_partitions";
    let _ = writeln!(
        out,
        "# HELP {name} Partitions with lag and no progress for the stall time, as the Kafka group member last saw them.\n# TYPE {name} gauge"
    );
    for (c, m) in consumers {
        let v = m.stalled_partitions.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}{{consumer=\"{}\"}} {v}", escape(c));
    }
}

fn render_plugins(out: &mut String, plugins: &[std::sync::Arc<dyn PluginReport>]) {
    let labels = |p: &std::sync::Arc<dyn PluginReport>| {
        format!(
            "plugin=\"{}\",version=\"{}\"",
            escape(p.name()),
            escape(p.version())
        )
    };
    let _ = writeln!(
        out,
        "# HELP outboxd_plugin_calls_total Plugin calls per plugin version.\n# TYPE outboxd_plugin_calls_total counter"
    );
    for p in plugins {
        let _ = writeln!(
            out,
            "outboxd_plugin_calls_total{{{}}} {}",
            labels(p),
            p.counters().calls
        );
    }
    let _ = writeln!(
        out,
        "# HELP outboxd_plugin_errors_total Plugin failures by kind.\n# TYPE outboxd_plugin_errors_total counter"
    );
    for p in plugins {
        for (kind, n) in p.counters().errors {
            let _ = writeln!(
                out,
                "outboxd_plugin_errors_total{{{},kind=\"{kind}\"}} {n}",
                labels(p)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP outboxd_plugin_call_seconds Plugin call latency.\n# TYPE outboxd_plugin_call_seconds histogram"
    );
    for p in plugins {
        p.latency()
            .render(out, "outboxd_plugin_call_seconds", &labels(p));
    }
    let _ = writeln!(
        out,
        "# HELP outboxd_plugin_memory_high_water_bytes Most linear memory one instance held.\n# TYPE outboxd_plugin_memory_high_water_bytes gauge"
    );
    for p in plugins {
        let _ = writeln!(
            out,
            "outboxd_plugin_memory_high_water_bytes{{{}}} {}",
            labels(p),
            p.counters().memory_high_water
        );
    }
    render_http(out, plugins);
}

fn gauge(out: &mut String, name: &str, help: &str, v: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_interpolates_within_its_bucket_and_caps_at_the_largest_bound() {
        let h = Histogram::with_buckets(&CALL_BUCKETS);
        assert_eq!(h.quantile(0.99), None, "no observation, no quantile");
        // 100 calls of 3 µs (first bucket, 0 to 10 µs): the p50 is the
        // middle of that bucket.
        for _ in 0..100 {
            h.observe(0.000003);
        }
        let p50 = h.quantile(0.5).expect("observed");
        assert!((p50 - 0.000005).abs() < 1e-12, "p50 {p50}");
        // One call in ten over the largest bound: the p99 is that bound,
        // as Prometheus reports it.
        for _ in 0..12 {
            h.observe(3.0);
        }
        assert_eq!(h.quantile(0.99), Some(0.1));
        // The p80 falls in the first bucket still (100 of 112).
        assert!(h.quantile(0.8).expect("observed") <= 0.00001);
    }

    #[test]
    fn wal_retained_bytes_appear_once_sampled_with_their_slot() {
        let m = Metrics::default();
        assert!(
            !m.render(None).contains("outboxd_relay_wal_retained_bytes"),
            "a process that never sampled a slot (polling) exports no gauge"
        );
        m.set_wal_retained("orders_slot", 123_456);
        let text = m.render(None);
        assert!(
            text.contains("# TYPE outboxd_relay_wal_retained_bytes gauge\n"),
            "{text}"
        );
        assert!(
            text.contains("outboxd_relay_wal_retained_bytes{slot=\"orders_slot\"} 123456\n"),
            "{text}"
        );
    }
}
