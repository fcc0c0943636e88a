//! SQLite relay leases: a batch in flight renews its lease, so a batch
//! slower than the lease is not claimed twice, while a batch given up (a
//! crashed relay) is claimable again one lease later; and a relay whose
//! lease expired while its batch was in flight must not overwrite what the
//! relay that claimed the rows after it recorded, neither on rows that one
//! published nor on rows it still holds.
//!
//! Leases are wall-clock times stored in the database, so the renewal tests
//! let real time pass (a few lease lengths of 300 ms): that wait is the
//! thing under test, not a synchronisation between tasks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use outboxd::broker::PublishError;
use outboxd::broker::Publisher;
use outboxd::clock::SystemClock;
use outboxd::message::OutgoingMessage;
use outboxd::relay::Relay;
use outboxd::relay::RelayConfig;
use outboxd::relay::StepOutcome;
use outboxd::route::Router;
use outboxd::store::outbox::sqlite_claim::SqliteStore;
use outboxd::store::{BatchOutcome, ClaimedBatch, Db, FailedEvent, OutboxStore};
use tokio::sync::{Notify, watch};

use crate::support::admin::put_confirmed;
use crate::support::{ScriptedPublisher, TestDb};

const SHORT_LEASE: Duration = Duration::from_millis(300);

/// A broker that acknowledges nothing until the test opens its gate, as a
/// slow plugin chain or broker would hold a batch in flight.
struct HeldBroker {
    arrived: AtomicUsize,
    arrival: Notify,
    gate: watch::Receiver<bool>,
    sent: Mutex<Vec<OutgoingMessage>>,
}

impl HeldBroker {
    fn new(gate: watch::Receiver<bool>) -> Arc<Self> {
        Arc::new(Self {
            arrived: AtomicUsize::new(0),
            arrival: Notify::new(),
            gate,
            sent: Mutex::default(),
        })
    }

    /// Returns once `n` publishes are waiting at the gate.
    async fn wait_for(&self, n: usize) {
        loop {
            let notified = self.arrival.notified();
            if self.arrived.load(Ordering::SeqCst) >= n {
                return;
            }
            notified.await;
        }
    }
}

impl Publisher for HeldBroker {
    async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        self.arrived.fetch_add(1, Ordering::SeqCst);
        self.arrival.notify_waiters();
        let mut gate = self.gate.clone();
        gate.wait_for(|open| *open)
            .await
            .map_err(|_| PublishError::Retryable("gate dropped".into()))?;
        self.sent.lock().expect("lock").push(msg);
        Ok(())
    }
}

