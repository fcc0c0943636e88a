use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::StreamExt;

use lapin::options::{
    BasicConsumeOptions, ExchangeDeclareOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use outboxd::broker::embedded::partition_for;
use outboxd::broker::rabbitmq::{
    KEY_HEADER, RabbitConsumer, RabbitConsumerConfig, RabbitPublisher, check_topology, connect,
    start,
};
use outboxd::broker::{MessageSource, PublishError, Publisher};
use outboxd::config::RabbitSection;
use outboxd::config::rabbitmq::queue_name;

use crate::support::brokers::Cleanup;
use crate::support::eventually;
use crate::support::publisher::msg;

const PARTITIONS: i32 = 4;

fn rabbit_url() -> String {
    std::env::var("OUTBOXD_TEST_RABBITMQ")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

fn section() -> RabbitSection {
    RabbitSection {
        url: outboxd::config::RabbitUrl(rabbit_url()),
        fetch_wait: Duration::from_millis(100),
        ..RabbitSection::default()
    }
}

/// The machine's RabbitMQ straight through lapin, or a failure that says
/// where it was looked for.
async fn raw() -> Connection {
    Connection::connect(&rabbit_url(), ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "RabbitMQ at {} does not answer ({e}); start it (systemctl start rabbitmq-server) \
                 or set OUTBOXD_TEST_RABBITMQ",
                outboxd::config::rabbitmq::redact(&rabbit_url())
            )
        })
}

/// A topic of this test's own; its exchange and queues are deleted when
/// the test ends, passed or failed.
struct Topic {
    name: String,
    _cleanup: Cleanup,
}

impl Topic {
    fn new(prefix: &str) -> Self {
        let name = format!("t.{prefix}.{}", uuid::Uuid::new_v4().simple());
        Self {
            _cleanup: Cleanup::rabbitmq(&rabbit_url(), &name),
            name,
        }
    }

    fn set(&self) -> BTreeSet<String> {
        BTreeSet::from([self.name.clone()])
    }
}

async fn publisher(topic: &Topic) -> RabbitPublisher {
    let conn = start(&section(), &topic.set(), PARTITIONS, Some(1))
        .await
        .expect("exchange and queues created");
    RabbitPublisher::new(&section(), Some(conn), PARTITIONS, Duration::from_secs(5))
        .await
        .expect("publisher")
}

/// How many messages queue `name` holds.
async fn queue_len(conn: &Connection, name: &str) -> u32 {
    let ch = conn.create_channel().await.expect("channel");
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions {
            passive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("queue exists")
    .message_count()
}

#[tokio::test]
async fn publish_waits_for_confirms_routes_by_key_and_an_unroutable_message_is_an_error() {
    let topic = Topic::new("pub");
    let p = publisher(&topic).await;
    for n in 0..40 {
        p.publish(msg(&topic.name, &format!("k{}", n % 5), n))
            .await
            .expect("confirmed");
    }
    let conn = raw().await;
    let mut total = 0;
    for partition in 0..PARTITIONS {
        let queue = queue_name(&topic.name, partition);
        total += queue_len(&conn, &queue).await;
        // Each message sits in the queue of its key's partition, persistent,
        // with its message id and its key.
        // (basic.get is refused on single-active-consumer queues: a
        // subscription of its own, closed unacknowledged.)
        let ch = conn.create_channel().await.expect("channel");
        let mut sub = ch
            .basic_consume(
                queue.as_str().into(),
                "peek".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        if let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(2), sub.next()).await {
            let m = m.expect("delivery");
            let props = &m.properties;
            assert_eq!(*props.delivery_mode(), Some(2), "persistent");
            assert!(props.message_id().is_some(), "message id property");
            let key = match props
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get(KEY_HEADER))
            {
                Some(AMQPValue::LongString(s)) => s.as_bytes().to_vec(),
                other => panic!("key header: {other:?}"),
            };
            assert_eq!(
                partition_for(&key, PARTITIONS),
                partition,
                "queue of the key"
            );
        }
        ch.close(200, "peeked".into()).await.expect("close");
    }
    assert_eq!(total, 40, "every publish confirmed is in a queue");
    // A partition queue deleted while outboxd runs: the broker returns the
    // message (mandatory), the publish fails retryably and names the queue,
    // so the relay keeps the event.
    let ch = conn.create_channel().await.expect("channel");
    let gone = partition_for(b"k0", PARTITIONS);
    ch.queue_delete(
        queue_name(&topic.name, gone).into(),
        QueueDeleteOptions::default(),
    )
    .await
    .expect("delete");
    match p.publish(msg(&topic.name, "k0", 99)).await {
        Err(e @ PublishError::TopicMissing { .. }) => {
            assert!(!e.is_permanent());
            assert!(
                e.to_string().contains(&queue_name(&topic.name, gone))
                    && e.to_string().contains("NO_ROUTE"),
                "{e}"
            );
        }
        other => panic!("expected an unroutable error, got {other:?}"),
    }
    // A missing exchange: retryable, names the topic; the publisher opens
    // a new channel for the next message.
    let other = Topic::new("noexchange");
    match p.publish(msg(&other.name, "k", 1)).await {
        Err(e @ PublishError::TopicMissing { .. }) => {
            assert!(e.to_string().contains(&other.name), "{e}")
        }
        other => panic!("expected a missing-exchange error, got {other:?}"),
    }
    p.publish(msg(&topic.name, "k1", 100))
        .await
        .expect("the next publish works on a new channel");
}

