//! The crash matrix: a crash at each durable boundary from the producer's
//! transaction to the relay's mark (before the transaction, between insert
//! and commit, between commit and reply, between publish and mark, after
//! the mark), one test per boundary, with the fault armed at the exact
//! point. Each test checks what is durable after the "crash" and that the
//! retry or the next relay step converges without loss.

use outboxd::consumer::{Processed, process};
use outboxd::fault::{FaultAction, FaultPoint, Faults};
use outboxd::relay::{RelayError, StepOutcome};
use outboxd_demo::billing::{self, BillingHandler};
use outboxd_demo::orders::{self, ConfirmOrder, ConfirmOutcome, OrderError, OrderService};

use crate::support::{ScriptedPublisher, TestDb, on_both};

fn keyed(order: &str, key: &str) -> ConfirmOrder {
    ConfirmOrder {
        order_id: order.into(),
        operation_key: Some(("tenant-a".into(), key.into())),
    }
}

async fn service(t: &TestDb, point: FaultPoint) -> (OrderService, OrderService) {
    orders::create_schema(&t.db).await.expect("schema");
    orders::create_order(&t.db, "o1", "c1", 1234)
        .await
        .expect("order");
    let faulty =
        OrderService::new(t.db.clone()).with_faults(Faults::arm(point, FaultAction::Error, 1));
    (faulty, OrderService::new(t.db.clone()))
}

fn is_fault(r: Result<ConfirmOutcome, OrderError>, point: FaultPoint) {
    match r {
        Err(OrderError::Fault(f)) => assert_eq!(f.0, point),
        other => panic!(
            "expected the injected fault at {}, got {other:?}",
            point.name()
        ),
    }
}

async fn crash_before_transaction_leaves_nothing_and_client_retries(t: TestDb) {
    let (faulty, healthy) = service(&t, FaultPoint::BeforeTransaction).await;
    is_fault(
        faulty.confirm_order(&keyed("o1", "k1")).await,
        FaultPoint::BeforeTransaction,
    );
    assert_eq!(t.count("SELECT count(*) FROM outbox").await, 0);
    assert_eq!(
        t.count("SELECT count(*) FROM orders WHERE status = 'confirmed'")
            .await,
        0
    );
    assert!(matches!(
        healthy
            .confirm_order(&keyed("o1", "k1"))
            .await
            .expect("retry"),
        ConfirmOutcome::Confirmed(_)
    ));
    assert_eq!(t.count("SELECT count(*) FROM outbox").await, 1);
}
on_both!(crash_before_transaction_leaves_nothing_and_client_retries);

async fn crash_after_insert_before_commit_rolls_back_both(t: TestDb) {
    let (faulty, healthy) = service(&t, FaultPoint::AfterInsertBeforeCommit).await;
    is_fault(
        faulty.confirm_order(&keyed("o1", "k1")).await,
        FaultPoint::AfterInsertBeforeCommit,
    );
    assert_eq!(
        t.count("SELECT count(*) FROM outbox").await,
        0,
        "the event rolled back"
    );
    assert_eq!(
        t.count("SELECT count(*) FROM orders WHERE status = 'confirmed'")
            .await,
        0,
        "the order rolled back"
    );
    assert!(matches!(
        healthy
            .confirm_order(&keyed("o1", "k1"))
            .await
            .expect("retry"),
        ConfirmOutcome::Confirmed(_)
    ));
    assert_eq!(t.count("SELECT count(*) FROM outbox").await, 1);
}
on_both!(crash_after_insert_before_commit_rolls_back_both);

async fn crash_after_commit_before_reply_is_recovered_by_the_same_key(t: TestDb) {
    let (faulty, healthy) = service(&t, FaultPoint::AfterCommitBeforeReply).await;
    is_fault(
        faulty.confirm_order(&keyed("o1", "k1")).await,
        FaultPoint::AfterCommitBeforeReply,
    );
    assert_eq!(
        t.count("SELECT count(*) FROM outbox").await,
        1,
        "durable although the client saw an error"
    );
    let ConfirmOutcome::Repeat(id) = healthy
        .confirm_order(&keyed("o1", "k1"))
        .await
        .expect("retry")
    else {
        panic!("the retry must be recognised as a repeat")
    };
    assert_eq!(
        t.count("SELECT count(*) FROM outbox").await,
        1,
        "no second event"
    );
    let stored = t
        .count(&format!("SELECT count(*) FROM outbox WHERE id = '{id}'"))
        .await;
    assert_eq!(stored, 1, "the repeat returns the first event's id");
}
on_both!(crash_after_commit_before_reply_is_recovered_by_the_same_key);

async fn crash_after_publish_before_mark_republishes_and_the_receiver_deduplicates(t: TestDb) {
    let (_, healthy) = service(&t, FaultPoint::AfterPublishBeforeMark).await;
    billing::create_schema(&t.db).await.expect("billing");
    healthy
        .confirm_order(&keyed("o1", "k1"))
        .await
        .expect("confirm");
    let broker = ScriptedPublisher::new();
    let crashing = t.relay(broker.clone()).with_faults(Faults::arm(
        FaultPoint::AfterPublishBeforeMark,
        FaultAction::Error,
        1,
    ));
    assert!(matches!(crashing.step().await, Err(RelayError::Fault(_))));
    assert_eq!(broker.sent().len(), 1, "it reached the broker");
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .await,
        1,
        "but is still pending"
    );

    // A crashed SQLite relay's lease has to expire; skip that wait here.
    t.make_all_due().await;
    let relay = t.relay(broker.clone());
    assert!(matches!(
        relay.step().await.expect("step"),
        StepOutcome::Published(_)
    ));
    let sent = broker.sent();
    assert_eq!(sent.len(), 2, "published again: at least once");
    assert_eq!(
        sent[0].message_id, sent[1].message_id,
        "with the same message id"
    );

    let deliveries: Vec<_> = sent
        .iter()
        .enumerate()
        .map(|(i, m)| outboxd::message::Delivery {
            attempt: 0,
            topic: m.topic.clone(),
            partition: 0,
            offset: i as i64,
            key: Some(m.key.clone()),
            payload: m.payload.clone(),
            headers: m.headers.clone(),
        })
        .collect();
    assert_eq!(
        process(&t.db, "billing", &deliveries[0], &BillingHandler)
            .await
            .expect("1st"),
        Processed::Handled
    );
    assert_eq!(
        process(&t.db, "billing", &deliveries[1], &BillingHandler)
            .await
            .expect("2nd"),
        Processed::Duplicate
    );
    assert_eq!(
        t.count("SELECT count(*) FROM invoices").await,
        1,
        "one invoice"
    );
}
on_both!(crash_after_publish_before_mark_republishes_and_the_receiver_deduplicates);

async fn crash_after_mark_does_not_republish(t: TestDb) {
    let (_, healthy) = service(&t, FaultPoint::AfterMark).await;
    healthy
        .confirm_order(&keyed("o1", "k1"))
        .await
        .expect("confirm");
    let broker = ScriptedPublisher::new();
    let crashing = t.relay(broker.clone()).with_faults(Faults::arm(
        FaultPoint::AfterMark,
        FaultAction::Error,
        1,
    ));
    assert!(matches!(crashing.step().await, Err(RelayError::Fault(_))));
    t.make_all_due().await;
    let relay = t.relay(broker.clone());
    assert_eq!(relay.step().await.expect("step"), StepOutcome::Idle);
    assert_eq!(broker.sent().len(), 1);
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
            .await,
        1
    );
}
on_both!(crash_after_mark_does_not_republish);
