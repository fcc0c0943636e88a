//! Relay timing: backoff on a clock the test moves, and the loop's idle
//! sleep, wake-up and shutdown in real time. The store is in memory here, so
//! no database I/O is timed; the SQL side of backoff is in `backoff.rs`.
//!
//! The real-time checks only assert what the code guarantees whatever the
//! machine's load (a poll never comes sooner than the interval after the
//! last; an event published while the next poll is a minute away was woken),
//! with generous deadlines for what must happen at all.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use outboxd::backoff::Backoff;
use outboxd::clock::{Clock, ManualClock, SystemClock};
use outboxd::event::{EventId, OutboxEvent};
use outboxd::relay::Relay;
use outboxd::relay::RelayConfig;
use outboxd::relay::StepOutcome;
use outboxd::relay::StepReport;
use outboxd::relay::worker::{self, WorkerConfig};
use outboxd::route::Router;
use outboxd::store::{BatchOutcome, ClaimedBatch, OutboxStats, OutboxStore, StoreError};

use crate::support::{ScriptedPublisher, eventually};

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
    /// When each claim ran.
    claims: Arc<Mutex<Vec<Instant>>>,
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
        self.claims.lock().expect("lock").push(Instant::now());
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

impl MemStore {
    fn claim_times(&self) -> Vec<Instant> {
        self.claims.lock().expect("lock").clone()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn backoff_follows_the_schedule() {
    let clock = Arc::new(ManualClock::starting_now());
    let store = MemStore::default();
    store.push("a", clock.now());
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
        clock.clone(),
    );
    // Delays after each failure: 1, 2, 4, 8, 16 s.
    for delay in [1u64, 2, 4, 8, 16] {
        assert_eq!(relay.step().await.expect("step"), retried(1));
        clock.advance(Duration::from_millis(delay * 1000 - 1));
        assert_eq!(
            relay.step().await.expect("step"),
            StepOutcome::Idle,
            "not due 1 ms before {delay} s"
        );
        clock.advance(Duration::from_millis(1));
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

#[tokio::test(flavor = "current_thread")]
async fn an_idle_loop_polls_once_per_poll_interval() {
    let store = MemStore::default();
    let relay = Relay::new(
        store.clone(),
        ScriptedPublisher::new(),
        Router::default(),
        RelayConfig::default(),
        Arc::new(SystemClock),
    );
    let (_wake_tx, wake_rx) = tokio::sync::watch::channel(0u64);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let interval = Duration::from_millis(200);
    let cfg = WorkerConfig {
        poll_interval: interval,
        ..WorkerConfig::default()
    };
    let handle =
        tokio::spawn(async move { worker::run(&relay, &cfg, Some(wake_rx), stop_rx).await });

    eventually(
        Duration::from_secs(20),
        "an idle loop keeps polling",
        async || {
            let claims = store.claim_times().len();
            if claims >= 4 {
                Ok(())
            } else {
                Err(format!("{claims} claims"))
            }
        },
    )
    .await;
    stop_tx.send(true).expect("stop");
    tokio::time::timeout(Duration::from_secs(10), handle)
        .await
        .expect("the loop returns on shutdown")
        .expect("join")
        .expect("clean exit");
    let times = store.claim_times();
    for (n, pair) in times.windows(2).enumerate() {
        // tokio rounds a sleep's deadline up to its next millisecond tick, so
        // a poll never comes sooner than the interval after the one before.
        let gap = pair[1] - pair[0];
        assert!(
            gap >= interval,
            "poll {} came {gap:?} after poll {n}, sooner than the {interval:?} poll interval",
            n + 1
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_notification_wakes_the_idle_loop_and_shutdown_interrupts_its_sleep() {
    let clock = Arc::new(SystemClock);
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
    // The next poll is a minute away: whatever is published before then was
    // woken, and a shutdown that returns before then interrupted the sleep.
    let cfg = WorkerConfig {
        poll_interval: Duration::from_secs(60),
        ..WorkerConfig::default()
    };
    let started = Instant::now();
    let handle =
        tokio::spawn(async move { worker::run(&relay, &cfg, Some(wake_rx), stop_rx).await });

    eventually(
        Duration::from_secs(10),
        "one idle claim at start",
        async || {
            let claims = store.claim_times().len();
            if claims == 1 {
                Ok(())
            } else {
                Err(format!("{claims} claims"))
            }
        },
    )
    .await;
    store.push("a", clock.now());
    wake_tx.send_modify(|v| *v += 1);
    eventually(
        Duration::from_secs(20),
        "published after the wake-up, with the next poll a minute away",
        async || {
            let sent = broker.sent().len();
            if sent == 1 {
                Ok(())
            } else {
                Err(format!("{sent} sent"))
            }
        },
    )
    .await;

    stop_tx.send(true).expect("stop");
    tokio::time::timeout(Duration::from_secs(20), handle)
        .await
        .expect("the loop returns on shutdown, without waiting out its 60 s sleep")
        .expect("join")
        .expect("clean exit");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "all of it before the first poll interval ended"
    );
}
