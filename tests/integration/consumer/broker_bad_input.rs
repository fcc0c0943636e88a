//! Bad input from NATS and RabbitMQ: a message with no message id or one
//! that is not a uuid (another producer's, on the same stream or queue) is
//! dead-lettered with its reason and the partition moves on, never
//! dropped; a payload over NATS's max_payload is a permanent publish error
//! naming the limit, so the relay marks the event dead.

use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use outboxd::broker::nats::{NatsConsumer, NatsConsumerConfig, NatsPublisher};
use outboxd::broker::rabbitmq::{RabbitConsumer, RabbitConsumerConfig};
use outboxd::broker::{MessageSource, PublishError, Publisher};
use outboxd::config::{NatsSection, OnDead, RabbitSection, RabbitUrl};
use outboxd::consumer::{Consumer, ConsumerConfig};
use outboxd::message::{OutgoingMessage, headers};
use outboxd_demo::billing::{BillingHandler, create_schema};

use crate::support::brokers::{Cleanup, nats_url, rabbitmq_url};
use crate::support::{TestDb, eventually, on_both};

fn order(n: u32) -> Vec<u8> {
    format!(r#"{{"order_id":"o{n}","customer_id":"c","total_cents":100}}"#).into_bytes()
}

/// Runs `consumer` until three messages are through, then checks: one
/// handled, two dead-lettered with their reasons.
async fn two_dead_one_handled<S: MessageSource + Send + Sync + 'static>(t: &TestDb, source: S) {
    let config = ConsumerConfig {
        name: "billing".into(),
        handler_id: "builtin:billing".into(),
        on_dead: OnDead::Skip,
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::new(t.db.clone(), source, Arc::new(BillingHandler), config);
    let stats = consumer.stats();
    eventually(Duration::from_secs(30), "3 messages through", async || {
        let through = stats.handled.load(SeqCst) + stats.dead_lettered.load(SeqCst);
        if through >= 3 {
            return Ok(());
        }
        consumer.step().await.expect("step");
        Err(format!("{through} of 3 handled or dead-lettered"))
    })
    .await;
    assert_eq!(
        stats.handled.load(SeqCst),
        1,
        "the good message after the bad ones"
    );
    assert_eq!(stats.dead_lettered.load(SeqCst), 2);
    assert_eq!(t.count("SELECT count(*) FROM invoices").await, 1);
    let sql = "SELECT error FROM consumer_dead_letters ORDER BY \"offset\"";
    let reasons: Vec<String> = match &t.db {
        outboxd::store::Db::Postgres(p) => sqlx::query_scalar(sql).fetch_all(p).await,
        outboxd::store::Db::Sqlite(p) => sqlx::query_scalar(sql).fetch_all(p).await,
    }
    .expect("dead letters");
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(reasons[0].contains("no `message-id` header"), "{reasons:?}");
    assert!(
        reasons[1].contains("`not-a-uuid` is not a uuid"),
        "{reasons:?}"
    );
    let _ = consumer.source_mut().release().await;
}

async fn rabbitmq_messages_without_a_usable_id_are_dead_lettered(t: TestDb) {
    create_schema(&t.db).await.expect("invoices");
    let topic = format!("t.bad.{}", uuid::Uuid::new_v4().simple());
    let _cleanup = Cleanup::rabbitmq(&rabbitmq_url(), &topic);
    let section = RabbitSection {
        url: RabbitUrl(rabbitmq_url()),
        fetch_wait: Duration::from_millis(100),
        ..RabbitSection::default()
    };
    outboxd::broker::rabbitmq::start(
        &section,
        &std::collections::BTreeSet::from([topic.clone()]),
        1,
        Some(1),
    )
    .await
    .expect("topology");
    // Another producer's messages, straight through AMQP: no message id at
    // all, an id that is no uuid, then a good one.
    let conn = Connection::connect(&rabbitmq_url(), ConnectionProperties::default())
        .await
        .expect("connect");
    let ch = conn.create_channel().await.expect("channel");
    let with_id = |id: &str| {
        let mut h = lapin::types::FieldTable::default();
        h.insert(
            headers::MESSAGE_ID.into(),
            lapin::types::AMQPValue::LongString(id.into()),
        );
        BasicProperties::default().with_headers(h)
    };
    let good = uuid::Uuid::new_v4().to_string();
    for (n, props) in [
        (1, BasicProperties::default()),
        (2, with_id("not-a-uuid")),
        (3, with_id(&good)),
    ] {
        ch.basic_publish(
            topic.as_str().into(),
            "0".into(),
            BasicPublishOptions::default(),
            &order(n),
            props,
        )
        .await
        .expect("publish");
    }
    let source = RabbitConsumer::new(
        section,
        RabbitConsumerConfig {
            group: "billing".into(),
            topics: vec![topic.clone()],
            partitions: 1,
            prefetch: 10,
            fetch_wait: Duration::from_millis(100),
        },
    );
    two_dead_one_handled(&t, source).await;
    let _ = conn.close(200, "done".into()).await;
}
on_both!(rabbitmq_messages_without_a_usable_id_are_dead_lettered);

fn raw(topic: &str, n: u32, message_id: Option<&str>) -> OutgoingMessage {
    let mut hdrs = vec![];
    if let Some(id) = message_id {
        hdrs.push((headers::MESSAGE_ID.to_string(), id.as_bytes().to_vec()));
    }
    OutgoingMessage {
        topic: topic.into(),
        key: b"k".to_vec(),
        payload: order(n),
        headers: hdrs,
        message_id: uuid::Uuid::new_v4(),
        created_at: chrono::Utc::now(),
    }
}

async fn nats_messages_without_a_usable_id_are_dead_lettered(t: TestDb) {
    create_schema(&t.db).await.expect("invoices");
    let topic = format!("t.bad.{}", uuid::Uuid::new_v4().simple());
    let _cleanup = Cleanup::nats(&nats_url(), &topic);
    let section = NatsSection {
        url: nats_url(),
        ..NatsSection::default()
    };
    let client = outboxd::broker::nats::start(
        &section,
        &std::collections::BTreeSet::from([topic.clone()]),
        Some(1),
    )
    .await
    .expect("stream");
    let p = NatsPublisher::new(client.clone(), 1, Duration::from_secs(5));
    let good = uuid::Uuid::new_v4().to_string();
    for m in [
        raw(&topic, 1, None),
        raw(&topic, 2, Some("not-a-uuid")),
        raw(&topic, 3, Some(&good)),
    ] {
        p.publish(m).await.expect("publish");
    }
    // Over the server's max_payload (1 MiB by default): permanent, named.
    let mut big = raw(&topic, 4, Some(&uuid::Uuid::new_v4().to_string()));
    big.payload = vec![b'x'; 2 << 20];
    match p.publish(big).await {
        Err(e @ PublishError::Permanent(_)) => {
            assert!(e.to_string().contains("max_payload"), "{e}")
        }
        other => panic!("expected a permanent error, got {other:?}"),
    }
    let source = NatsConsumer::new(
        t.db.clone(),
        client,
        NatsConsumerConfig {
            group: "billing".into(),
            topics: vec![topic.clone()],
            partitions: 1,
            lease: Duration::from_secs(15),
            ack_wait: Duration::from_secs(30),
            fetch_wait: Duration::from_millis(100),
            batch: 10,
        },
    );
    two_dead_one_handled(&t, source).await;
}
on_both!(nats_messages_without_a_usable_id_are_dead_lettered);
