//! The scheduled jobs' metrics: rows retention removed, by table
//! (`outboxd_retention_deleted_total`), and business rows without their
//! event at the last reconciliation, by rule (`outboxd_reconcile_missing`).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TableLabel {
    table: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RuleLabel {
    rule: String,
}

/// Rows removed by retention, by table; a table appears with its first
/// run.
#[derive(Debug, Clone, Default)]
pub struct RetentionDeleted(Family<TableLabel, Counter>);

impl RetentionDeleted {
    /// Registers `outboxd_retention_deleted_total` into `registry` (prefix
    /// `outboxd`).
    pub fn register(&self, registry: &mut Registry) {
        registry.sub_registry_with_prefix("retention").register(
            "deleted",
            "Rows removed by retention, by table",
            self.0.clone(),
        );
    }

    pub fn add(&self, table: &str, n: u64) {
        self.0
            .get_or_create(&TableLabel {
                table: table.to_string(),
            })
            .inc_by(n);
    }

    pub fn get(&self, table: &str) -> u64 {
        self.0
            .get(&TableLabel {
                table: table.to_string(),
            })
            .map(|c| c.get())
            .unwrap_or(0)
    }
}

/// Business rows missing their event, per reconciliation rule, as the last
/// run of each rule found them.
#[derive(Debug, Clone, Default)]
pub struct ReconcileMissing(Family<RuleLabel, Gauge<u64, AtomicU64>>);

impl ReconcileMissing {
    /// Registers `outboxd_reconcile_missing` into `registry` (prefix
    /// `outboxd`).
    pub fn register(&self, registry: &mut Registry) {
        registry.sub_registry_with_prefix("reconcile").register(
            "missing",
            "Business rows without their event at the last reconciliation",
            self.0.clone(),
        );
    }

    pub fn set(&self, rule: &str, missing: u64) {
        self.0
            .get_or_create(&RuleLabel {
                rule: rule.to_string(),
            })
            .set(missing);
    }
}
