//! The whole pipeline over NATS JetStream, RabbitMQ and Redis Streams with real
//! processes, on both databases: a relay SIGKILLed between publish and
//! mark, a consumer SIGKILLed after its effect and before its ack, then a
//! relay and two consumer processes of one group. Every message has
//! exactly one effect, and each key's effects commit in the order its
//! events did.

use std::process::Stdio;
use std::time::Duration;

use outboxd::event::NewEvent;
use serde_json::json;
use tokio::process::Child;

use crate::support::TestDb;
use crate::support::kafka::Way;
use crate::support::process::{kill_at_fault, outboxd_with_billing, terminate};

const ORDERS: usize = 20;
const AMOUNTS: i64 = 10;

/// An `outboxd run` of the example's binary on `via`: relay only
/// (`consumers = false`) or consumer only.
fn run(t: &TestDb, via: &Way, consumers: bool, fault: Option<&str>) -> Child {
    let mut cmd = outboxd_with_billing(t);
    cmd.arg("run");
    via.configure_transport(&mut cmd);
    // A route naming the topic, so the relay's start creates its stream or
    // queues too (the default route's topics are known only per event).
    cmd.env(
        "OUTBOXD__ROUTES",
        format!(r#"[{{event_type = "{0}", topic = "{0}"}}]"#, via.topic),
    );
    if consumers {
        cmd.env("OUTBOXD__RELAY__WORKERS", "0").env(
            "OUTBOXD__CONSUMERS",
            format!(
                r#"[{{name = "{}", topics = ["{}"], handler = "builtin:billing"}}]"#,
                via.consumer, via.topic
            ),
        );
    }
    match fault {
        // Errors only, so the unread pipe never fills before the fault.
        Some(f) => cmd
            .env("OUTBOXD_FAULT", f)
            .env("OUTBOXD_LOG", "error")
            .stderr(Stdio::piped()),
        None => cmd.stderr(Stdio::null()),
    };
    cmd.spawn().expect("spawn outboxd run")
}

/// Each order's invoice amounts in the order they were written.
async fn amounts(t: &TestDb, order: &str) -> Vec<i64> {
    let sql = format!("SELECT amount_cents FROM invoices WHERE order_id = '{order}' ORDER BY id");
    match &t.db {
        outboxd::store::Db::Postgres(p) => sqlx::query_scalar(&sql).fetch_all(p).await,
        outboxd::store::Db::Sqlite(p) => sqlx::query_scalar(&sql).fetch_all(p).await,
    }
    .expect("invoices")
}

async fn survives_a_relay_and_a_consumer_killed(t: TestDb, via: Way) {
    outboxd_demo::billing::create_schema(&t.db)
        .await
        .expect("billing schema");
    // Ten events per order, interleaved across orders: each order's
    // amounts must reach billing as 1, 2, ... 10.
    for amount in 1..=AMOUNTS {
        for o in 0..ORDERS {
            let order = format!("order-{o}");
            t.enqueue(NewEvent::new(
                order.as_str(),
                via.topic.as_str(),
                json!({ "order_id": order, "customer_id": "c", "total_cents": amount }),
            ))
            .await;
        }
    }
    let total = ORDERS as i64 * AMOUNTS;
    // A relay killed after the broker acknowledged a batch and before it
    // marked the rows: the next relay publishes that batch again.
    kill_at_fault(run(
        &t,
        &via,
        false,
        Some("after-publish-before-mark:hang:3"),
    ))
    .await;
    let marked = t
        .count("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
        .await;
    assert!(
        marked < total,
        "the killed relay left rows unmarked ({marked})"
    );
    let mut relay = run(&t, &via, false, None);
    // A consumer killed after its effects committed and before the broker
    // heard its ack: those messages come again, and the inbox drops them.
    kill_at_fault(run(
        &t,
        &via,
        true,
        Some("after-handle-before-commit-offset:hang:3"),
    ))
    .await;
    assert!(
        t.count("SELECT count(*) FROM invoices").await > 0,
        "the killed consumer committed effects"
    );
    // Two consumer processes of one group take over.
    let mut a = run(&t, &via, true, None);
    let mut b = run(&t, &via, true, None);
    t.wait_count(
        Duration::from_secs(120),
        "SELECT count(DISTINCT message_id) FROM invoices",
        total,
    )
    .await;
    // Anything still in flight settles before the counts are read.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    terminate(&mut a).await;
    terminate(&mut b).await;
    terminate(&mut relay).await;
    assert_eq!(
        t.count("SELECT count(*) FROM invoices").await,
        total,
        "exactly one effect per message"
    );
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .await,
        0,
        "every event marked published"
    );
    for o in 0..ORDERS {
        let order = format!("order-{o}");
        assert_eq!(
            amounts(&t, &order).await,
            (1..=AMOUNTS).collect::<Vec<_>>(),
            "{order}'s effects in its events' order"
        );
    }
}

mod nats_survives_a_relay_and_a_consumer_killed {
    use super::{TestDb, Way, survives_a_relay_and_a_consumer_killed};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        let t = TestDb::postgres().await;
        survives_a_relay_and_a_consumer_killed(t, Way::nats("order.confirmed", "billing")).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        let t = TestDb::sqlite().await;
        survives_a_relay_and_a_consumer_killed(t, Way::nats("order.confirmed", "billing")).await
    }
}

mod rabbitmq_survives_a_relay_and_a_consumer_killed {
    use super::{TestDb, Way, survives_a_relay_and_a_consumer_killed};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        let t = TestDb::postgres().await;
        survives_a_relay_and_a_consumer_killed(t, Way::rabbitmq("order.confirmed", "billing")).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        let t = TestDb::sqlite().await;
        survives_a_relay_and_a_consumer_killed(t, Way::rabbitmq("order.confirmed", "billing")).await
    }
}

mod redis_survives_a_relay_and_a_consumer_killed {
    use super::{TestDb, Way, survives_a_relay_and_a_consumer_killed};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        let t = TestDb::postgres().await;
        survives_a_relay_and_a_consumer_killed(t, Way::redis("order.confirmed", "billing")).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        let t = TestDb::sqlite().await;
        survives_a_relay_and_a_consumer_killed(t, Way::redis("order.confirmed", "billing")).await
    }
}
