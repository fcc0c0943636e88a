//! Operations: retention in batches, dead letters (list, redrive, discard)
//! and reconciliation.

use std::sync::atomic::Ordering;

use chrono::Utc;
use outboxd::config::ReconcileRule;
use outboxd::config::RetentionConfig;
use outboxd::ops::dead::{self, DeadFilter, DiscardError};
use outboxd::ops::reconcile::run_rule;
use outboxd::ops::retention::cleanup;
use outboxd::relay::StepOutcome;
use outboxd::store::Db;
use serde_json::json;

use crate::support::{ScriptedPublisher, TestDb, db, on_both};

async fn put(db: &Db, agg: &str, ty: &str) {
    db::put(db, agg, ty, json!({"email": "a@example.com"})).await;
}

/// SQL for "N days ago" on either database.
fn days_ago(t: &TestDb, days: i64) -> String {
    if t.is_postgres() {
        format!("now() - interval '{days} days'")
    } else {
        format!("(CAST(unixepoch('subsec') * 1000000 AS INTEGER) - {days} * 86400000000)")
    }
}

async fn retention_deletes_old_published_rows_in_batches_and_keeps_dead_ones(t: TestDb) {
    for i in 0..7 {
        put(&t.db, &format!("a{i}"), "x").await;
    }
    let old = days_ago(&t, 8);
    let recent = days_ago(&t, 1);
    let ancient = days_ago(&t, 40);
    t.exec(&format!(
        "UPDATE outbox SET published_at = {old} WHERE seq <= 5"
    ))
    .await;
    t.exec(&format!(
        "UPDATE outbox SET published_at = {recent} WHERE seq = 6"
    ))
    .await;
    t.exec(&format!(
        "UPDATE outbox SET dead_at = {ancient}, dead_reason = 'poison' WHERE seq = 7"
    ))
    .await;
    t.exec(&format!("INSERT INTO inbox (consumer, message_id, processed_at) VALUES ('c', '0b1f6a52-6d8c-4a39-9c1e-3f1d2a7c9e10', {ancient})")).await;
    t.exec(&format!("INSERT INTO inbox (consumer, message_id, processed_at) VALUES ('c', '1b1f6a52-6d8c-4a39-9c1e-3f1d2a7c9e10', {recent})")).await;

    let cfg = RetentionConfig {
        batch_size: 2,
        purge_payload_days: Some(0.5),
        ..RetentionConfig::default()
    };
    let report = cleanup(&t.db, &cfg, Utc::now()).await.expect("cleanup");
    assert_eq!(report.outbox_deleted, 5);
    assert_eq!(report.inbox_deleted, 1);
    assert!(
        report.statements > 5,
        "batches of 2 take several statements: {report:?}"
    );
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL")
            .await,
        1,
        "dead rows are kept"
    );
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE seq = 6 AND payload_purged_at IS NOT NULL")
            .await,
        1,
        "payload purged early"
    );
    let purged = if t.is_postgres() {
        "SELECT count(*) FROM outbox WHERE seq = 6 AND payload = 'null'::jsonb"
    } else {
        "SELECT count(*) FROM outbox WHERE seq = 6 AND payload = 'null'"
    };
    assert_eq!(t.count(purged).await, 1);
    assert_eq!(t.count("SELECT count(*) FROM inbox").await, 1);
    // A second run finds nothing to do.
    let again = cleanup(&t.db, &cfg, Utc::now())
        .await
        .expect("cleanup again");
    assert_eq!(
        (
            again.outbox_deleted,
            again.inbox_deleted,
            again.payloads_purged
        ),
        (0, 0, 0)
    );
}
on_both!(retention_deletes_old_published_rows_in_batches_and_keeps_dead_ones);

async fn dead_events_can_be_listed_redriven_and_discarded(t: TestDb) {
    put(&t.db, "a1", "order.confirmed").await;
    put(&t.db, "a1", "order.shipped").await;
    put(&t.db, "a2", "order.confirmed").await;
    let broker = ScriptedPublisher::failing();
    broker.permanent.store(true, Ordering::SeqCst);
    let relay = t.relay(broker.clone());
    relay.step().await.expect("step");
    let dead_now = dead::list(&t.db, &DeadFilter::default(), 10)
        .await
        .expect("list");
    assert_eq!(dead_now.len(), 2);
    assert_eq!(dead_now[0].aggregate_id, "a1");
    assert_eq!(dead_now[0].blocking, 1, "a1's second event waits");
    assert_eq!(dead_now[0].payload, json!({"email": "a@example.com"}));
    assert!(dead_now[0].dead_reason.contains("message too large"));
    let only_a2 = DeadFilter {
        aggregate_id: Some("a2".into()),
        ..DeadFilter::default()
    };
    assert_eq!(
        dead::list(&t.db, &only_a2, 10).await.expect("filter").len(),
        1
    );
    let by_type = DeadFilter {
        event_type: Some("order.*".into()),
        ..DeadFilter::default()
    };
    assert_eq!(
        dead::list(&t.db, &by_type, 10)
            .await
            .expect("pattern")
            .len(),
        2
    );

    // Redrive a1's head: it and then its successor publish.
    broker.set_failing(false);
    let n = dead::redrive(
        &t.db,
        &DeadFilter {
            seq: Some(dead_now[0].seq),
            ..DeadFilter::default()
        },
        Utc::now(),
    )
    .await
    .expect("redrive");
    assert_eq!(n, 1);
    while relay.step().await.expect("step") != StepOutcome::Idle {}
    let topics: Vec<_> = broker.sent().iter().map(|m| m.topic.clone()).collect();
    assert_eq!(topics, ["order.confirmed", "order.shipped"]);

    // Discard a2 with a reason: finished, not published, not counted as published.
    assert!(matches!(
        dead::discard(&t.db, dead_now[1].seq, " ", Utc::now()).await,
        Err(DiscardError::NoReason)
    ));
    dead::discard(
        &t.db,
        dead_now[1].seq,
        "customer deleted; event obsolete",
        Utc::now(),
    )
    .await
    .expect("discard");
    assert!(matches!(
        dead::discard(&t.db, dead_now[1].seq, "again", Utc::now()).await,
        Err(DiscardError::NotDead(_))
    ));
    assert_eq!(
        t.count(
            "SELECT count(*) FROM outbox WHERE discard_reason = 'customer deleted; event obsolete'"
        )
        .await,
        1
    );
    let stats = outboxd::store::OutboxStore::stats(&relay.store().clone(), Utc::now())
        .await
        .expect("stats");
    assert_eq!((stats.dead, stats.pending, stats.published), (0, 0, 2));
}
on_both!(dead_events_can_be_listed_redriven_and_discarded);

