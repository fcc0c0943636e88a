//! Plugin versions' metrics: each loaded version's calls, errors by kind,
//! time spent, instantiations, call latency, memory high water and
//! outbound HTTP, and the `outboxd_plugin_*` families that report every
//! version this process loaded, by `{plugin, version}`.
//!
//! A version owns its metrics from the moment it loads, whether or not
//! anything reports it (`outboxd plugin test`, the bench and many tests
//! load plugins with no registry), and loading happens far from the
//! process's `Metrics` registry. prometheus-client's
//! `Family` creates its members itself and cannot adopt a version's
//! existing counters, so the families here are a collector over the
//! reported versions ([`PluginVersions`]): at each scrape it encodes every
//! version's own prometheus-client counters, histograms and gauges under
//! that version's label set. The hot path (a call) touches only its own
//! version's metrics, never a shared map.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde::Serialize;

use super::error::ErrorKind;

/// Bucket bounds in seconds of plugins' outbound HTTP latency.
const LAG_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0,
];

/// Bucket bounds in seconds for plugin call latency.
pub const CALL_BUCKETS: [f64; 10] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.005, 0.025, 0.1,
];

/// A version's counters; [`PluginVersions`] exports them.
#[derive(Debug)]
pub struct PluginMetrics {
    calls: Counter,
    /// By [`ErrorKind::ALL`]'s order.
    errors: [Counter; ErrorKind::ALL.len()],
    nanos: AtomicU64,
    instantiations: AtomicU64,
    /// What `/metrics` shows (`outboxd_plugin_call_seconds`).
    seconds: Histogram,
    /// The same observations, for the p99 the admin API shows:
    /// prometheus-client keeps its buckets to itself.
    latency: LatencyBuckets,
    memory_high_water: Gauge<u64, AtomicU64>,
}

impl Default for PluginMetrics {
    fn default() -> Self {
        Self {
            calls: Counter::default(),
            errors: std::array::from_fn(|_| Counter::default()),
            nanos: AtomicU64::new(0),
            instantiations: AtomicU64::new(0),
            seconds: Histogram::new(CALL_BUCKETS),
            latency: LatencyBuckets::with_buckets(&CALL_BUCKETS),
            memory_high_water: Gauge::default(),
        }
    }
}

/// A point-in-time copy of [`PluginMetrics`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MetricsSnapshot {
    pub calls: u64,
    pub errors: Vec<(&'static str, u64)>,
    pub total_time: Duration,
    pub instantiations: u64,
}

impl MetricsSnapshot {
    pub fn errors_of(&self, kind: ErrorKind) -> u64 {
        self.errors
            .iter()
            .find(|(k, _)| *k == kind.name())
            .map(|(_, n)| *n)
            .unwrap_or(0)
    }
}

impl PluginMetrics {
    pub(crate) fn record(&self, elapsed: Duration, error: Option<ErrorKind>) {
        self.calls.inc();
        let seconds = elapsed.as_secs_f64();
        self.seconds.observe(seconds);
        self.latency.observe(seconds);
        self.nanos
            .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
        if let Some(kind) = error {
            self.error(kind);
        }
    }

    /// Counts an error the host found after a call had returned (a topic
    /// the route does not allow).
    pub(crate) fn error(&self, kind: ErrorKind) {
        let i = ErrorKind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
        self.errors[i].inc();
    }

    /// Remembers the memory an instance holds, keeping the largest.
    pub(crate) fn memory_used(&self, bytes: u64) {
        self.memory_high_water
            .inner()
            .fetch_max(bytes, Ordering::Relaxed);
    }

    pub fn memory_high_water(&self) -> u64 {
        self.memory_high_water.get()
    }

    pub fn latency(&self) -> &LatencyBuckets {
        &self.latency
    }

    pub(crate) fn instantiated(&self) {
        self.instantiations.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            calls: self.calls.get(),
            errors: ErrorKind::ALL
                .iter()
                .zip(&self.errors)
                .map(|(k, n)| (k.name(), n.get()))
                .collect(),
            total_time: Duration::from_nanos(self.nanos.load(Ordering::Relaxed)),
            instantiations: self.instantiations.load(Ordering::Relaxed),
        }
    }
}

