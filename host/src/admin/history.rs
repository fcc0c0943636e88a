//! A bounded ring of outbox (and consumer throughput) samples for the
//! dashboard's charts and rates.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;

use crate::store::outbox::wal_status::slot_status;
use crate::store::{AnyStore, Db, OutboxStore};

/// Kept samples; at the default 5 s interval, one hour.
pub const CAPACITY: usize = 720;

#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub at: chrono::DateTime<chrono::Utc>,
    pub pending: i64,
    pub oldest_pending_age_seconds: f64,
    pub dead: i64,
    pub published_total: u64,
    /// Messages each consumer of this process had processed, by name: the
    /// consumers panel's rates come from two samples.
    pub consumers_processed: BTreeMap<String, u64>,
}

#[derive(Debug, Default)]
pub struct History(Mutex<VecDeque<Sample>>);

impl History {
    pub fn push(&self, s: Sample) {
        if let Ok(mut q) = self.0.lock() {
            if q.len() == CAPACITY {
                q.pop_front();
            }
            q.push_back(s);
        }
    }

    /// The newest two samples, oldest first, once there are two.
    pub fn last_two(&self) -> Option<(Sample, Sample)> {
        let q = self.0.lock().ok()?;
        let n = q.len();
        (n >= 2).then(|| (q[n - 2].clone(), q[n - 1].clone()))
    }

    pub fn snapshot(&self) -> Vec<Sample> {
        self.0
            .lock()
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// The WAL relay's replication slot, sampled with the outbox when
/// `relay.source = "wal"`.
#[derive(Debug, Clone)]
pub struct SlotSampler {
    pub db: Db,
    pub slot: String,
}

impl SlotSampler {
    /// Sets `outboxd_relay_wal_retained_bytes`; a missing slot retains
    /// nothing (and is said once, in the log).
    async fn sample(&self, metrics: &crate::metrics::Metrics, said_missing: &mut bool) {
        match slot_status(&self.db, &self.slot).await {
            Ok(Some(s)) => {
                *said_missing = false;
                metrics.set_wal_retained(&s.slot, s.retained_bytes);
            }
            Ok(None) => {
                if !*said_missing {
                    tracing::warn!(slot = %self.slot,
                        "replication slot relay.wal.slot does not exist; `outboxd migrate` (or a WAL-mode `outboxd run`) creates it");
                    *said_missing = true;
                }
                metrics.set_wal_retained(&self.slot, 0);
            }
            Err(e) => {
                tracing::warn!(slot = %self.slot, error = %e, "cannot sample the replication slot")
            }
        }
    }
}

/// Samples the outbox (and the WAL relay's slot, when given) every `every`
/// until shutdown.
pub async fn run_sampler(
    store: AnyStore,
    history: std::sync::Arc<History>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    every: Duration,
    slot: Option<SlotSampler>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut said_missing = false;
    loop {
        if *shutdown.borrow() {
            return;
        }
        if let Some(slot) = &slot {
            slot.sample(&metrics, &mut said_missing).await;
        }
        let now = chrono::Utc::now();
        match store.stats(now).await {
            Ok(s) => history.push(Sample {
                at: now,
                pending: s.pending,
                oldest_pending_age_seconds: s.oldest_pending_age_seconds,
                dead: s.dead,
                published_total: metrics.relay.published.get(),
                consumers_processed: metrics
                    .consumers()
                    .into_iter()
                    .map(|(name, m)| (name, m.processed.get()))
                    .collect(),
            }),
            Err(e) => tracing::warn!(error = %e, "cannot sample outbox stats for the dashboard"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample whose `pending` is its position in the push order, so the
    /// snapshot shows which samples survived.
    fn sample(n: usize) -> Sample {
        Sample {
            at: chrono::DateTime::UNIX_EPOCH + chrono::Duration::seconds(n as i64),
            pending: n as i64,
            oldest_pending_age_seconds: 0.0,
            dead: 0,
            published_total: n as u64,
            consumers_processed: BTreeMap::new(),
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_capacity_samples() {
        let history = History::default();
        for n in 0..CAPACITY {
            history.push(sample(n));
        }
        // Full but not yet over: nothing may have been dropped so far.
        let full = history.snapshot();
        assert_eq!(full.len(), CAPACITY);
        assert_eq!(full[0].pending, 0);

        for n in CAPACITY..CAPACITY + 5 {
            history.push(sample(n));
        }
        let kept = history.snapshot();
        assert_eq!(kept.len(), CAPACITY, "the ring grew past its capacity");
        let order: Vec<i64> = kept.iter().map(|s| s.pending).collect();
        let want: Vec<i64> = (5..CAPACITY as i64 + 5).collect();
        assert_eq!(
            order, want,
            "the five oldest samples go first and the rest keep their order"
        );
    }
}