async fn reconciliation_finds_and_enqueues_events_a_fixup_script_skipped(t: TestDb) {
    outboxd_demo::orders::create_schema(&t.db)
        .await
        .expect("orders");
    for i in 0..3 {
        outboxd_demo::orders::create_order(&t.db, &format!("o{i}"), "c", 100)
            .await
            .expect("order");
    }
    let svc = outboxd_demo::orders::OrderService::new(t.db.clone());
    svc.confirm_order(&outboxd_demo::orders::ConfirmOrder {
        order_id: "o0".into(),
        operation_key: None,
    })
    .await
    .expect("confirm");
    // A fix-up script confirms o1 and o2 behind confirm_order's back.
    t.exec("UPDATE orders SET status = 'confirmed' WHERE id IN ('o1', 'o2')")
        .await;
    let payload = if t.is_postgres() {
        "json_build_object('order_id', o.id, 'customer_id', o.customer_id, 'total_cents', o.total_cents)::text"
    } else {
        "json_object('order_id', o.id, 'customer_id', o.customer_id, 'total_cents', o.total_cents)"
    };
    let rule = ReconcileRule {
        name: "confirmed-orders".into(),
        query: format!(
            "SELECT o.id, 'order.confirmed', {payload} FROM orders o WHERE o.status = 'confirmed'
               AND NOT EXISTS (SELECT 1 FROM outbox e WHERE e.aggregate_id = o.id AND e.event_type = 'order.confirmed')
             ORDER BY o.id"
        ),
        enqueue_missing: false,
    };
    let report = run_rule(&t.db, &rule, false).await.expect("report");
    assert_eq!(
        (report.missing, report.enqueued, report.samples.clone()),
        (2, 0, vec!["o1".to_string(), "o2".to_string()])
    );
    assert_eq!(
        t.count("SELECT count(*) FROM outbox").await,
        1,
        "report only"
    );
    let fixed = run_rule(&t.db, &rule, true).await.expect("enqueue");
    assert_eq!(fixed.enqueued, 2);
    assert_eq!(
        run_rule(&t.db, &rule, false).await.expect("again").missing,
        0
    );
    assert_eq!(t.count("SELECT count(*) FROM outbox").await, 3);
}
on_both!(reconciliation_finds_and_enqueues_events_a_fixup_script_skipped);

async fn transport_retention_never_drops_what_a_group_has_not_consumed(t: TestDb) {
    use outboxd::broker::Publisher;
    use outboxd::broker::embedded::EmbeddedPublisher;
    let p = EmbeddedPublisher::new(t.db.clone(), 1);
    for i in 0..4 {
        p.publish(outboxd::message::OutgoingMessage {
            topic: "t".into(),
            key: b"k".to_vec(),
            payload: format!("{i}").into_bytes(),
            headers: vec![],
            message_id: uuid::Uuid::new_v4(),
            created_at: Utc::now(),
        })
        .await
        .expect("publish");
    }
    let old = days_ago(&t, 10);
    t.exec(&format!(
        "UPDATE transport_messages SET published_at = {old}"
    ))
    .await;
    // Group a consumed two messages, group b none yet... b has no cursor row,
    // so only what every existing cursor passed may go.
    t.exec("INSERT INTO transport_cursors (consumer_group, topic, partition, last_offset) VALUES ('a', 't', 0, 2), ('b', 't', 0, 1)").await;
    let report = cleanup(&t.db, &RetentionConfig::default(), Utc::now())
        .await
        .expect("cleanup");
    assert_eq!(
        report.transport_deleted, 1,
        "only offset 1, which both groups passed"
    );
    assert_eq!(t.count("SELECT count(*) FROM transport_messages").await, 3);
}
on_both!(transport_retention_never_drops_what_a_group_has_not_consumed);
