//! Bad input at the Kafka door, on librdkafka's mock cluster: messages with
//! no message-id header, a message id that is not UTF-8 or not a uuid,
//! keys and payloads that are not UTF-8, and malformed JSON. Each is
//! dead-lettered with its reason (in `consumer_dead_letters` and on
//! `<topic>.dlq`, key and payload kept byte for byte), and the good
//! messages of the same partition are handled after them. An oversized
//! event is dead at once on the way out; a read-only inbox keeps its
//! message until it can be written.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use outboxd::broker::MessageSource;
use outboxd::broker::Publisher;
use outboxd::broker::kafka::{KafkaConsumer, KafkaConsumerConfig, KafkaPublisher};
use outboxd::clock::SystemClock;
use outboxd::config::OnDead;
use outboxd::consumer::Consumer;
use outboxd::consumer::ConsumerConfig;
use outboxd::message::OutgoingMessage;
use outboxd::message::headers;
use outboxd::relay::Relay;
use outboxd::relay::RelayConfig;
use outboxd::relay::StepOutcome;
use outboxd::route::Route;
use outboxd::route::Router;
use outboxd::store::Db;
use outboxd_demo::billing::{BillingHandler, create_schema};
use rdkafka::mocking::MockCluster;
use serde_json::json;
use sqlx::Row;

use crate::support::db::{put, read_only, set_read_only};
use crate::support::{TestDb, eventually, on_both};

fn props(bootstrap: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("bootstrap.servers".to_string(), bootstrap.to_string())])
}

/// A raw message: exactly these key, payload and headers.
fn raw(key: &[u8], payload: &[u8], message_id: Option<&[u8]>) -> OutgoingMessage {
    let mut hdrs = vec![(headers::EVENT_TYPE.to_string(), b"order.confirmed".to_vec())];
    if let Some(id) = message_id {
        hdrs.push((headers::MESSAGE_ID.to_string(), id.to_vec()));
    }
    OutgoingMessage {
        topic: "orders".into(),
        key: key.to_vec(),
        payload: payload.to_vec(),
        headers: hdrs,
        message_id: uuid::Uuid::new_v4(),
        created_at: chrono::Utc::now(),
    }
}

