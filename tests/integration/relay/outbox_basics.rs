//! The outbox's basic promises: an unchanged order leaves no event, a
//! broker that is down loses nothing while recovery publishes once, the
//! inbox discards a duplicate delivery, and an event written with plain SQL
//! is relayed (and, on Postgres, wakes listening relays).

use outboxd::relay::StepOutcome;
use outboxd_demo::orders::{self, ConfirmOrder, ConfirmOutcome, OrderService};

use crate::support::{ScriptedPublisher, TestDb, on_both};

async fn setup_orders(t: &TestDb) -> OrderService {
    orders::create_schema(&t.db).await.expect("orders schema");
    OrderService::new(t.db.clone())
}

fn confirm(id: &str) -> ConfirmOrder {
    ConfirmOrder {
        order_id: id.into(),
        operation_key: None,
    }
}

async fn already_confirmed_order_leaves_no_orphan_event(t: TestDb) {
    let svc = setup_orders(&t).await;
    orders::create_order(&t.db, "o1", "c1", 1000)
        .await
        .expect("order");
    t.exec("UPDATE orders SET status = 'confirmed' WHERE id = 'o1'")
        .await;
    assert_eq!(
        svc.confirm_order(&confirm("o1")).await.expect("confirm"),
        ConfirmOutcome::Unchanged
    );
    assert_eq!(
        svc.confirm_order(&confirm("missing"))
            .await
            .expect("confirm"),
        ConfirmOutcome::Unchanged
    );
    assert_eq!(t.count("SELECT count(*) FROM outbox").await, 0);
}
on_both!(already_confirmed_order_leaves_no_orphan_event);

async fn confirming_twice_writes_one_event(t: TestDb) {
    let svc = setup_orders(&t).await;
    orders::create_order(&t.db, "o1", "c1", 1000)
        .await
        .expect("order");
    assert!(matches!(
        svc.confirm_order(&confirm("o1")).await.expect("confirm"),
        ConfirmOutcome::Confirmed(_)
    ));
    assert_eq!(
        svc.confirm_order(&confirm("o1")).await.expect("confirm"),
        ConfirmOutcome::Unchanged
    );
    assert_eq!(t.count("SELECT count(*) FROM outbox").await, 1);
}
on_both!(confirming_twice_writes_one_event);

async fn broker_down_loses_nothing_and_recovery_publishes_once(t: TestDb) {
    let svc = setup_orders(&t).await;
    orders::create_order(&t.db, "o1", "c1", 1000)
        .await
        .expect("order");
    svc.confirm_order(&confirm("o1")).await.expect("confirm");

    let broker = ScriptedPublisher::failing();
    let relay = t.relay(broker.clone());
    let StepOutcome::Published(report) = relay.step().await.expect("step") else {
        panic!("expected a batch")
    };
    assert_eq!((report.published, report.retried), (0, 1));
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE published_at IS NULL AND attempts = 1")
            .await,
        1
    );
    let err = t
        .count("SELECT count(*) FROM outbox WHERE last_error LIKE '%broker unavailable%'")
        .await;
    assert_eq!(err, 1, "last_error records the broker's reason");

    broker.set_failing(false);
    // Skip the backoff: this test is about what is published, not when.
    t.make_all_due().await;
    assert!(matches!(
        relay.step().await.expect("step"),
        StepOutcome::Published(_)
    ));
    assert_eq!(
        relay.step().await.expect("step"),
        StepOutcome::Idle,
        "a second round must not republish"
    );
    assert_eq!(relay.step().await.expect("step"), StepOutcome::Idle);
    assert_eq!(broker.sent().len(), 1);
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
            .await,
        1
    );
}
on_both!(broker_down_loses_nothing_and_recovery_publishes_once);

