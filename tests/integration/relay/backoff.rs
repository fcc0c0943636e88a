//! Backoff and the dead state, driven by a clock the test moves: nothing sleeps.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use outboxd::backoff::Backoff;
use outboxd::clock::{Clock, ManualClock};
use outboxd::relay::RelayConfig;
use outboxd::relay::StepOutcome;
use outboxd::relay::StepReport;
use outboxd::store::{Db, OutboxStore};
use serde_json::json;

use crate::support::{ScriptedPublisher, TestDb, db};

async fn put(db: &Db, agg: &str, ty: &str) {
    db::put(db, agg, ty, json!({})).await;
}

fn retried(n: usize) -> StepOutcome {
    StepOutcome::Published(StepReport {
        published: 0,
        retried: n,
        dead: 0,
        filtered: 0,
    })
}

async fn backoff_doubles_then_dead_letters_and_blocks_only_its_aggregate(t: TestDb) {
    put(&t.db, "a1", "first").await;
    put(&t.db, "a1", "second").await;
    // The clock starts after the inserts, so both are due at t = 0.
    // A manual clock, not paused tokio time: while the runtime waits on the
    // database, paused time auto-advances to the pool's acquire timeout.
    // The relay loop's own timing is tested in `timing.rs`.
    let time = Arc::new(ManualClock::starting_now());
    let clock: Arc<dyn Clock> = time.clone();
    let broker = ScriptedPublisher::failing();
    let config = RelayConfig {
        max_attempts: 4,
        backoff: Backoff {
            base_seconds: 1.0,
            max_seconds: 3.0,
        },
        ..RelayConfig::default()
    };
    let relay = t.relay_with(broker.clone(), config, clock);

    // Attempt 1 fails: next try after min(1 * 2^0, 3) = 1 s.
    assert_eq!(relay.step().await.expect("step"), retried(1));
    time.advance(Duration::from_millis(999));
    assert_eq!(
        relay.step().await.expect("step"),
        StepOutcome::Idle,
        "not due before 1 s"
    );
    time.advance(Duration::from_millis(1));
    // Attempt 2 fails: next after 2 s.
    assert_eq!(relay.step().await.expect("step"), retried(1));
    time.advance(Duration::from_millis(1999));
    assert_eq!(
        relay.step().await.expect("step"),
        StepOutcome::Idle,
        "not due before 2 s"
    );
    time.advance(Duration::from_millis(1));
    // Attempt 3 fails: next after min(4, 3) = 3 s, the cap.
    assert_eq!(relay.step().await.expect("step"), retried(1));
    time.advance(Duration::from_millis(2999));
    assert_eq!(
        relay.step().await.expect("step"),
        StepOutcome::Idle,
        "capped at 3 s"
    );
    time.advance(Duration::from_millis(1));
    // Attempt 4 is the last: dead.
    assert_eq!(
        relay.step().await.expect("step"),
        StepOutcome::Published(StepReport {
            published: 0,
            retried: 0,
            dead: 1,
            filtered: 0
        })
    );
    assert_eq!(t.count("SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL AND attempts = 4 AND dead_reason LIKE '%broker unavailable%'").await, 1);

    // Another aggregate keeps flowing; the dead one's successor waits.
    broker.set_failing(false);
    put(&t.db, "a2", "other").await;
    time.advance(Duration::from_secs(3600));
    while relay.step().await.expect("step") != StepOutcome::Idle {}
    let sent: Vec<_> = broker.sent().iter().map(|m| m.topic.clone()).collect();
    assert_eq!(sent, ["other"], "a1/second stays behind the dead a1/first");
    let stats = relay
        .store()
        .stats(chrono::Utc::now())
        .await
        .expect("stats");
    assert_eq!(
        (
            stats.dead,
            stats.blocked_aggregates,
            stats.blocked_events,
            stats.pending
        ),
        (1, 1, 1, 1)
    );
    assert!(!broker.failing.load(Ordering::SeqCst));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backoff_on_postgres() {
    backoff_doubles_then_dead_letters_and_blocks_only_its_aggregate(TestDb::postgres().await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backoff_on_sqlite() {
    backoff_doubles_then_dead_letters_and_blocks_only_its_aggregate(TestDb::sqlite().await).await
}

/// A permanent broker error (message too large) dead-letters at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_publish_error_goes_straight_to_dead() {
    let t = TestDb::sqlite().await;
    put(&t.db, "a1", "huge").await;
    let broker = ScriptedPublisher::failing();
    broker.permanent.store(true, Ordering::SeqCst);
    let relay = t.relay(broker.clone());
    assert_eq!(
        relay.step().await.expect("step"),
        StepOutcome::Published(StepReport {
            published: 0,
            retried: 0,
            dead: 1,
            filtered: 0
        })
    );
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL AND attempts = 1")
            .await,
        1
    );
}

/// last_error is cut to 500 characters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_error_is_truncated() {
    assert_eq!(
        outboxd::store::truncate(&"é".repeat(600), 500)
            .chars()
            .count(),
        500
    );
    assert_eq!(outboxd::store::truncate("short", 500), "short");
}
