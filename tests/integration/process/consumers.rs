//! Consumer processes killed and started for real (`outboxd run` as a child
//! process): a kill before the offset commit, a kill mid-batch with a plugin,
//! processes starting together, and a consumer-only process
//! (`relay.workers = 0`). The relay and producer cases are in `crashes.rs`.

use std::process::Stdio;
use std::time::Duration;

use outboxd::event::NewEvent;
use serde_json::json;

use crate::support::process::{
    billing_plugin_consumer, kill_at_fault, outboxd, outboxd_with_billing, terminate,
};
use crate::support::{TestDb, on_both};

/// Commits the `order.confirmed` events of orders `order-0` to `order-{n-1}`.
async fn confirm_orders(t: &TestDb, n: usize) {
    for i in 0..n {
        t.enqueue(NewEvent::new(
            format!("order-{i}"),
            "order.confirmed",
            json!({ "order_id": format!("order-{i}"), "customer_id": "c", "total_cents": 100 + i }),
        ))
        .await;
    }
}

/// After a kill between the handler's commit and the offset's: more
/// invoices are in than `billing`'s stored offsets cover, so those messages
/// will be delivered again.
async fn effects_beyond_stored_offsets(t: &TestDb) {
    let before = t.count("SELECT count(*) FROM invoices").await;
    let acknowledged = t
        .count(
            "SELECT count(*) FROM transport_messages m JOIN transport_cursors c
               ON c.topic = m.topic AND c.partition = m.partition AND c.consumer_group = 'billing'
             WHERE m.\"offset\" <= c.last_offset",
        )
        .await;
    assert!(
        before > acknowledged,
        "effects committed ({before}) beyond the stored offsets ({acknowledged}): they will be redelivered"
    );
}

/// A consumer killed after its effect committed but before its offset was
/// stored redelivers that message on restart, and the inbox drops it: every
/// order gets exactly one invoice.
async fn consumer_killed_before_offset_commit_has_no_double_effect(t: TestDb) {
    outboxd_demo::billing::create_schema(&t.db)
        .await
        .expect("billing");
    confirm_orders(&t, 120).await;
    let consumers =
        r#"[{name = "billing", topics = ["order.confirmed"], handler = "builtin:billing"}]"#;
    let child = outboxd_with_billing(&t)
        .arg("run")
        .env("OUTBOXD__CONSUMERS", consumers)
        .env("OUTBOXD_FAULT", "after-handle-before-commit-offset:hang:3")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    kill_at_fault(child).await;
    effects_beyond_stored_offsets(&t).await;

    let mut child = outboxd_with_billing(&t)
        .arg("run")
        .env("OUTBOXD__CONSUMERS", consumers)
        .stderr(Stdio::null())
        .spawn()
        .expect("restart");
    t.wait_count(
        Duration::from_secs(90),
        "SELECT count(DISTINCT order_id) FROM invoices",
        120,
    )
    .await;
    terminate(&mut child).await;
    assert_eq!(
        t.count("SELECT count(*) FROM invoices").await,
        120,
        "exactly one invoice per order"
    );
    assert!(
        t.count("SELECT count(*) FROM inbox WHERE consumer = 'billing'")
            .await
            == 120
    );
}
on_both!(consumer_killed_before_offset_commit_has_no_double_effect);

