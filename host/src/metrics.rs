//! `/metrics`: the process's prometheus-client registry and its encoding.
//!
//! Each subsystem owns its metrics and registers them here, under the
//! `outboxd` prefix: the relay (`relay/metrics.rs`), the WAL relay
//! (`relay/wal/metrics.rs`), consumers (`consumer/metrics.rs`, with the
//! Kafka group liveness of `broker/kafka/liveness.rs`), the plugin versions
//! this process loaded (`plugin/metrics.rs`), retention and reconciliation
//! (`ops/metrics.rs`). The outbox gauges come from the database at scrape
//! time (`store/outbox/metrics.rs`). The registry is built once; what
//! appears later (a consumer, a plugin version, a label value) is a new
//! member of a registered family.

use std::sync::Arc;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::registry::Registry;

use crate::consumer::metrics::{ConsumerMetrics, Consumers};
use crate::ops::metrics::{ReconcileMissing, RetentionDeleted};
use crate::plugin::metrics::PluginReport;
use crate::plugin::metrics::PluginVersions;
use crate::relay::metrics::{PublishFailures, RelayMetrics};
use crate::relay::wal::metrics::WalMetrics;
use crate::store::OutboxStats;
use crate::store::outbox::metrics::OutboxGauges;

/// What [`Metrics::render`] writes: the Prometheus text format, version
/// 0.0.4, which every scraper reads.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub relay: RelayMetrics,
    /// `relay.failures`, the same counters, where tests and tools read them.
    pub relay_failures: PublishFailures,
    /// The WAL relay (relay.source = "wal"); zero in polling mode.
    pub wal: WalMetrics,
    /// Webhook routes' requests and pauses.
    pub webhooks: crate::broker::webhook::metrics::WebhookMetrics,
    consumers: Consumers,
    plugins: PluginVersions,
    pub retention_deleted: RetentionDeleted,
    reconcile_missing: ReconcileMissing,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("outboxd");
        let relay = RelayMetrics::default();
        relay.register(&mut registry);
        let wal = WalMetrics::default();
        wal.register(&mut registry);
        let webhooks = crate::broker::webhook::metrics::WebhookMetrics::default();
        webhooks.register(&mut registry);
        let consumers = Consumers::default();
        consumers.register(&mut registry);
        let plugins = PluginVersions::default();
        plugins.register(&mut registry);
        let reconcile_missing = ReconcileMissing::default();
        reconcile_missing.register(&mut registry);
        let retention_deleted = RetentionDeleted::default();
        retention_deleted.register(&mut registry);
        Self {
            registry,
            relay_failures: relay.failures.clone(),
            relay,
            wal,
            webhooks,
            consumers,
            plugins,
            retention_deleted,
            reconcile_missing,
        }
    }
}

impl Metrics {
    /// `name`'s consumer metrics, created (at zero) the first time.
    pub fn consumer(&self, name: &str) -> Arc<ConsumerMetrics> {
        self.consumers.get(name)
    }

    /// Every consumer this process runs, with its counters, by name.
    pub fn consumers(&self) -> Vec<(String, Arc<ConsumerMetrics>)> {
        self.consumers.all()
    }

    /// Adds plugin versions to those reported; whoever loads a version
    /// registers it (the daemon at start, the rollout whenever it loads
    /// one), so a version activated later is reported too. A version
    /// registered again, or another copy of a `name@version` already
    /// registered, is ignored: one series per version.
    pub fn register_plugins(&self, plugins: impl IntoIterator<Item = Arc<dyn PluginReport>>) {
        self.plugins.report(plugins);
    }

    /// The plugin versions' families, for whoever loads versions (the
    /// rollout) to report them.
    pub fn plugin_versions(&self) -> PluginVersions {
        self.plugins.clone()
    }

    pub fn plugins(&self) -> Vec<Arc<dyn PluginReport>> {
        self.plugins.list()
    }

    /// Records a sample of the WAL relay's slot: `bytes` of WAL retained.
    pub fn set_wal_retained(&self, slot: &str, bytes: i64) {
        self.wal.set_retained(slot, bytes);
    }

    pub fn set_reconcile_missing(&self, rule: &str, missing: u64) {
        self.reconcile_missing.set(rule, missing);
    }

    /// Everything, in the Prometheus text format ([`CONTENT_TYPE`]), with
    /// the outbox gauges first when `stats` is given: the scrape reads them
    /// from the database just before (see `store/outbox/metrics.rs`).
    pub fn render(&self, stats: Option<&OutboxStats>) -> String {
        let mut out = String::with_capacity(16 * 1024);
        if let Some(stats) = stats {
            let mut scrape = Registry::with_prefix("outboxd");
            OutboxGauges(stats.clone()).register(&mut scrape);
            encode(&mut out, &scrape);
        }
        encode(&mut out, &self.registry);
        out
    }
}