async fn duplicate_delivery_is_discarded_by_the_inbox(t: TestDb) {
    use outboxd::consumer::{Processed, process};
    use outboxd::message::Delivery;
    use outboxd::message::headers;
    use outboxd_demo::billing::{self, BillingHandler};
    billing::create_schema(&t.db).await.expect("billing schema");
    let d = Delivery {
        attempt: 0,
        topic: "order.confirmed".into(),
        partition: 0,
        offset: 1,
        key: Some(b"p1".to_vec()),
        payload: br#"{"order_id":"p1","customer_id":"c1","total_cents":500}"#.to_vec(),
        headers: vec![(
            headers::MESSAGE_ID.into(),
            b"0b1f6a52-6d8c-4a39-9c1e-3f1d2a7c9e10".to_vec(),
        )],
    };
    assert_eq!(
        process(&t.db, "billing", &d, &BillingHandler)
            .await
            .expect("first"),
        Processed::Handled
    );
    assert_eq!(
        process(&t.db, "billing", &d, &BillingHandler)
            .await
            .expect("second"),
        Processed::Duplicate
    );
    assert_eq!(t.count("SELECT count(*) FROM invoices").await, 1);
    // Another consumer name is another inbox: it handles the message once too.
    assert_eq!(
        process(&t.db, "audit", &d, &BillingHandler)
            .await
            .expect("audit"),
        Processed::Handled
    );
}
on_both!(duplicate_delivery_is_discarded_by_the_inbox);

/// The SQLite SQL contract: a raw INSERT without id or timestamps is a
/// valid event that the relay publishes with a uuid message id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_raw_insert_contract_is_relayed() {
    let t = TestDb::sqlite().await;
    t.exec("INSERT INTO outbox (aggregate_id, event_type, payload, headers) VALUES ('order-42', 'order.confirmed', '{\"order_id\":\"order-42\"}', '{}')").await;
    let broker = ScriptedPublisher::new();
    let relay = t.relay(broker.clone());
    assert!(matches!(
        relay.step().await.expect("step"),
        StepOutcome::Published(_)
    ));
    let sent = broker.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].message_id.get_version_num(), 4);
    assert_eq!(sent[0].key, b"order-42");
}

/// Postgres: an insert through the SQL contract wakes listening relays
/// (the statement trigger's NOTIFY), so they need not wait for the poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_insert_notifies_listening_relays() {
    let t = TestDb::postgres().await;
    let outboxd::store::Db::Postgres(pool) = &t.db else {
        unreachable!()
    };
    let mut wake = outboxd::store::outbox::pg_claim::listen_for_events(pool)
        .await
        .expect("listen");
    wake.borrow_and_update();
    t.exec("SELECT outbox_enqueue('a', 'x', '{}'::jsonb)").await;
    tokio::time::timeout(std::time::Duration::from_secs(10), wake.changed())
        .await
        .expect("a notification within 10 s")
        .expect("listener alive");
}

/// A native handler's own statements run through the inbox transaction
/// with plain values, the same text on both databases: `execute` reports
/// the rows it changed, `query` reads them back, and a value that is not
/// what it says is refused before it reaches the database.
async fn a_native_handler_runs_its_own_sql_on_either_database(t: TestDb) {
    use outboxd::sql_values::SqlValue;
    use outboxd::store::InboxTx;
    use outboxd::store::StatementError;
    t.exec_app("CREATE TABLE notes (id TEXT PRIMARY KEY, body TEXT NOT NULL, n BIGINT NOT NULL)")
        .await;
    let mut tx = InboxTx::begin(&t.db).await.expect("begin");
    let changed = tx
        .execute(
            "INSERT INTO notes (id, body, n) VALUES ($1, $2, $3), ($4, $2, $3)",
            vec![
                SqlValue::Text("a".into()),
                SqlValue::Text("hello".into()),
                SqlValue::Int(7),
                SqlValue::Text("b".into()),
            ],
        )
        .await
        .expect("insert");
    assert_eq!(changed, 2);
    let rows = tx
        .query(
            "SELECT id, n FROM notes WHERE body = $1 ORDER BY id",
            vec![SqlValue::Text("hello".into())],
        )
        .await
        .expect("select");
    assert_eq!(
        rows,
        vec![
            vec![SqlValue::Text("a".into()), SqlValue::Int(7)],
            vec![SqlValue::Text("b".into()), SqlValue::Int(7)],
        ]
    );
    let bad = tx
        .execute(
            "UPDATE notes SET body = $1 WHERE id = $2",
            vec![
                SqlValue::Uuid("not-a-uuid".into()),
                SqlValue::Text("a".into()),
            ],
        )
        .await;
    assert!(matches!(bad, Err(StatementError::Value(_))), "{bad:?}");
    tx.commit().await.expect("commit");
    assert_eq!(t.count("SELECT count(*) FROM notes").await, 2);
}
on_both!(a_native_handler_runs_its_own_sql_on_either_database);