/// The same crash with the billing plugin handling batches of ten messages
/// in one transaction (a savepoint each): the process dies after batches
/// committed but before their offsets were stored, and on restart every
/// order still has exactly one invoice.
async fn plugin_consumer_killed_mid_batch_has_exactly_one_effect(t: TestDb) {
    outboxd_demo::billing::create_schema(&t.db)
        .await
        .expect("billing");
    confirm_orders(&t, 120).await;
    let (plugins, consumers) = billing_plugin_consumer(&t, ", batch_in_transaction = 10").await;
    let consumers = consumers.as_str();
    let child = outboxd(&t)
        .arg("run")
        .env("OUTBOXD__PLUGINS", &plugins)
        .env("OUTBOXD__CONSUMERS", consumers)
        .env("OUTBOXD_FAULT", "after-handle-before-commit-offset:hang:3")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    kill_at_fault(child).await;
    effects_beyond_stored_offsets(&t).await;

    let mut child = outboxd(&t)
        .arg("run")
        .env("OUTBOXD__PLUGINS", &plugins)
        .env("OUTBOXD__CONSUMERS", consumers)
        .stderr(Stdio::null())
        .spawn()
        .expect("restart");
    t.wait_count(
        Duration::from_secs(90),
        "SELECT count(DISTINCT order_id) FROM invoices",
        120,
    )
    .await;
    terminate(&mut child).await;
    assert_eq!(
        t.count("SELECT count(*) FROM invoices").await,
        120,
        "exactly one invoice per order"
    );
    assert_eq!(
        t.count("SELECT count(*) FROM inbox WHERE consumer = 'billing'")
            .await,
        120
    );
}
on_both!(plugin_consumer_killed_mid_batch_has_exactly_one_effect);

/// Found by the chaos soak: two consumer processes starting together both
/// ran `CREATE TABLE IF NOT EXISTS invoices`, and one died on Postgres's
/// catalog unique index. Eight concurrent creators must all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn processes_starting_together_create_the_example_schema_once() {
    let t = TestDb::postgres().await;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let db = t.db.clone();
        set.spawn(async move { outboxd_demo::billing::create_schema(&db).await });
    }
    while let Some(joined) = set.join_next().await {
        joined
            .expect("join")
            .expect("create_schema under concurrency");
    }
    assert_eq!(t.count("SELECT count(*) FROM invoices").await, 0);
}

/// `relay.workers = 0` spawns no relay: a consumer-only process handles what
/// is already on the transport and publishes nothing from the outbox. The
/// outbox holds events of the very topic the consumer reads, so a relay in
/// this process would also show as invoices for them.
async fn a_consumer_only_process_publishes_nothing(t: TestDb) {
    use outboxd::broker::Publisher;
    use outboxd::broker::embedded::EmbeddedPublisher;
    use outboxd::message::OutgoingMessage;
    use outboxd::message::headers;

    outboxd_demo::billing::create_schema(&t.db)
        .await
        .expect("billing");
    for i in 0..5 {
        t.enqueue(NewEvent::new(
            format!("queued-{i}"),
            "order.confirmed",
            json!({ "order_id": format!("queued-{i}"), "customer_id": "c", "total_cents": 100 }),
        ))
        .await;
    }
    let (plugins, consumers) = billing_plugin_consumer(&t, "").await;
    let mut child = outboxd(&t)
        .arg("run")
        .env("OUTBOXD__RELAY__WORKERS", "0")
        .env("OUTBOXD__TRANSPORT__PARTITIONS", "2")
        .env("OUTBOXD__PLUGINS", &plugins)
        .env("OUTBOXD__CONSUMERS", &consumers)
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");

    // Messages put on the transport directly, as another process's relay
    // would: the consumer handling them shows it is running.
    let publisher = EmbeddedPublisher::new(t.db.clone(), 2);
    for i in 0..5 {
        let id = uuid::Uuid::new_v4();
        let order = format!("direct-{i}");
        publisher
            .publish(OutgoingMessage {
                topic: "order.confirmed".into(),
                key: order.clone().into_bytes(),
                payload: json!({ "order_id": order, "customer_id": "c", "total_cents": 100 })
                    .to_string()
                    .into_bytes(),
                headers: vec![(headers::MESSAGE_ID.into(), id.to_string().into_bytes())],
                message_id: id,
                created_at: chrono::Utc::now(),
            })
            .await
            .expect("publish to the embedded transport");
    }
    t.wait_count(
        Duration::from_secs(90),
        "SELECT count(*) FROM invoices WHERE order_id LIKE 'direct-%'",
        5,
    )
    .await;

    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .await,
        5,
        "a consumer-only process published outbox events"
    );
    assert_eq!(
        t.count("SELECT count(*) FROM transport_messages").await,
        5,
        "only the directly published messages are on the transport"
    );
    assert_eq!(t.count("SELECT count(*) FROM invoices").await, 5);

    terminate(&mut child).await;
}
on_both!(a_consumer_only_process_publishes_nothing);