fn relay<P: Publisher>(store: &SqliteStore, publisher: P) -> Relay<SqliteStore, P> {
    let config = RelayConfig {
        publish_timeout: Duration::from_secs(60),
        ..RelayConfig::default()
    };
    Relay::new(
        store.clone(),
        publisher,
        Router::default(),
        config,
        Arc::new(SystemClock),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_in_flight_longer_than_its_lease_is_not_claimed_by_another_relay() {
    let t = TestDb::sqlite().await;
    let Db::Sqlite(pool) = &t.db else {
        unreachable!("SQLite")
    };
    put_confirmed(&t.db, "slow-1").await;
    put_confirmed(&t.db, "slow-2").await;
    let store = SqliteStore::new(pool.clone(), SHORT_LEASE);
    let (open, gate) = watch::channel(false);
    let held = HeldBroker::new(gate);
    let slow = relay(&store, held.clone());
    let in_flight = tokio::spawn(async move { slow.step().await });
    held.wait_for(2).await;

    // The batch stays in flight for several lease lengths.
    tokio::time::sleep(SHORT_LEASE * 4).await;
    let other = ScriptedPublisher::new();
    let second = relay(&store, other.clone());
    let outcome = second.step().await.expect("second relay's step");
    assert_eq!(
        (outcome, other.sent().len()),
        (StepOutcome::Idle, 0),
        "another relay claimed and published a batch that was still in flight"
    );

    open.send(true).expect("open the gate");
    match in_flight.await.expect("join").expect("slow relay's step") {
        StepOutcome::Published(report) => assert_eq!(report.published, 2),
        StepOutcome::Idle => panic!("the slow relay's batch was empty"),
    }
    assert_eq!(held.sent.lock().expect("lock").len(), 2);
    assert_eq!(
        t.count(
            "SELECT count(*) FROM outbox WHERE published_at IS NULL OR lease_owner IS NOT NULL"
        )
        .await,
        0,
        "every event is published once and no lease is left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_given_up_stops_renewing_and_is_claimed_again_after_its_lease() {
    let t = TestDb::sqlite().await;
    let Db::Sqlite(pool) = &t.db else {
        unreachable!("SQLite")
    };
    put_confirmed(&t.db, "crashed-1").await;
    let store = SqliteStore::new(pool.clone(), SHORT_LEASE);
    let crashed = store.claim(10, Utc::now()).await.expect("claim");
    assert_eq!(crashed.events().len(), 1);
    // A relay that crashes drops its batch without completing it.
    drop(crashed);
    tokio::time::sleep(SHORT_LEASE * 4).await;
    let again = store.claim(10, Utc::now()).await.expect("claim again");
    assert_eq!(
        again.events().len(),
        1,
        "the lease of a dropped batch was still renewed"
    );
}

fn failed_all(seqs: &[i64], dead: bool) -> BatchOutcome {
    BatchOutcome {
        failed: seqs
            .iter()
            .map(|&seq| FailedEvent {
                seq,
                error: "stale relay: broker timed out".into(),
                retry_at: Utc::now(),
                dead,
                counts_attempt: true,
            })
            .collect(),
        ..BatchOutcome::default()
    }
}

#[tokio::test]
async fn a_stale_lease_holder_cannot_overwrite_the_current_holders_marks() {
    let t = TestDb::sqlite().await;
    let Db::Sqlite(pool) = &t.db else {
        unreachable!("SQLite")
    };
    put_confirmed(&t.db, "published-by-b").await;
    put_confirmed(&t.db, "held-by-b").await;
    let store = SqliteStore::new(pool.clone(), Duration::from_secs(1));
    let start = Utc::now();

    // Relay A claims both events, then stalls past its lease.
    let stale = store.claim(10, start).await.expect("claim by A");
    assert_eq!(stale.events().len(), 2);
    // Relay B claims them after the lease expired and publishes the first;
    // the second is still in flight with B.
    let later = start + chrono::Duration::seconds(5);
    let current = store.claim(10, later).await.expect("claim by B");
    assert_eq!(current.events().len(), 2, "the expired lease lets B claim");
    let seqs: Vec<i64> = current.events().iter().map(|e| e.seq).collect();
    t.exec(&format!(
        "UPDATE outbox SET published_at = 1, outcome = 'published' WHERE seq = {}",
        seqs[0]
    ))
    .await;

    // A comes back and records a failure (dead, even) for both.
    stale
        .complete(failed_all(&seqs, true), Utc::now())
        .await
        .expect("A's late marks");
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE attempts > 0 OR last_error IS NOT NULL OR dead_at IS NOT NULL")
            .await,
        0,
        "a stale lease holder counted an attempt or killed an event it no longer holds"
    );
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM outbox WHERE seq = {} AND lease_owner IS NOT NULL",
            seqs[1]
        ))
        .await,
        1,
        "B still holds its lease"
    );

    // B's own failure of the event it holds still counts.
    current
        .complete(failed_all(&seqs[1..], false), Utc::now())
        .await
        .expect("B's marks");
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM outbox WHERE seq = {} AND attempts = 1 AND last_error IS NOT NULL",
            seqs[1]
        ))
        .await,
        1,
        "the current holder's failure is recorded"
    );
}
