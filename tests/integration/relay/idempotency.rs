//! Idempotent operations, so a client may retry a request whose reply it
//! lost: repeat, conflict, and two racers on one key producing exactly one
//! row.

use outboxd::event::{Enqueued, NewEvent};
use outboxd::store::{Db, EnqueueError, enqueue};
use serde_json::json;

use crate::support::db::{wait_for_pg_lock_waiters, with_pool};
use crate::support::{TestDb, on_both};

fn ev(payload: serde_json::Value) -> NewEvent {
    NewEvent::new("acct-1", "payment.requested", payload).with_operation_key("tenant-a", "op-1")
}

async fn write(db: &Db, event: NewEvent) -> Result<Enqueued, EnqueueError> {
    with_pool!(db, |p| {
        let mut tx = p.begin().await?;
        let r = enqueue(&mut tx, event).await?;
        tx.commit().await?;
        Ok(r)
    })
}

async fn same_key_same_payload_is_a_repeat(t: TestDb) {
    let first = write(&t.db, ev(json!({"amount": 10, "currency": "EUR"})))
        .await
        .expect("first");
    // Key order in the document does not change the fingerprint.
    let again = write(&t.db, ev(json!({"currency": "EUR", "amount": 10})))
        .await
        .expect("again");
    assert!(matches!(first, Enqueued::Created(_)));
    assert_eq!(again, Enqueued::Repeat(first.id()));
    assert_eq!(t.count("SELECT count(*) FROM outbox").await, 1);
}
on_both!(same_key_same_payload_is_a_repeat);

async fn same_key_different_payload_is_a_typed_conflict(t: TestDb) {
    let first = write(&t.db, ev(json!({"amount": 10})))
        .await
        .expect("first");
    match write(&t.db, ev(json!({"amount": 11}))).await {
        Err(EnqueueError::IdempotencyConflict {
            tenant,
            key,
            existing,
        }) => {
            assert_eq!(
                (tenant.as_str(), key.as_str(), existing),
                ("tenant-a", "op-1", first.id().0)
            );
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(t.count("SELECT count(*) FROM outbox").await, 1);
}
on_both!(same_key_different_payload_is_a_typed_conflict);

async fn keys_are_scoped_by_tenant(t: TestDb) {
    write(&t.db, ev(json!({"amount": 10}))).await.expect("a");
    let other = NewEvent::new("acct-1", "payment.requested", json!({"amount": 99}))
        .with_operation_key("tenant-b", "op-1");
    assert!(matches!(
        write(&t.db, other).await.expect("b"),
        Enqueued::Created(_)
    ));
    assert_eq!(t.count("SELECT count(*) FROM outbox").await, 2);
}
on_both!(keys_are_scoped_by_tenant);

async fn invalid_events_are_refused_with_the_reason(t: TestDb) {
    let err = write(&t.db, NewEvent::new("", "x", json!({})))
        .await
        .expect_err("empty aggregate");
    assert!(
        matches!(err, EnqueueError::Invalid(ref m) if m.contains("aggregate_id")),
        "{err}"
    );
    let err = write(&t.db, NewEvent::new("a", "", json!({})))
        .await
        .expect_err("empty type");
    assert!(
        matches!(err, EnqueueError::Invalid(ref m) if m.contains("event_type")),
        "{err}"
    );
    assert_eq!(t.count("SELECT count(*) FROM outbox").await, 0);
}
on_both!(invalid_events_are_refused_with_the_reason);

/// Two transactions race on one key: the second waits for the first (unique
/// index on Postgres, the write lock on SQLite), then sees its row.
async fn two_racers_on_one_key_produce_one_row(t: TestDb) {
    let payload = json!({"amount": 10});
    match &t.db {
        Db::Postgres(p) => {
            let mut tx1 = p.begin().await.expect("tx1");
            let first = enqueue(&mut tx1, ev(payload.clone()))
                .await
                .expect("tx1 enqueue");
            let pool = p.clone();
            let ev2 = ev(payload.clone());
            let racer = tokio::spawn(async move {
                let mut tx2 = pool.begin().await.expect("tx2");
                let r = enqueue(&mut tx2, ev2).await.expect("tx2 enqueue");
                tx2.commit().await.expect("tx2 commit");
                r
            });
            // Wait until the racer is really blocked on tx1's key.
            wait_for_pg_lock_waiters(p, 1).await;
            tx1.commit().await.expect("tx1 commit");
            let second = racer.await.expect("join");
            assert_eq!(second, Enqueued::Repeat(first.id()));
        }
        Db::Sqlite(_) => {
            let db1 = t.db.clone();
            let db2 = t.db.clone();
            let (a, b) = tokio::join!(
                write(&db1, ev(payload.clone())),
                write(&db2, ev(payload.clone()))
            );
            let (a, b) = (a.expect("a"), b.expect("b"));
            assert_eq!(a.id(), b.id());
            assert!(
                a.is_repeat() != b.is_repeat(),
                "exactly one created: {a:?} {b:?}"
            );
        }
    }
    assert_eq!(t.count("SELECT count(*) FROM outbox").await, 1);
}
on_both!(two_racers_on_one_key_produce_one_row);
