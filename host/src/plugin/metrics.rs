//! Per-plugin counters: calls, errors by kind, time spent, instantiations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use super::error::ErrorKind;

#[derive(Debug)]
pub struct PluginMetrics {
    calls: AtomicU64,
    errors: [AtomicU64; ErrorKind::ALL.len()],
    nanos: AtomicU64,
    instantiations: AtomicU64,
    latency: crate::metrics::Histogram,
    memory_high_water: AtomicU64,
}

impl Default for PluginMetrics {
    fn default() -> Self {
        Self {
            calls: AtomicU64::new(0),
            errors: std::array::from_fn(|_| AtomicU64::new(0)),
            nanos: AtomicU64::new(0),
            instantiations: AtomicU64::new(0),
            latency: crate::metrics::Histogram::with_buckets(&crate::metrics::CALL_BUCKETS),
            memory_high_water: AtomicU64::new(0),
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
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.latency.observe(elapsed.as_secs_f64());
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
        self.errors[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Remembers the memory an instance holds, keeping the largest.
    pub(crate) fn memory_used(&self, bytes: u64) {
        self.memory_high_water.fetch_max(bytes, Ordering::Relaxed);
    }

    pub fn memory_high_water(&self) -> u64 {
        self.memory_high_water.load(Ordering::Relaxed)
    }

    pub fn latency(&self) -> &crate::metrics::Histogram {
        &self.latency
    }

    pub(crate) fn instantiated(&self) {
        self.instantiations.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            calls: self.calls.load(Ordering::Relaxed),
            errors: ErrorKind::ALL
                .iter()
                .zip(&self.errors)
                .map(|(k, n)| (k.name(), n.load(Ordering::Relaxed)))
                .collect(),
            total_time: Duration::from_nanos(self.nanos.load(Ordering::Relaxed)),
            instantiations: self.instantiations.load(Ordering::Relaxed),
        }
    }
}