fn order(n: u32) -> Vec<u8> {
    format!(r#"{{"order_id":"o{n}","customer_id":"c","total_cents":100}}"#).into_bytes()
}

struct DeadLetter {
    message_id: Option<String>,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    error: String,
}

async fn dead_letters(t: &TestDb) -> Vec<DeadLetter> {
    let sql = "SELECT message_id, message_key, payload, error FROM consumer_dead_letters ORDER BY \"offset\"";
    match &t.db {
        Db::Postgres(p) => sqlx::query(sql)
            .fetch_all(p)
            .await
            .expect(sql)
            .iter()
            .map(|r| DeadLetter {
                message_id: r.get::<Option<uuid::Uuid>, _>(0).map(|u| u.to_string()),
                key: r.get(1),
                payload: r.get(2),
                error: r.get(3),
            })
            .collect(),
        Db::Sqlite(p) => sqlx::query(sql)
            .fetch_all(p)
            .await
            .expect(sql)
            .iter()
            .map(|r| DeadLetter {
                message_id: r.get(0),
                key: r.get(1),
                payload: r.get(2),
                error: r.get(3),
            })
            .collect(),
    }
}

async fn bad_kafka_messages_are_dead_lettered_and_the_partition_moves_on(t: TestDb) {
    create_schema(&t.db).await.expect("invoices table");
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic("orders", 1, 1).expect("topic");
    mock.create_topic("orders.dlq", 1, 1).expect("dlq topic");
    let bootstrap = mock.bootstrap_servers();
    let producer = Arc::new(
        KafkaPublisher::new(&props(&bootstrap), Duration::from_secs(10)).expect("producer"),
    );
    let good_id = uuid::Uuid::new_v4().to_string();
    let binary_key_id = uuid::Uuid::new_v4().to_string();
    let malformed_id = uuid::Uuid::new_v4().to_string();
    let messages = [
        raw(b"k", &order(1), None),                // 0: no message id
        raw(b"k", &order(2), Some(&[0xff, 0xfe])), // 1: id not UTF-8
        raw(b"k", &order(3), Some(b"not-a-uuid")), // 2: id not a uuid
        raw(
            &[0xff, 0x00, 0x80],
            &order(4),
            Some(binary_key_id.as_bytes()),
        ), // 3: binary key, fine
        raw(
            &[0xc3, 0x28],
            b"{\"order_id\": ",
            Some(malformed_id.as_bytes()),
        ), // 4: malformed
        raw(
            b"k",
            &[0xff, 0xfe, 0xfd],
            Some(uuid::Uuid::new_v4().to_string().as_bytes()),
        ), // 5: not UTF-8
        raw(b"k", &order(6), Some(good_id.as_bytes())), // 6: fine
    ];
    for m in messages {
        producer.publish(m).await.expect("produce");
    }

    let source = KafkaConsumer::new(
        &props(&bootstrap),
        KafkaConsumerConfig::new("billing", vec!["orders".into()]),
    )
    .expect("consumer");
    let dlq = producer.clone();
    let config = ConsumerConfig {
        name: "billing".into(),
        handler_id: "builtin:billing".into(),
        // Every message has key `k`: this test is about the partition
        // moving on past bad input (parking is consumer/parking.rs's).
        on_dead: OnDead::Skip,
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::new(t.db.clone(), source, Arc::new(BillingHandler), config)
        .with_dead_letter_topic(Arc::new(move |m| {
            let dlq = dlq.clone();
            Box::pin(async move { dlq.publish(m).await })
        }));
    let stats = consumer.stats();
    use std::sync::atomic::Ordering::SeqCst;
    eventually(
        Duration::from_secs(30),
        "the consumer did not get through the partition",
        async || {
            let through = stats.handled.load(SeqCst) + stats.dead_lettered.load(SeqCst);
            if through >= 7 {
                return Ok(());
            }
            consumer.step().await.expect("step");
            Err(format!("{through} of 7 handled or dead-lettered"))
        },
    )
    .await;
    assert_eq!(
        stats.handled.load(SeqCst),
        2,
        "the good messages after the bad ones"
    );
    assert_eq!(stats.dead_lettered.load(SeqCst), 5);
    assert_eq!(t.count("SELECT count(*) FROM invoices").await, 2);
    assert_eq!(
        t.count("SELECT count(*) FROM inbox WHERE consumer = 'billing'")
            .await,
        2
    );

    let dead = dead_letters(&t).await;
    assert_eq!(dead.len(), 5);
    let reasons: Vec<&str> = dead.iter().map(|d| d.error.as_str()).collect();
    assert!(
        reasons[0].contains("orders/0@0: no `message-id` header"),
        "{}",
        reasons[0]
    );
    assert!(
        reasons[1].contains("orders/0@1: `message-id` header is not UTF-8"),
        "{}",
        reasons[1]
    );
    assert!(
        reasons[2].contains("`message-id` header `not-a-uuid` is not a uuid"),
        "{}",
        reasons[2]
    );
    for (d, offset) in dead[3..].iter().zip([4, 5]) {
        assert!(
            d.error.contains(&format!(
                "orders/0@{offset}: payload is not an order.confirmed event"
            )),
            "{}",
            d.error
        );
    }
    assert_eq!(dead[0].message_id, None);
    assert_eq!(dead[3].message_id.as_deref(), Some(malformed_id.as_str()));
    // Nothing is lost: key and payload are kept as the bytes that came in.
    assert_eq!(dead[3].key.as_deref(), Some(&[0xc3, 0x28][..]));
    assert_eq!(dead[3].payload, b"{\"order_id\": ");
    assert_eq!(dead[4].payload, vec![0xff, 0xfe, 0xfd]);

    // The same five, with the reason, on orders.dlq.
    let mut dlq_source = KafkaConsumer::new(
        &props(&bootstrap),
        KafkaConsumerConfig::new("dlq-reader", vec!["orders.dlq".into()]),
    )
    .expect("dlq reader");
    let seen = eventually(
        Duration::from_secs(30),
        "the five dead letters on orders.dlq",
        async || {
            let seen = dlq_source.fetch(100).await.expect("fetch dlq");
            if seen.len() >= 5 {
                Ok(seen)
            } else {
                Err(format!("orders.dlq has {} of 5", seen.len()))
            }
        },
    )
    .await;
    assert_eq!(seen.len(), 5);
    assert_eq!(seen[3].key.as_deref(), Some(&[0xc3, 0x28][..]));
    for (m, d) in seen.iter().zip(&dead) {
        assert_eq!(m.header("dlq-error"), Some(d.error.as_bytes()));
    }
    // Every offset is committed: nothing is delivered again.
    assert_eq!(consumer.step().await.expect("step").handled(), 0);
}
on_both!(bad_kafka_messages_are_dead_lettered_and_the_partition_moves_on);

/// librdkafka refuses a message over `message.max.bytes` (1 MB) before it
/// is sent: a permanent error, so the event is dead at once with the reason
/// and the events beside it are published.
async fn an_oversized_event_is_dead_at_once_and_the_rest_are_published(t: TestDb) {
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic("orders", 1, 1).expect("topic");
    let publisher = KafkaPublisher::new(&props(&mock.bootstrap_servers()), Duration::from_secs(10))
        .expect("publisher");
    put(
        &t.db,
        "big",
        "order.placed",
        json!({"blob": "x".repeat(2 << 20)}),
    )
    .await;
    put(&t.db, "small", "order.placed", json!({"n": 1})).await;
    let relay = Relay::new(
        t.store(),
        publisher,
        Router::new(vec![Route::new("order.*", "orders")]),
        RelayConfig::default(),
        Arc::new(SystemClock),
    );
    let StepOutcome::Published(report) = relay.step().await.expect("step") else {
        panic!("idle");
    };
    assert_eq!((report.published, report.dead, report.retried), (1, 1, 0));
    assert_eq!(
        t.count(
            "SELECT count(*) FROM outbox WHERE aggregate_id = 'big' AND attempts = 1 \
             AND dead_reason LIKE 'permanent broker error: topic `orders`: %size too large%'"
        )
        .await,
        1,
        "dead at once, with the reason"
    );
    assert_eq!(
        t.count(
            "SELECT count(*) FROM outbox WHERE aggregate_id = 'small' AND published_at IS NOT NULL"
        )
        .await,
        1
    );
}
on_both!(an_oversized_event_is_dead_at_once_and_the_rest_are_published);

/// The inbox cannot be written: the message fails, past `max_attempts`
/// too (its dead letter cannot be written either), so it is neither
/// dead-lettered nor committed. Once the database is writable the same
/// message is handled: nothing is lost.
async fn a_read_only_inbox_keeps_the_message_until_it_can_be_written(t: TestDb) {
    create_schema(&t.db).await.expect("invoices table");
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic("orders", 1, 1).expect("topic");
    let bootstrap = mock.bootstrap_servers();
    let producer =
        KafkaPublisher::new(&props(&bootstrap), Duration::from_secs(10)).expect("producer");
    let id = uuid::Uuid::new_v4().to_string();
    producer
        .publish(raw(b"k", &order(1), Some(id.as_bytes())))
        .await
        .expect("produce");
    let config = ConsumerConfig {
        name: "billing".into(),
        handler_id: "builtin:billing".into(),
        max_attempts: 2,
        ..ConsumerConfig::default()
    };
    // The first member does not leave the group when dropped; a short
    // session lets the second take the partition over sooner.
    let mut member = props(&bootstrap);
    member.insert("session.timeout.ms".into(), "6000".into());
    member.insert("heartbeat.interval.ms".into(), "500".into());
    let consumer_on = |db: Db| {
        let source = KafkaConsumer::new(
            &member,
            KafkaConsumerConfig::new("billing", vec!["orders".into()]),
        )
        .expect("consumer");
        Consumer::new(db, source, Arc::new(BillingHandler), config.clone())
    };
    use std::sync::atomic::Ordering::SeqCst;

    let ro = read_only(&t).await;
    let mut consumer = consumer_on(ro.clone());
    let stats = consumer.stats();
    eventually(
        Duration::from_secs(30),
        "the message was not delivered",
        async || {
            let failed = stats.failed.load(SeqCst);
            if failed >= 4 {
                return Ok(());
            }
            consumer.step().await.expect("step");
            Err(format!("{failed} failed attempts"))
        },
    )
    .await;
    assert_eq!(stats.handled.load(SeqCst), 0);
    assert_eq!(
        stats.dead_lettered.load(SeqCst),
        0,
        "no dead letter could be written"
    );
    drop(consumer);
    ro.close().await;

    if t.is_postgres() {
        set_read_only(&t, false).await;
    }
    let rw = Db::connect(&t.url, 2).await.expect("connect");
    let mut consumer = consumer_on(rw);
    let stats = consumer.stats();
    eventually(
        Duration::from_secs(60),
        "the message was not redelivered",
        async || {
            if stats.handled.load(SeqCst) >= 1 {
                return true;
            }
            consumer.step().await.expect("step");
            false
        },
    )
    .await;
    assert_eq!(t.count("SELECT count(*) FROM invoices").await, 1);
    assert_eq!(
        t.count("SELECT count(*) FROM consumer_dead_letters").await,
        0
    );
}
on_both!(a_read_only_inbox_keeps_the_message_until_it_can_be_written);
