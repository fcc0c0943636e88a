//! SQLite relay leases: a relay whose lease expired while its batch was in
//! flight must not overwrite what the relay that claimed the rows after it
//! recorded, neither on rows that one published nor on rows it still holds.

use std::time::Duration;

use chrono::Utc;
use outboxd::store::sqlite::SqliteStore;
use outboxd::store::{BatchOutcome, ClaimedBatch, Db, FailedEvent, OutboxStore};

use crate::admin::put;
use crate::support::TestDb;

fn failed_all(seqs: &[i64], dead: bool) -> BatchOutcome {
    BatchOutcome {
        failed: seqs
            .iter()
            .map(|&seq| FailedEvent {
                seq,
                error: "stale relay: broker timed out".into(),
                retry_at: Utc::now(),
                dead,
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
    put(&t.db, "published-by-b").await;
    put(&t.db, "held-by-b").await;
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
