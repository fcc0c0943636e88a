//! What the WAL relay reports of its slot and its hand-offs
//! (`outboxd_relay_wal_*`); all zero in polling mode, and the retained
//! bytes only once the admin sampler has read the slot.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Default)]
pub struct WalMetrics {
    /// 1 while this process reads the slot.
    pub active: Gauge<u64, AtomicU64>,
    /// Server WAL end minus the confirmed flush position, as the stream
    /// reports it.
    pub lag_bytes: Gauge<u64, AtomicU64>,
    /// 1 once this process fell back to polling (relay.wal.max_lag_bytes).
    pub fallback: Gauge<u64, AtomicU64>,
    /// Aggregates handed to polling (a failed or dead event, or rows the
    /// slot does not replay).
    pub handed_aggregates: Gauge<u64, AtomicU64>,
    /// Times this process became the slot's reader.
    pub takeovers: Counter,
    /// WAL the slot keeps on the server (`pg_current_wal_lsn() -
    /// restart_lsn`), as the admin sampler last read it: one slot, none
    /// before the first sample (polling processes have no slot).
    retained: Family<SlotLabel, Gauge>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SlotLabel {
    slot: String,
}

impl WalMetrics {
    /// Registers `outboxd_relay_wal_*` into `registry` (prefix `outboxd`).
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("relay_wal");
        r.register(
            "active",
            "1 while this process reads the replication slot (relay.source = \"wal\")",
            self.active.clone(),
        );
        r.register(
            "lag_bytes",
            "Server WAL end minus the slot's confirmed flush position, as the stream reports it",
            self.lag_bytes.clone(),
        );
        r.register(
            "fallback",
            "1 once this process fell back from the WAL to polling (relay.wal.max_lag_bytes)",
            self.fallback.clone(),
        );
        r.register(
            "handed_aggregates",
            "Aggregates the WAL relay handed to polling (failed or dead events, rows the slot does not replay)",
            self.handed_aggregates.clone(),
        );
        r.register(
            "takeovers",
            "Times this process became the reader of the replication slot",
            self.takeovers.clone(),
        );
        r.register(
            "retained_bytes",
            "WAL the relay's replication slot keeps on the server (pg_current_wal_lsn() - restart_lsn), sampled by the admin sampler",
            self.retained.clone(),
        );
    }

    /// Records a sample of the slot: `bytes` of WAL retained.
    pub fn set_retained(&self, slot: &str, bytes: i64) {
        let label = SlotLabel {
            slot: slot.to_string(),
        };
        if self.retained.get(&label).is_none() {
            // Another slot's value would be stale: one series, the slot
            // sampled last.
            self.retained.clear();
        }
        self.retained.get_or_create(&label).set(bytes);
    }
}