#[tokio::test]
async fn a_missing_queue_or_a_classic_queue_is_refused_at_start_with_the_fix() {
    let topic = Topic::new("missing");
    let conn = connect(&section()).await.expect("connect");
    let e = check_topology(&conn, &topic.set(), PARTITIONS, None)
        .await
        .expect_err("no exchange")
        .to_string();
    assert!(
        e.contains(&format!("exchange `{}`", topic.name))
            && e.contains("[transport.topics] create = true"),
        "{e}"
    );
    // The exchange exists, its queues do not.
    let ch = raw().await.create_channel().await.expect("channel");
    ch.exchange_declare(
        topic.name.as_str().into(),
        ExchangeKind::Direct,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("exchange");
    let e = check_topology(&conn, &topic.set(), PARTITIONS, None)
        .await
        .expect_err("no queue")
        .to_string();
    assert!(
        e.contains(&format!("queue `{}`", queue_name(&topic.name, 0)))
            && e.contains("x-queue-type = quorum"),
        "{e}"
    );
    // A classic queue where a quorum queue belongs: refused, naming the
    // queue and the argument that differs, even with create = true.
    ch.queue_declare(
        queue_name(&topic.name, 0).into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("classic queue");
    let e = check_topology(&conn, &topic.set(), PARTITIONS, Some(1))
        .await
        .expect_err("classic queue")
        .to_string();
    assert!(
        e.contains(&format!("queue `{}`", queue_name(&topic.name, 0)))
            && e.contains("x-queue-type")
            && e.contains("delete it"),
        "{e}"
    );
    // A name RabbitMQ keeps for itself is refused before any call.
    let e = check_topology(
        &conn,
        &BTreeSet::from(["amq.orders".to_string()]),
        1,
        Some(1),
    )
    .await
    .expect_err("amq. prefix")
    .to_string();
    assert!(e.contains("`amq.orders`") && e.contains("rename"), "{e}");
}

fn consumer(topic: &Topic, group: &str) -> RabbitConsumer {
    RabbitConsumer::new(
        section(),
        RabbitConsumerConfig {
            group: group.to_string(),
            topics: vec![topic.name.clone()],
            partitions: PARTITIONS,
            prefetch: 100,
            fetch_wait: Duration::from_millis(100),
        },
    )
}

fn n_of(d: &outboxd::message::Delivery) -> u64 {
    serde_json::from_slice::<serde_json::Value>(&d.payload).expect("json")["n"]
        .as_u64()
        .expect("n")
}

async fn fetch_all(c: &mut RabbitConsumer, want: usize) -> Vec<outboxd::message::Delivery> {
    eventually(
        Duration::from_secs(20),
        format!("{want} messages fetched"),
        async || {
            let got = c.fetch(1000).await.expect("fetch");
            if got.len() >= want {
                Ok(got)
            } else {
                Err(format!("{} fetched", got.len()))
            }
        },
    )
    .await
}

#[tokio::test]
async fn per_key_order_and_ack_only_after_handling() {
    let topic = Topic::new("order");
    let p = publisher(&topic).await;
    for n in 0..40 {
        p.publish(msg(&topic.name, &format!("k{}", n % 5), n))
            .await
            .expect("publish");
    }
    let conn = raw().await;
    let topics = [topic.name.clone()];
    assert_eq!(
        outboxd::broker::rabbitmq::messages_behind(&conn, &topics, PARTITIONS).await,
        Ok(40),
        "nothing delivered yet: 40 wait"
    );
    let mut c = consumer(&topic, "g");
    let batch = fetch_all(&mut c, 40).await;
    assert_eq!(batch.len(), 40);
    for k in 0..5 {
        let key = format!("k{k}").into_bytes();
        let ns: Vec<u64> = batch
            .iter()
            .filter(|d| d.key.as_deref() == Some(&key[..]))
            .map(n_of)
            .collect();
        assert_eq!(ns.len(), 8, "key k{k}");
        assert!(
            ns.windows(2).all(|w| w[0] < w[1]),
            "key k{k} out of order: {ns:?}"
        );
        assert!(
            batch
                .iter()
                .filter(|d| d.key.as_deref() == Some(&key[..]))
                .all(|d| d.partition == partition_for(&key, PARTITIONS))
        );
        // The message id arrives as the header consumers read.
        assert!(batch.iter().all(|d| d.message_id().is_ok()));
    }
    // Nothing committed: a refetch hands out the same messages again.
    let again = c.fetch(1000).await.expect("refetch");
    assert_eq!(again.len(), 40);
    // Commit the first message of one partition only: it is acked, the
    // rest stay unacknowledged on the broker.
    let first = batch[0].clone();
    c.commit(&first).await.expect("commit");
    let after = c.fetch(1000).await.expect("fetch after commit");
    assert_eq!(after.len(), 39);
    assert!(
        !after
            .iter()
            .any(|d| d.partition == first.partition && d.offset <= first.offset)
    );
    // The member stops: the 39 unacknowledged messages go back to their
    // queues (the acked one does not), in order.
    c.release().await.expect("release");
    let conn = raw().await;
    eventually(
        Duration::from_secs(10),
        "39 messages back in the queues",
        async || {
            let mut total = 0;
            for partition in 0..PARTITIONS {
                total += queue_len(&conn, &queue_name(&topic.name, partition)).await;
            }
            if total == 39 {
                Ok(())
            } else {
                Err(format!("{total} in the queues"))
            }
        },
    )
    .await;
}

/// Two members of one group: single-active-consumer gives each partition
/// to one of them; when it stops, the other receives what it had not
/// acknowledged, first and in order.
#[tokio::test]
async fn a_stopped_members_partitions_go_to_the_other_member_in_order() {
    let topic = Topic::new("takeover");
    let p = publisher(&topic).await;
    for n in 0..20 {
        p.publish(msg(&topic.name, &format!("k{}", n % 4), n))
            .await
            .expect("publish");
    }
    let mut a = consumer(&topic, "g");
    let batch = fetch_all(&mut a, 20).await;
    let mut b = consumer(&topic, "g");
    assert!(
        b.fetch(1000).await.expect("fetch").is_empty(),
        "the second member gets nothing while the first is active"
    );
    // `a` commits the first message of each partition, then stops.
    let mut committed = std::collections::BTreeMap::new();
    for d in &batch {
        if let std::collections::btree_map::Entry::Vacant(first) = committed.entry(d.partition) {
            a.commit(d).await.expect("commit");
            first.insert(n_of(d));
        }
    }
    a.release().await.expect("release");
    let rest = fetch_all(&mut b, 20 - committed.len()).await;
    assert_eq!(
        rest.len(),
        20 - committed.len(),
        "everything not acked, once"
    );
    for (partition, first) in &committed {
        let ns: Vec<u64> = rest
            .iter()
            .filter(|d| d.partition == *partition)
            .map(n_of)
            .collect();
        assert!(
            ns.iter().all(|n| n > first),
            "partition {partition}: {ns:?} after {first}"
        );
        assert!(
            ns.windows(2).all(|w| w[0] < w[1]),
            "partition {partition} in order: {ns:?}"
        );
    }
    b.release().await.expect("release");
}

#[tokio::test]
async fn wrong_credentials_and_an_unreachable_server_say_what_to_fix_and_show_no_secret() {
    let mut s = section();
    s.url = outboxd::config::RabbitUrl(rabbit_url().replacen("guest:guest@", "guest@", 1));
    s.password = Some(outboxd::config::RabbitSecret("wrong-secret-2".into()));
    let e = connect(&s).await.expect_err("refused");
    let text = e.to_string();
    assert!(
        text.contains("refused the credentials") && text.contains("password_env"),
        "{text}"
    );
    assert!(!text.contains("wrong-secret-2"), "{text}");
    assert!(!e.is_transient(), "a refused login is not retried: {text}");
    // The password in the URL is not shown either.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("addr")
        .port();
    let s = RabbitSection {
        url: outboxd::config::RabbitUrl(format!("amqp://app:url-secret-3@127.0.0.1:{port}/%2f")),
        ..RabbitSection::default()
    };
    let e = connect(&s).await.expect_err("unreachable");
    let text = e.to_string();
    assert!(e.is_transient(), "{text}");
    assert!(
        text.contains("transport.rabbitmq.url") && text.contains(&format!("127.0.0.1:{port}")),
        "{text}"
    );
    assert!(!text.contains("url-secret-3"), "{text}");
}
