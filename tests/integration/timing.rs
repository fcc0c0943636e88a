//! Relay timing under paused tokio time: backoff and the loop's idle sleep,
//! wake-up and shutdown. The store is in memory here, so no database I/O
//! races the paused clock; the SQL side of backoff is in `backoff.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outboxd::clock::TokioClock;
use outboxd::event::{EventId, OutboxEvent};
use outboxd::relay::worker::{self, WorkerConfig};
use outboxd::relay::{Backoff, Relay, RelayConfig, Router, StepOutcome, StepReport};
use outboxd::store::{BatchOutcome, ClaimedBatch, OutboxStats, OutboxStore, StoreError};

use crate::support::ScriptedPublisher;

#[derive(Clone)]
struct Row {
    ev: OutboxEvent,
    published: bool,
    dead: bool,
    due: DateTime<Utc>,
}

#[derive(Clone, Default)]
struct MemStore {
    rows: Arc<Mutex<Vec<Row>>>,
    claims: Arc<AtomicUsize>,
}

impl MemStore {
    fn push(&self, aggregate: &str, now: DateTime<Utc>) {
        let mut rows = self.rows.lock().expect("lock");
        let seq = rows.len() as i64 + 1;
        rows.push(Row {
            ev: OutboxEvent {
                seq,
                id: EventId(uuid::Uuid::new_v4()),
                aggregate_id: aggregate.into(),
                event_type: "t".into(),
                payload: "{}".into(),
                headers: Default::default(),
                created_at: now,
                attempts: 0,
                redrive_with: None,
            },
            published: false,
            dead: false,
            due: now,
        });
    }
}

struct MemBatch {
    store: MemStore,
    events: Vec<OutboxEvent>,
}

impl ClaimedBatch for MemBatch {
    fn events(&self) -> &[OutboxEvent] {
        &self.events
    }
    async fn complete(self, outcome: BatchOutcome, _now: DateTime<Utc>) -> Result<(), StoreError> {
        let mut rows = self.store.rows.lock().expect("lock");
        for r in rows.iter_mut() {
            if outcome.published.contains(&r.ev.seq) {
                r.published = true;
            }
            if let Some(f) = outcome.failed.iter().find(|f| f.seq == r.ev.seq) {
                r.ev.attempts += 1;
                r.due = f.retry_at;
                r.dead = f.dead;
            }
        }
        Ok(())
    }
}

impl OutboxStore for MemStore {
    type Batch = MemBatch;
    async fn claim(&self, limit: usize, now: DateTime<Utc>) -> Result<MemBatch, StoreError> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        let rows = self.rows.lock().expect("lock");
        let mut seen = std::collections::HashSet::new();
        let mut events = Vec::new();
        for r in rows.iter().filter(|r| !r.published) {
            // Only the oldest unpublished event of each aggregate is eligible.
            if !seen.insert(r.ev.aggregate_id.clone()) {
                continue;
            }
            if !r.dead && r.due <= now && events.len() < limit {
                events.push(r.ev.clone());
            }
        }
        Ok(MemBatch {
            store: self.clone(),
            events,
        })
    }
    async fn stats(&self, _now: DateTime<Utc>) -> Result<OutboxStats, StoreError> {
        Ok(OutboxStats::default())
    }
}

fn retried(n: usize) -> StepOutcome {
    StepOutcome::Published(StepReport {
        published: 0,
        retried: n,
        dead: 0,
        filtered: 0,
    })
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn backoff_follows_the_schedule_in_paused_time() {
    let clock = Arc::new(TokioClock::starting_now());
    let store = MemStore::default();
    store.push("a", outboxd::clock::Clock::now(clock.as_ref()));
    let broker = ScriptedPublisher::failing();
    let config = RelayConfig {
        max_attempts: 10,
        backoff: Backoff {
            base_seconds: 1.0,
            max_seconds: 300.0,
        },
        ..RelayConfig::default()
    };
    let relay = Relay::new(
        store.clone(),
        broker.clone(),
        Router::default(),
        config,
        clock,
    );
    // Delays after each failure: 1, 2, 4, 8, 16 s.
    for delay in [1u64, 2, 4, 8, 16] {
        assert_eq!(relay.step().await.expect("step"), retried(1));
        tokio::time::advance(Duration::from_millis(delay * 1000 - 1)).await;
        assert_eq!(
            relay.step().await.expect("step"),
            StepOutcome::Idle,
            "not due 1 ms before {delay} s"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    broker.set_failing(false);
    assert_eq!(
        relay.step().await.expect("step"),
        StepOutcome::Published(StepReport {
            published: 1,
            retried: 0,
            dead: 0,
            filtered: 0
        })
    );
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn idle_loop_sleeps_the_poll_interval_wakes_early_and_drains_on_shutdown() {
    let clock = Arc::new(TokioClock::starting_now());
    let store = MemStore::default();
    let broker = ScriptedPublisher::new();
    let relay = Relay::new(
        store.clone(),
        broker.clone(),
        Router::default(),
        RelayConfig::default(),
        clock.clone(),
    );
    let (wake_tx, wake_rx) = tokio::sync::watch::channel(0u64);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let cfg = WorkerConfig {
        poll_interval: Duration::from_millis(500),
        ..WorkerConfig::default()
    };
    let handle =
        tokio::spawn(async move { worker::run(&relay, &cfg, Some(wake_rx), stop_rx).await });

    settle().await;
    assert_eq!(
        store.claims.load(Ordering::SeqCst),
        1,
        "one idle claim, then sleep"
    );
    tokio::time::advance(Duration::from_millis(499)).await;
    settle().await;
    assert_eq!(
        store.claims.load(Ordering::SeqCst),
        1,
        "still asleep at 499 ms"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(
        store.claims.load(Ordering::SeqCst),
        2,
        "polls again at 500 ms"
    );

    // A notification wakes it at once, with no time passing.
    store.push("a", outboxd::clock::Clock::now(clock.as_ref()));
    wake_tx.send_modify(|v| *v += 1);
    settle().await;
    assert_eq!(broker.sent().len(), 1, "published right after the wake-up");

    stop_tx.send(true).expect("stop");
    settle().await;
    assert!(handle.is_finished(), "the loop returns on shutdown");
    handle.await.expect("join").expect("clean exit");
}
