//! The broker outage of `outboxd bench drain` and what it samples while the
//! backlog builds: a publisher wrapper that fails every publish as
//! retryable while the window is open (what the relay sees when a broker
//! is unavailable), and the outbox table's size and pending rows.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::BenchError;
use outboxd::broker::PublishError;
use outboxd::broker::Publisher;
use outboxd::message::OutgoingMessage;

/// Publishes through `inner`, except while the outage is on: then every
/// publish fails at once with a retryable "broker unavailable" error.
pub(crate) struct OutagePublisher<P> {
    inner: P,
    down: AtomicBool,
    failed: AtomicU64,
    origin: Instant,
    /// When the window closed, ms since `origin` + 1 (0: never closed).
    up_at: AtomicU64,
    /// The first acknowledged publish after the window closed, likewise.
    first_ack: AtomicU64,
}

impl<P: Publisher> OutagePublisher<P> {
    pub fn new(inner: P) -> Self {
        Self {
            inner,
            down: AtomicBool::new(false),
            failed: AtomicU64::new(0),
            origin: Instant::now(),
            up_at: AtomicU64::new(0),
            first_ack: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64 + 1
    }

    /// Opens the window: the broker is unavailable from now on.
    pub fn go_down(&self) {
        self.down.store(true, Ordering::SeqCst);
    }

    /// Closes the window; the next acknowledged publish is noted.
    pub fn come_up(&self) {
        self.first_ack.store(0, Ordering::SeqCst);
        self.up_at.store(self.now_ms(), Ordering::SeqCst);
        self.down.store(false, Ordering::SeqCst);
    }

    /// Publishes refused during the window (relay attempts, not events).
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Seconds from the end of the window to the first acknowledged publish.
    pub fn first_ack_after_up(&self) -> Option<f64> {
        let (up, ack) = (
            self.up_at.load(Ordering::SeqCst),
            self.first_ack.load(Ordering::SeqCst),
        );
        (up > 0 && ack >= up).then(|| (ack - up) as f64 / 1000.0)
    }
}

impl<P: Publisher> Publisher for OutagePublisher<P> {
    async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        if self.down.load(Ordering::SeqCst) {
            self.failed.fetch_add(1, Ordering::Relaxed);
            return Err(PublishError::Retryable(
                "broker unavailable (bench drain outage window)".into(),
            ));
        }
        self.inner.publish(msg).await?;
        if self.up_at.load(Ordering::Relaxed) > 0 && self.first_ack.load(Ordering::Relaxed) == 0 {
            let _ = self.first_ack.compare_exchange(
                0,
                self.now_ms(),
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
        Ok(())
    }
}

/// The outbox on disk and in memory, sampled during the outage.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct TableSample {
    /// `pg_total_relation_size('outbox')`: heap, indexes and TOAST.
    pub outbox_bytes: i64,
    /// Rows not yet published.
    pub pending: i64,
    /// This process's resident set (`VmRSS`), KiB.
    pub rss_kib: u64,
}

impl TableSample {
    pub async fn take(pool: &PgPool) -> Result<Self, BenchError> {
        let (outbox_bytes, pending): (i64, i64) = sqlx::query_as(
            "SELECT pg_total_relation_size('outbox'),
                    (SELECT count(*) FROM outbox WHERE published_at IS NULL)",
        )
        .fetch_one(pool)
        .await?;
        Ok(Self {
            outbox_bytes,
            pending,
            rss_kib: super::proc_status_kib(None, "VmRSS").unwrap_or(0),
        })
    }
}

/// Samples taken every `period` while a phase runs: first, last and the
/// highest of each figure.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Samples {
    pub first: TableSample,
    pub last: TableSample,
    pub max_outbox_bytes: i64,
    pub max_pending: i64,
    pub max_rss_kib: u64,
    pub count: usize,
}

impl Samples {
    pub fn add(&mut self, s: TableSample) {
        if self.count == 0 {
            self.first = s;
        }
        self.last = s;
        self.max_outbox_bytes = self.max_outbox_bytes.max(s.outbox_bytes);
        self.max_pending = self.max_pending.max(s.pending);
        self.max_rss_kib = self.max_rss_kib.max(s.rss_kib);
        self.count += 1;
    }

    /// Pending rows the outbox gained per MiB it grew, first to last.
    pub fn rows_per_mib(&self) -> f64 {
        let mib = (self.last.outbox_bytes - self.first.outbox_bytes) as f64 / MIB;
        let rows = (self.last.pending - self.first.pending) as f64;
        if mib > 0.0 { rows / mib } else { f64::NAN }
    }
}

pub(crate) const MIB: f64 = 1024.0 * 1024.0;

/// How often the table and RSS are sampled.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;
    use outboxd::broker::NullPublisher;

    fn msg() -> OutgoingMessage {
        OutgoingMessage {
            topic: "t".into(),
            key: b"k".to_vec(),
            payload: b"{}".to_vec(),
            headers: Vec::new(),
            message_id: uuid::Uuid::new_v4(),
            created_at: chrono::Utc::now(),
        }
    }

    #[tokio::test]
    async fn refuses_as_retryable_in_the_window_and_notes_the_first_ack_after() {
        let p = OutagePublisher::new(NullPublisher);
        assert!(p.publish(msg()).await.is_ok());
        assert_eq!(p.first_ack_after_up(), None, "no window closed yet");
        p.go_down();
        let err = p.publish(msg()).await.expect_err("the broker is down");
        assert!(!err.is_permanent(), "an outage must be retried: {err}");
        assert_eq!(p.failed(), 1);
        p.come_up();
        assert_eq!(p.first_ack_after_up(), None, "nothing acknowledged yet");
        assert!(p.publish(msg()).await.is_ok());
        assert!(p.first_ack_after_up().is_some_and(|s| s < 1.0));
    }
}
