//! Batched inbox transactions: a batch whose messages all succeed commits
//! in one transaction with each handler run once; a failure keeps the
//! prefix before it, and nothing of the prefix is applied twice.

use std::sync::Mutex;

use outboxd::consumer::Handler;
use outboxd::consumer::HandlerError;
use outboxd::consumer::Processed;
use outboxd::consumer::batch::process_batch;
use outboxd::message::Delivery;
use outboxd::message::headers;
use outboxd::store::InboxTx;

use crate::support::{TestDb, on_both};

/// Writes its payload into `batch_effects`; fails permanently on "poison"
/// after writing, so the write must be rolled back.
#[derive(Default)]
struct Writer {
    calls: Mutex<Vec<String>>,
}

impl Handler for Writer {
    async fn handle(&self, tx: &mut InboxTx, d: &Delivery) -> Result<(), HandlerError> {
        let payload = String::from_utf8_lossy(&d.payload).into_owned();
        self.calls.lock().expect("calls").push(payload.clone());
        let sql = "INSERT INTO batch_effects (payload) VALUES ($1)";
        match tx {
            InboxTx::Postgres(t) => sqlx::query(sql)
                .bind(&payload)
                .execute(&mut **t)
                .await
                .map(|_| ())?,
            InboxTx::Sqlite(t) => sqlx::query(sql)
                .bind(&payload)
                .execute(&mut **t)
                .await
                .map(|_| ())?,
        };
        if payload == "poison" {
            return Err(HandlerError::Permanent("poison".into()));
        }
        Ok(())
    }
}

impl Writer {
    fn calls(&self, payload: &str) -> usize {
        self.calls
            .lock()
            .expect("calls")
            .iter()
            .filter(|p| *p == payload)
            .count()
    }
}

fn delivery(payload: &str, id: uuid::Uuid) -> Delivery {
    Delivery {
        topic: "orders".into(),
        partition: 0,
        offset: 0,
        key: Some(b"k".to_vec()),
        payload: payload.as_bytes().to_vec(),
        headers: vec![(headers::MESSAGE_ID.to_string(), id.to_string().into_bytes())],
        attempt: 0,
    }
}

async fn schema(t: &TestDb) {
    t.exec_app("CREATE TABLE batch_effects (payload TEXT NOT NULL)")
        .await;
}

async fn a_successful_batch_runs_each_handler_once_and_commits_everything(t: TestDb) {
    schema(&t).await;
    let handler = Writer::default();
    let batch: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|p| delivery(p, uuid::Uuid::new_v4()))
        .collect();
    let results = process_batch(&t.db, "c1", &batch, &handler)
        .await
        .expect("batch");
    assert_eq!(results.len(), 3);
    assert!(results.iter().all(|r| matches!(r, Ok(Processed::Handled))));
    for p in ["a", "b", "c"] {
        assert_eq!(handler.calls(p), 1, "{p} ran once");
    }
    assert_eq!(t.count("SELECT COUNT(*) FROM batch_effects").await, 3);
    assert_eq!(t.count("SELECT COUNT(*) FROM inbox").await, 3);
}
on_both!(a_successful_batch_runs_each_handler_once_and_commits_everything);

async fn duplicates_in_a_successful_batch_never_reach_the_handler(t: TestDb) {
    schema(&t).await;
    let handler = Writer::default();
    let old = uuid::Uuid::new_v4();
    let results = process_batch(&t.db, "c1", &[delivery("old", old)], &handler)
        .await
        .expect("first batch");
    assert!(matches!(results[..], [Ok(Processed::Handled)]));
    let twice = uuid::Uuid::new_v4();
    let batch = vec![
        delivery("old-again", old),
        delivery("new", twice),
        delivery("new-again", twice),
        delivery("last", uuid::Uuid::new_v4()),
    ];
    let results = process_batch(&t.db, "c1", &batch, &handler)
        .await
        .expect("batch");
    let kinds: Vec<_> = results.iter().map(|r| *r.as_ref().expect("ok")).collect();
    assert_eq!(
        kinds,
        [
            Processed::Duplicate,
            Processed::Handled,
            Processed::Duplicate,
            Processed::Handled
        ],
        "an id handled before, and the second of one id in the batch, are duplicates"
    );
    for (p, n) in [("old-again", 0), ("new", 1), ("new-again", 0), ("last", 1)] {
        assert_eq!(handler.calls(p), n, "{p}");
    }
    assert_eq!(t.count("SELECT COUNT(*) FROM batch_effects").await, 3);
    assert_eq!(t.count("SELECT COUNT(*) FROM inbox").await, 3);
}
on_both!(duplicates_in_a_successful_batch_never_reach_the_handler);

async fn a_failure_keeps_the_prefix_applied_once_and_rolls_back_its_own_write(t: TestDb) {
    schema(&t).await;
    let handler = Writer::default();
    let first = uuid::Uuid::new_v4();
    let batch = vec![
        delivery("a", first),
        delivery("b", uuid::Uuid::new_v4()),
        delivery("a-again", first),
        delivery("poison", uuid::Uuid::new_v4()),
        delivery("after", uuid::Uuid::new_v4()),
    ];
    let results = process_batch(&t.db, "c1", &batch, &handler)
        .await
        .expect("batch");
    assert_eq!(
        results.len(),
        4,
        "the batch stops at the failure: {results:?}"
    );
    assert!(matches!(results[0], Ok(Processed::Handled)));
    assert!(matches!(results[1], Ok(Processed::Handled)));
    assert!(
        matches!(results[2], Ok(Processed::Duplicate)),
        "same id twice in one batch"
    );
    assert!(matches!(results[3], Err(HandlerError::Permanent(_))));
    assert_eq!(
        handler.calls("a-again"),
        0,
        "a duplicate never reaches the handler"
    );
    assert_eq!(handler.calls("after"), 0, "nothing after the failure runs");
    assert_eq!(
        handler.calls("poison"),
        1,
        "a failing handler runs once per attempt"
    );
    let effects = t
        .count("SELECT COUNT(*) FROM batch_effects WHERE payload IN ('a', 'b')")
        .await;
    assert_eq!(effects, 2, "the prefix is applied exactly once");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM batch_effects WHERE payload = 'poison'")
            .await,
        0,
        "the failed message's own write is rolled back"
    );
    assert_eq!(t.count("SELECT COUNT(*) FROM inbox").await, 2);
}
on_both!(a_failure_keeps_the_prefix_applied_once_and_rolls_back_its_own_write);