/// Bucket counts of observed latencies, for a quantile estimate
/// (`/api/plugins`' p99); `/metrics` gets its histogram from
/// prometheus-client.
#[derive(Debug)]
pub struct LatencyBuckets {
    bounds: &'static [f64],
    /// One more than `bounds`: the last counts what fell beyond them.
    counts: Vec<AtomicU64>,
}

impl LatencyBuckets {
    pub fn with_buckets(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub fn observe(&self, seconds: f64) {
        let idx = self
            .bounds
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[idx].fetch_add(1, Ordering::Relaxed);
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

/// One plugin version's outbound HTTP: requests by listed host and outcome
/// (`2xx`..`5xx`, `error`, `refused`), latency by host. The host label is
/// an `allowed_outbound_hosts` entry or `unlisted`, never a name the
/// plugin chose, so a plugin cannot grow the label set.
#[derive(Debug, Default)]
pub struct HttpMetrics {
    requests: Mutex<BTreeMap<(String, &'static str), Counter>>,
    seconds: Mutex<BTreeMap<String, Histogram>>,
}

impl HttpMetrics {
    pub fn record(&self, host: &str, outcome: &'static str, took: Duration) {
        let requests = self
            .requests
            .lock()
            .map(|mut r| r.entry((host.to_string(), outcome)).or_default().clone());
        if let Ok(counter) = requests {
            counter.inc();
        }
        let seconds = self.seconds.lock().map(|mut s| {
            s.entry(host.to_string())
                .or_insert_with(|| Histogram::new(LAG_BUCKETS))
                .clone()
        });
        if let Ok(histogram) = seconds {
            histogram.observe(took.as_secs_f64());
        }
    }

    /// `(host, outcome, count)`, sorted.
    pub fn requests(&self) -> Vec<(String, &'static str, u64)> {
        self.requests
            .lock()
            .map(|r| {
                r.iter()
                    .map(|((h, o), n)| (h.clone(), *o, n.get()))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn request_counters(&self) -> Vec<(String, &'static str, Counter)> {
        self.requests
            .lock()
            .map(|r| {
                r.iter()
                    .map(|((h, o), n)| (h.clone(), *o, n.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn latencies(&self) -> Vec<(String, Histogram)> {
        self.seconds
            .lock()
            .map(|s| s.iter().map(|(h, v)| (h.clone(), v.clone())).collect())
            .unwrap_or_default()
    }
}

/// What `/metrics` and the admin API show of one loaded plugin version.
/// The plugin host implements it; the admin API's tests fake it.
pub trait PluginReport: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &str;
    fn version(&self) -> &str;
    /// `transformer` or `consumer`.
    fn world(&self) -> &'static str;
    fn counters(&self) -> PluginCounters;
    fn latency(&self) -> &LatencyBuckets;
    /// The metrics `/metrics` encodes; a report without them is listed
    /// by the admin API only.
    fn metrics(&self) -> Option<&PluginMetrics> {
        None
    }
    /// A consumer plugin's outbound HTTP requests.
    fn http(&self) -> Option<&HttpMetrics> {
        None
    }
}

/// A point-in-time copy of one plugin version's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginCounters {
    pub calls: u64,
    /// Failures by kind.
    pub errors: Vec<(&'static str, u64)>,
    pub total_time: Duration,
    /// The most linear memory one instance held, in bytes.
    pub memory_high_water: u64,
}

/// The plugin versions this process reports, in the order they were
/// reported; a collector of the `outboxd_plugin_*` families. Whoever loads
/// a version reports it (the daemon at start, the rollout whenever it loads
/// one), so a version activated later is reported too.
#[derive(Debug, Clone, Default)]
pub struct PluginVersions(Arc<RwLock<Vec<Arc<dyn PluginReport>>>>);

impl PluginVersions {
    /// Adds versions to those reported. A version reported again, or
    /// another copy of a `name@version` already reported, is ignored: one
    /// series per version.
    pub fn report(&self, plugins: impl IntoIterator<Item = Arc<dyn PluginReport>>) {
        let mut v = match self.0.write() {
            Ok(v) => v,
            Err(p) => p.into_inner(),
        };
        for p in plugins {
            let known = v.iter().any(|q| {
                Arc::ptr_eq(q, &p) || (q.name() == p.name() && q.version() == p.version())
            });
            if !known {
                v.push(p);
            }
        }
    }

    pub fn list(&self) -> Vec<Arc<dyn PluginReport>> {
        match self.0.read() {
            Ok(v) => v.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Registers the `outboxd_plugin_*` families into `registry` (whose
    /// prefix is `outboxd`).
    pub fn register(&self, registry: &mut Registry) {
        registry
            .sub_registry_with_prefix("plugin")
            .register_collector(Box::new(self.clone()));
    }
}

/// A version's label set.
fn version_labels(p: &dyn PluginReport) -> [(&'static str, &str); 2] {
    [("plugin", p.name()), ("version", p.version())]
}

/// Writes one family: its descriptor, then each series `each` encodes;
/// nothing at all when no version has a series of it.
fn family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    any: bool,
    each: impl FnOnce(&mut MetricEncoder) -> std::fmt::Result,
) -> std::fmt::Result {
    if !any {
        return Ok(());
    }
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    each(&mut metric)
}

impl Collector for PluginVersions {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let all = self.list();
        let versions: Vec<(&dyn PluginReport, &PluginMetrics)> = all
            .iter()
            .filter_map(|p| Some((p.as_ref(), p.metrics()?)))
            .collect();
        let http: Vec<(&dyn PluginReport, &HttpMetrics)> = all
            .iter()
            .filter_map(|p| Some((p.as_ref(), p.http()?)))
            .collect();
        let some = !versions.is_empty();
        family(
            &mut encoder,
            "calls",
            "Plugin calls per plugin version.",
            MetricType::Counter,
            some,
            |e| {
                for (p, m) in &versions {
                    m.calls.encode(e.encode_family(&version_labels(*p))?)?;
                }
                Ok(())
            },
        )?;
        family(
            &mut encoder,
            "errors",
            "Plugin failures by kind.",
            MetricType::Counter,
            some,
            |e| {
                for (p, m) in &versions {
                    for (kind, n) in ErrorKind::ALL.iter().zip(&m.errors) {
                        let labels = (version_labels(*p), [("kind", kind.name())]);
                        n.encode(e.encode_family(&labels)?)?;
                    }
                }
                Ok(())
            },
        )?;
        family(
            &mut encoder,
            "call_seconds",
            "Plugin call latency.",
            MetricType::Histogram,
            some,
            |e| {
                for (p, m) in &versions {
                    m.seconds.encode(e.encode_family(&version_labels(*p))?)?;
                }
                Ok(())
            },
        )?;
        family(
            &mut encoder,
            "memory_high_water_bytes",
            "Most linear memory one instance held.",
            MetricType::Gauge,
            some,
            |e| {
                for (p, m) in &versions {
                    m.memory_high_water
                        .encode(e.encode_family(&version_labels(*p))?)?;
                }
                Ok(())
            },
        )?;
        let requests: Vec<_> = http
            .iter()
            .map(|(p, h)| (*p, h.request_counters()))
            .collect();
        family(
            &mut encoder,
            "http_requests",
            "Consumer plugins' outbound HTTP requests by host and outcome.",
            MetricType::Counter,
            requests.iter().any(|(_, r)| !r.is_empty()),
            |e| {
                for (p, counters) in &requests {
                    for (host, outcome, n) in counters {
                        let labels = (
                            version_labels(*p),
                            [("host", host.as_str()), ("outcome", outcome)],
                        );
                        n.encode(e.encode_family(&labels)?)?;
                    }
                }
                Ok(())
            },
        )?;
        let latencies: Vec<_> = http.iter().map(|(p, h)| (*p, h.latencies())).collect();
        family(
            &mut encoder,
            "http_request_seconds",
            "Consumer plugins' outbound HTTP request latency.",
            MetricType::Histogram,
            latencies.iter().any(|(_, l)| !l.is_empty()),
            |e| {
                for (p, hosts) in &latencies {
                    for (host, h) in hosts {
                        // The version too: two loaded versions of one
                        // plugin that call the same host are two series.
                        let labels = (version_labels(*p), [("host", host.as_str())]);
                        h.encode(e.encode_family(&labels)?)?;
                    }
                }
                Ok(())
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `/metrics` shows of `versions`: the plugins' families alone,
    /// under the process's prefix, through the library's encoder.
    fn render(versions: &[Arc<dyn PluginReport>]) -> String {
        let plugins = PluginVersions::default();
        let mut registry = Registry::with_prefix("outboxd");
        plugins.register(&mut registry);
        plugins.report(versions.iter().cloned());
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry).expect("encodes");
        out
    }

    #[test]
    fn quantile_interpolates_within_its_bucket_and_caps_at_the_largest_bound() {
        let h = LatencyBuckets::with_buckets(&CALL_BUCKETS);
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

    /// A loaded version as the plugin host reports it.
    #[derive(Debug, Default)]
    struct Version {
        name: &'static str,
        version: &'static str,
        metrics: PluginMetrics,
        http: HttpMetrics,
    }

    impl PluginReport for Version {
        fn name(&self) -> &str {
            self.name
        }
        fn version(&self) -> &str {
            self.version
        }
        fn world(&self) -> &'static str {
            "consumer"
        }
        fn counters(&self) -> PluginCounters {
            PluginCounters::default()
        }
        fn latency(&self) -> &LatencyBuckets {
            self.metrics.latency()
        }
        fn metrics(&self) -> Option<&PluginMetrics> {
            Some(&self.metrics)
        }
        fn http(&self) -> Option<&HttpMetrics> {
            Some(&self.http)
        }
    }

    /// Each sample line of an exposition: (name and labels, value).
    fn series(text: &str) -> Vec<(&str, &str)> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| l.rsplit_once(' ').expect("a sample is `series value`"))
            .collect()
    }

    #[test]
    fn two_versions_calling_one_host_are_two_series_never_one_twice() {
        let versions: Vec<Arc<Version>> = ["1", "2"]
            .into_iter()
            .map(|version| {
                let v = Version {
                    name: "notify",
                    version,
                    ..Version::default()
                };
                v.http
                    .record("https://api.example", "2xx", Duration::from_millis(3));
                v.metrics.record(Duration::from_micros(40), None);
                Arc::new(v)
            })
            .collect();
        let text = render(
            &versions
                .iter()
                .map(|v| v.clone() as Arc<dyn PluginReport>)
                .collect::<Vec<_>>(),
        );
        let all = series(&text);
        let mut seen = std::collections::BTreeSet::new();
        for (s, _) in &all {
            assert!(seen.insert(*s), "`{s}` twice:\n{text}");
        }
        let counts: Vec<(&str, &str)> = all
            .iter()
            .copied()
            .filter(|(s, _)| s.starts_with("outboxd_plugin_http_request_seconds_count{"))
            .collect();
        assert_eq!(
            counts,
            [
                (
                    "outboxd_plugin_http_request_seconds_count{plugin=\"notify\",version=\"1\",host=\"https://api.example\"}",
                    "1"
                ),
                (
                    "outboxd_plugin_http_request_seconds_count{plugin=\"notify\",version=\"2\",host=\"https://api.example\"}",
                    "1"
                ),
            ],
            "{text}"
        );
        assert!(
            text.contains(
                "outboxd_plugin_http_requests_total{plugin=\"notify\",version=\"2\",host=\"https://api.example\",outcome=\"2xx\"} 1\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_latency_sum_keeps_fractions_of_a_microsecond() {
        let v = Arc::new(Version {
            name: "fast",
            version: "1",
            ..Version::default()
        });
        // Three calls of 400 ns: integer microseconds summed them to 0.
        for _ in 0..3 {
            v.metrics.record(Duration::from_nanos(400), None);
        }
        let text = render(&[v.clone() as Arc<dyn PluginReport>]);
        let sum: f64 = series(&text)
            .into_iter()
            .find(|(s, _)| *s == "outboxd_plugin_call_seconds_sum{plugin=\"fast\",version=\"1\"}")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("no call_seconds_sum:\n{text}"));
        assert!((sum - 1.2e-6).abs() < 1e-12, "sum {sum}:\n{text}");
        assert!(
            text.contains(
                "outboxd_plugin_call_seconds_bucket{plugin=\"fast\",version=\"1\",le=\"1e-05\"} 3\n"
            ),
            "{text}"
        );
    }
}
