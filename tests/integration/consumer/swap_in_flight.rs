//! A consumer message in flight during a swap finishes on the version it
//! started with (Postgres, where a table lock can hold it mid-statement).

use std::sync::Arc;
use std::time::Duration;

use outboxd::message::Delivery;
use outboxd::plugin::lifecycle::registry::Registry;
use outboxd::store::Db;
use outboxd_demo::billing;
use serde_json::json;

use crate::support::db::pairs;
use crate::support::plugins::wasm;
use crate::support::swap::{consumer_host, deploy};
use crate::support::{TestDb, eventually};

// ---- in flight -----------------------------------------------------------------

/// Postgres: version 1's INSERT is held on a table lock while version 2 is
/// activated and swapped in; the held message still commits as version 1
/// and the next message runs on version 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_in_flight_finishes_on_the_version_it_started_with_postgres() {
    let t = TestDb::postgres().await;
    billing::create_schema(&t.db).await.expect("billing schema");
    let Db::Postgres(pool) = &t.db else {
        unreachable!("a Postgres test database")
    };
    let reg = Registry::new(t.db.clone());
    let v1 = deploy(&reg, "c", wasm("billing")).await;
    let v2 = deploy(&reg, "c", wasm("invoicing")).await;
    reg.activate("c", v1, "test").await.expect("activate");
    let (host, handler) = consumer_host(&t).await;
    let handler = Arc::new(handler);
    let order = |i: i64| Delivery {
        attempt: 0,
        topic: "orders".into(),
        partition: 0,
        offset: i,
        key: None,
        payload: json!({"order_id": format!("o{i}"), "customer_id": "c", "total_cents": 1})
            .to_string()
            .into_bytes(),
        headers: vec![(
            outboxd::message::headers::MESSAGE_ID.into(),
            uuid::Uuid::new_v4().to_string().into_bytes(),
        )],
    };
    let mut blocker = pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE invoices IN EXCLUSIVE MODE")
        .execute(&mut *blocker)
        .await
        .expect("lock invoices");
    let first = order(1);
    let in_flight = {
        let (db, handler, first) = (t.db.clone(), handler.clone(), first.clone());
        tokio::spawn(async move {
            outboxd::consumer::attempt(&db, "billing", &first, handler.as_ref()).await
        })
    };
    // The call is in flight once its INSERT waits on the lock.
    eventually(
        Duration::from_secs(10),
        "the call never reached its INSERT",
        async || {
            t.count("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO invoices%'")
                .await
                != 0
        },
    )
    .await;
    reg.activate("c", v2, "test").await.expect("activate v2");
    host.refresh().await.expect("refresh");
    assert_eq!(
        host.consumer("c").expect("slot").label(),
        Some(format!("c@{v2}"))
    );
    assert!(!in_flight.is_finished(), "the call is still held");
    blocker.rollback().await.expect("release the lock");
    let held = in_flight.await.expect("in flight");
    assert!(held.result.is_ok(), "{:?}", held.result);
    assert_eq!(held.handled_by, Some(format!("c@{v1}")));
    let second = order(2);
    let next = outboxd::consumer::attempt(&t.db, "billing", &second, handler.as_ref()).await;
    assert!(next.result.is_ok(), "{:?}", next.result);
    assert_eq!(next.handled_by, Some(format!("c@{v2}")));
    let recorded = pairs(
        &t.db,
        "SELECT CAST(i.handled_by AS TEXT), CASE WHEN v.issued_at = 0 THEN 'invoicing' ELSE 'billing' END FROM inbox i JOIN invoices v ON v.message_id = CAST(i.message_id AS TEXT) ORDER BY v.id",
    )
    .await;
    assert_eq!(
        recorded,
        vec![
            (format!("c@{v1}"), Some("billing".to_string())),
            (format!("c@{v2}"), Some("invoicing".to_string())),
        ]
    );
}