fn encode(out: &mut String, registry: &Registry) {
    // Writing to a String fails only if a metric's own encoding does, and
    // none here has a way to.
    if let Err(e) = prometheus_text::encode(out, registry) {
        tracing::error!(error = %e, "encoding /metrics failed; the scrape is cut short");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::metrics::{HttpMetrics, LatencyBuckets as Histogram, PluginCounters};

    /// Every family `/metrics` has ever exported, with its type: the alert
    /// rules, the dashboard and the runbook use these names.
    const FAMILIES: &[(&str, &str)] = &[
        ("outboxd_outbox_pending", "gauge"),
        ("outboxd_outbox_oldest_pending_age_seconds", "gauge"),
        ("outboxd_outbox_failing", "gauge"),
        ("outboxd_outbox_dead", "gauge"),
        ("outboxd_outbox_blocked_aggregates", "gauge"),
        ("outboxd_relay_batches_total", "counter"),
        ("outboxd_relay_published_total", "counter"),
        ("outboxd_relay_dead_total", "counter"),
        ("outboxd_relay_publish_failures_total", "counter"),
        ("outboxd_relay_lag_seconds", "histogram"),
        ("outboxd_relay_wal_active", "gauge"),
        ("outboxd_relay_wal_lag_bytes", "gauge"),
        ("outboxd_relay_wal_fallback", "gauge"),
        ("outboxd_relay_wal_handed_aggregates", "gauge"),
        ("outboxd_relay_wal_takeovers_total", "counter"),
        ("outboxd_relay_wal_retained_bytes", "gauge"),
        ("outboxd_consumer_processed_total", "counter"),
        ("outboxd_consumer_duplicates_total", "counter"),
        ("outboxd_consumer_failed_total", "counter"),
        ("outboxd_consumer_dead_lettered_total", "counter"),
        ("outboxd_consumer_lag_seconds", "histogram"),
        ("outboxd_consumer_parked_total", "counter"),
        ("outboxd_consumer_redriven_total", "counter"),
        ("outboxd_consumer_parked_keys", "gauge"),
        ("outboxd_consumer_parked_messages", "gauge"),
        ("outboxd_consumer_oldest_parked_seconds", "gauge"),
        ("outboxd_consumer_recoveries_total", "counter"),
        ("outboxd_consumer_stalled_partitions", "gauge"),
        ("outboxd_plugin_calls_total", "counter"),
        ("outboxd_plugin_errors_total", "counter"),
        ("outboxd_plugin_call_seconds", "histogram"),
        ("outboxd_plugin_memory_high_water_bytes", "gauge"),
        ("outboxd_plugin_http_requests_total", "counter"),
        ("outboxd_plugin_http_request_seconds", "histogram"),
        ("outboxd_reconcile_missing", "gauge"),
        ("outboxd_retention_deleted_total", "counter"),
    ];

    #[derive(Debug, Default)]
    struct Plugin {
        metrics: crate::plugin::PluginMetrics,
        http: HttpMetrics,
    }

    impl PluginReport for Plugin {
        fn name(&self) -> &str {
            "p"
        }
        fn version(&self) -> &str {
            "1"
        }
        fn world(&self) -> &'static str {
            "consumer"
        }
        fn counters(&self) -> PluginCounters {
            PluginCounters::default()
        }
        fn latency(&self) -> &Histogram {
            self.metrics.latency()
        }
        fn metrics(&self) -> Option<&crate::plugin::PluginMetrics> {
            Some(&self.metrics)
        }
        fn http(&self) -> Option<&HttpMetrics> {
            Some(&self.http)
        }
    }

    #[test]
    fn every_family_keeps_its_name_and_type() {
        let m = Metrics::default();
        m.relay_failures.inc("retryable");
        let c = m.consumer("billing");
        c.recoveries.inc("stalled");
        let plugin = Plugin::default();
        plugin.http.record(
            "https://api.example",
            "2xx",
            std::time::Duration::from_millis(1),
        );
        m.register_plugins([Arc::new(plugin) as Arc<dyn PluginReport>]);
        m.set_wal_retained("slot", 1);
        m.set_reconcile_missing("rule", 1);
        m.retention_deleted.add("outbox", 1);
        let text = m.render(Some(&OutboxStats::default()));
        let typed: Vec<(&str, &str)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .collect();
        let mut want = FAMILIES.to_vec();
        let mut got = typed.clone();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{text}");
        assert!(
            text.contains("outboxd_relay_lag_seconds_bucket{le=\"1\"} 0\n"),
            "bucket bounds as before:\n{text}"
        );
        assert!(
            text.contains("outboxd_outbox_pending 0\n"),
            "integer gauges as before:\n{text}"
        );
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
        m.set_wal_retained("renamed_slot", 7);
        let text = m.render(None);
        assert!(
            !text.contains("orders_slot"),
            "only the slot sampled last:\n{text}"
        );
    }
}
