//! The Kafka transport against a real Kafka-compatible broker (tansu, started
//! by `tests/tansu.sh`) and against librdkafka's mock cluster: the shared
//! harness. `kafka/relay.rs` has the relay on the real broker and the demo,
//! `kafka/consumers.rs` the consumer, `kafka/failures.rs` produce errors and
//! broker outages.
//!
//! Every test uses its own topics, consumer groups and SQLite outbox, so the
//! tests run in parallel against one broker. The broker-restart test starts
//! a private tansu so that killing it does not disturb the others.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outboxd::backoff::Backoff;
use outboxd::broker::kafka::KafkaPublisher;
use outboxd::clock::Clock;
use outboxd::config::Config;
use outboxd::consumer::{Handler, HandlerError};
use outboxd::daemon::Daemon;
use outboxd::message::Delivery;
use outboxd::relay::Relay;
use outboxd::relay::RelayConfig;
use outboxd::relay::StepOutcome;
use outboxd::route::Route;
use outboxd::route::Router;
use outboxd::store::InboxTx;
use outboxd::store::outbox::sqlite_claim::SqliteStore;
use outboxd::store::{Db, migrate};
use outboxd::{NewEvent, enqueue};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use serde_json::json;
use sqlx::Row;

use super::db::TestDb;
use super::eventually::eventually;
use super::pipeline::Pipeline;

/// The broker address; a missing one fails the test with the fix.
pub fn bootstrap() -> String {
    match std::env::var("OUTBOXD_TEST_KAFKA") {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "OUTBOXD_TEST_KAFKA is not set: start a broker with `tests/tansu.sh` and export \
             OUTBOXD_TEST_KAFKA=<the printed KAFKA_BOOTSTRAP>"
        ),
    }
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Client properties; `OUTBOXD_TEST_KAFKA_DEBUG=eos,msg` turns on
/// librdkafka debug logs, shown with `RUST_LOG=debug`.
pub fn props(bootstrap: &str) -> BTreeMap<String, String> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let mut p = BTreeMap::from([("bootstrap.servers".to_string(), bootstrap.to_string())]);
    if let Ok(debug) = std::env::var("OUTBOXD_TEST_KAFKA_DEBUG") {
        p.insert("debug".into(), debug);
    }
    p
}

pub async fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("create_topics request");
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("cannot create topic {t}: {e:?}"));
    }
}

/// Wall time plus an offset the test moves, to skip leases and backoff.
#[derive(Default)]
pub struct ShiftedClock(AtomicI64);

impl ShiftedClock {
    pub fn advance(&self, secs: i64) {
        self.0.fetch_add(secs, Ordering::SeqCst);
    }
}

impl Clock for ShiftedClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + chrono::Duration::seconds(self.0.load(Ordering::SeqCst))
    }
}

pub struct Outbox {
    _dir: tempfile::TempDir,
    pub db: Db,
    store: SqliteStore,
    pub clock: Arc<ShiftedClock>,
}

impl Outbox {
    pub async fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("outbox.db").display());
        let db = Db::connect(&url, 4).await.expect("sqlite");
        migrate(&db).await.expect("migrate");
        let Db::Sqlite(pool) = &db else {
            unreachable!("a sqlite url gives a sqlite pool")
        };
        let store = SqliteStore::new(pool.clone(), Duration::from_secs(30));
        Self {
            _dir: dir,
            db,
            store,
            clock: Arc::default(),
        }
    }

    pub fn pool(&self) -> &sqlx::SqlitePool {
        self.store.pool()
    }

    /// Enqueues one committed event; returns its id.
    pub async fn add(&self, aggregate: &str, n: usize) -> uuid::Uuid {
        let mut tx = self.pool().begin().await.expect("begin");
        let event = NewEvent::new(
            aggregate,
            "order.changed",
            serde_json::json!({ "aggregate": aggregate, "n": n }),
        )
        .with_header(
            "traceparent",
            format!("00-{}-00f067aa0ba902b7-01", uuid::Uuid::new_v4().simple()),
        );
        let id = enqueue(&mut tx, event).await.expect("enqueue").id().0;
        tx.commit().await.expect("commit");
        id
    }

    pub fn relay(
        &self,
        publisher: Arc<KafkaPublisher>,
        topic: &str,
        timeout: Duration,
    ) -> Relay<SqliteStore, Arc<KafkaPublisher>> {
        Relay::new(
            self.store.clone(),
            publisher,
            Router::new(vec![Route::new("*", topic)]),
            RelayConfig {
                batch_size: 100,
                backoff: Backoff {
                    base_seconds: 1.0,
                    max_seconds: 1.0,
                },
                max_attempts: 10,
                publish_timeout: timeout,
            },
            self.clock.clone(),
        )
    }

    pub async fn count(&self, condition: &str) -> i64 {
        sqlx::query(&format!("SELECT count(*) FROM outbox WHERE {condition}"))
            .fetch_one(self.pool())
            .await
            .expect("count")
            .get(0)
    }
}

/// Steps until nothing is due; returns how many were published.
pub async fn drain<P: outboxd::broker::Publisher>(relay: &Relay<SqliteStore, P>) -> usize {
    let mut published = 0;
    for _ in 0..100 {
        match relay.step().await.expect("relay step") {
            StepOutcome::Published(r) => {
                assert_eq!(r.retried + r.dead, 0, "unexpected failures: {r:?}");
                published += r.published;
            }
            StepOutcome::Idle => return published,
        }
    }
    panic!("relay did not become idle");
}

pub struct Seen {
    pub key: Vec<u8>,
    pub partition: i32,
    pub headers: HashMap<String, String>,
    pub payload: serde_json::Value,
}

/// Reads `topic` from the start with plain rdkafka until `want` messages
/// arrived (then a short grace period for unexpected extras) or 30 s passed.
pub async fn read_all(bootstrap: &str, topic: &str, want: usize) -> Vec<Seen> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", unique("reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("reader");
    consumer.subscribe(&[topic]).expect("subscribe");
    let seen = |m: &rdkafka::message::BorrowedMessage<'_>| {
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|x| {
                        (
                            x.key.to_string(),
                            String::from_utf8_lossy(x.value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Seen {
            key: m.key().unwrap_or_default().to_vec(),
            partition: m.partition(),
            headers,
            payload: serde_json::from_slice(m.payload().unwrap_or_default()).expect("json payload"),
        }
    };
    let grace = Duration::from_millis(500);
    let mut out = Vec::new();
    eventually(
        Duration::from_secs(30),
        format!("{want} messages from {topic}"),
        async || {
            if let Ok(msg) = tokio::time::timeout(grace, consumer.recv()).await {
                out.push(seen(&msg.expect("read")));
            }
            if out.len() >= want {
                Ok(())
            } else {
                Err(format!("read {}", out.len()))
            }
        },
    )
    .await;
    // A short grace period for unexpected extras.
    while let Ok(msg) = tokio::time::timeout(grace, consumer.recv()).await {
        out.push(seen(&msg.expect("read")));
    }
    assert!(
        out.len() >= want,
        "read {} of {want} messages from {topic}",
        out.len()
    );
    out
}

/// Publishes `n` messages per key straight to `topic`.
pub async fn produce(bootstrap: &str, topic: &str, keys: &[&str], n: usize) {
    let outbox = Outbox::new().await;
    for i in 0..n {
        for k in keys {
            outbox.add(k, i).await;
        }
    }
    let publisher = Arc::new(
        KafkaPublisher::new(&props(bootstrap), Duration::from_secs(10)).expect("publisher"),
    );
    drain(&outbox.relay(publisher, topic, Duration::from_secs(10))).await;
}

/// A publisher on a mock cluster; librdkafka gives up after `timeout`.
pub fn mock_publisher(
    mock: &MockCluster<'_, impl rdkafka::client::ClientContext>,
    timeout: Duration,
) -> Arc<KafkaPublisher> {
    Arc::new(KafkaPublisher::new(&props(&mock.bootstrap_servers()), timeout).expect("publisher"))
}

/// librdkafka's mock cluster (one broker, topic `t` with 2 partitions), an
/// outbox holding one event for each of `aggregates`, and a relay to `t`
/// whose producer gives up after `delivery` and whose steps wait at most
/// `publish_timeout`. Fields drop in order: the relay before the cluster.
pub struct MockRig {
    pub relay: Relay<SqliteStore, Arc<KafkaPublisher>>,
    pub outbox: Outbox,
    pub mock: MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
}

pub async fn mock_rig(
    aggregates: &[&str],
    delivery: Duration,
    publish_timeout: Duration,
) -> MockRig {
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic("t", 2, 1).expect("topic");
    let outbox = Outbox::new().await;
    for aggregate in aggregates {
        outbox.add(aggregate, 0).await;
    }
    let relay = outbox.relay(mock_publisher(&mock, delivery), "t", publish_timeout);
    MockRig {
        relay,
        outbox,
        mock,
    }
}

pub async fn attempts_of_all(outbox: &Outbox) -> Vec<(i64, bool, bool)> {
    sqlx::query(
        "SELECT attempts, published_at IS NOT NULL, dead_at IS NOT NULL FROM outbox ORDER BY seq",
    )
    .fetch_all(outbox.pool())
    .await
    .expect("rows")
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

// ---- a whole pipeline on a cluster ------------------------------------------

/// Handles every message (the inbox records it).
pub struct Accept;

impl Handler for Accept {
    async fn handle(&self, _tx: &mut InboxTx, _d: &Delivery) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// A config over the cluster `kafka` (TOML lines of `[transport.kafka]`)
/// that creates its topic: one route and one consumer, `ledger`.
pub fn pipeline_toml(url: &str, topic: &str, kafka: &str) -> String {
    format!(
        r#"
[database]
url = "{url}"
[relay]
poll_interval = "50ms"
[transport]
kind = "kafka"
[transport.kafka]
{kafka}
[transport.topics]
create = true
partitions = 2
replication = 1
[[routes]]
event_type = "*"
topic = "{topic}"
[[consumers]]
name = "ledger"
topics = ["{topic}"]
handler = "builtin:accept"
"#
    )
}

/// Runs `config`'s relay and consumer until `events` events are published
/// and handled once each.
pub async fn flows_end_to_end(t: &TestDb, config: &Config, events: usize) {
    for i in 0..events {
        t.enqueue(NewEvent::new(
            format!("order-{}", i % 5),
            "order.confirmed",
            json!({ "n": i }),
        ))
        .await;
    }
    let daemon = Daemon::builder().handler("accept", Accept).build();
    let pipeline = Pipeline::start(daemon, config, &t.db).await;
    let what = format!("{events} events published and handled");
    eventually(Duration::from_secs(60), what, async || {
        let published = t
            .count("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
            .await;
        let handled = t
            .count("SELECT count(*) FROM inbox WHERE consumer = 'ledger'")
            .await;
        if published == events as i64 && handled == events as i64 {
            Ok(())
        } else {
            Err(format!(
                "published {published}, handled {handled} of {events}"
            ))
        }
    })
    .await;
    pipeline.stop().await;
}

// ---- where a process test's messages go ---------------------------------------

/// The embedded transport, or a broker (Kafka, NATS JetStream, RabbitMQ)
/// with a topic and a consumer group of the test's own, so runs sharing a
/// broker never meet. `topic` is also the events' type (the default route
/// sends an event to the topic of its type). On NATS and RabbitMQ the
/// stream, or the exchange and queues, are deleted when the last clone of
/// the `Way` is dropped.
#[derive(Clone)]
pub struct Way {
    pub broker: Broker,
    pub topic: String,
    pub consumer: String,
    _cleanup: Option<std::sync::Arc<super::brokers::Cleanup>>,
}

/// Where a [`Way`] publishes.
#[derive(Clone, Debug)]
pub enum Broker {
    Embedded,
    /// Bootstrap servers.
    Kafka(String),
    /// The server's URL.
    Nats(String),
    /// The server's URL.
    Rabbitmq(String),
    /// The server's URL.
    Redis(String),
}

impl Way {
    pub fn embedded(topic: &str, consumer: &str) -> Self {
        Self {
            broker: Broker::Embedded,
            topic: topic.into(),
            consumer: consumer.into(),
            _cleanup: None,
        }
    }

    pub fn kafka(topic: &str, consumer: &str) -> Self {
        Self {
            broker: Broker::Kafka(bootstrap()),
            topic: unique(topic),
            consumer: unique(consumer),
            _cleanup: None,
        }
    }

    /// The machine's nats-server (OUTBOXD_TEST_NATS).
    pub fn nats(topic: &str, consumer: &str) -> Self {
        let url = super::brokers::nats_url();
        let topic = unique(topic);
        Self {
            _cleanup: Some(std::sync::Arc::new(super::brokers::Cleanup::nats(
                &url, &topic,
            ))),
            broker: Broker::Nats(url),
            topic,
            consumer: unique(consumer),
        }
    }

    /// The machine's RabbitMQ (OUTBOXD_TEST_RABBITMQ).
    pub fn rabbitmq(topic: &str, consumer: &str) -> Self {
        let url = super::brokers::rabbitmq_url();
        let topic = unique(topic);
        Self {
            _cleanup: Some(std::sync::Arc::new(super::brokers::Cleanup::rabbitmq(
                &url, &topic,
            ))),
            broker: Broker::Rabbitmq(url),
            topic,
            consumer: unique(consumer),
        }
    }

    /// The machine's Redis (OUTBOXD_TEST_REDIS).
    pub fn redis(topic: &str, consumer: &str) -> Self {
        let url = super::brokers::redis_url();
        let topic = unique(topic);
        Self {
            _cleanup: Some(std::sync::Arc::new(super::brokers::Cleanup::redis(
                &url, &topic,
            ))),
            broker: Broker::Redis(url),
            topic,
            consumer: unique(consumer),
        }
    }

    /// `cmd` (an `outboxd` process) on this transport: on Kafka, the
    /// cluster, and a session timeout that moves a killed member's
    /// partitions on after 6 s, not 45; on NATS and RabbitMQ the server,
    /// four partitions, and the stream or queues created at start.
    pub fn configure_transport(&self, cmd: &mut tokio::process::Command) {
        match &self.broker {
            Broker::Embedded => {}
            Broker::Kafka(bootstrap) => {
                cmd.env("OUTBOXD__TRANSPORT__KIND", "kafka")
                    .env("OUTBOXD__TRANSPORT__KAFKA__bootstrap.servers", bootstrap)
                    .env("OUTBOXD__TRANSPORT__KAFKA__session.timeout.ms", "\"6000\"");
            }
            Broker::Nats(url) => {
                cmd.env("OUTBOXD__TRANSPORT__KIND", "nats")
                    .env("OUTBOXD__TRANSPORT__NATS__URL", url)
                    .env("OUTBOXD__TRANSPORT__PARTITIONS", "4")
                    .env("OUTBOXD__TRANSPORT__TOPICS__CREATE", "true");
            }
            Broker::Rabbitmq(url) => {
                cmd.env("OUTBOXD__TRANSPORT__KIND", "rabbitmq")
                    .env("OUTBOXD__TRANSPORT__RABBITMQ__URL", url)
                    .env("OUTBOXD__TRANSPORT__PARTITIONS", "4")
                    .env("OUTBOXD__TRANSPORT__TOPICS__CREATE", "true");
            }
            Broker::Redis(url) => {
                cmd.env("OUTBOXD__TRANSPORT__KIND", "redis")
                    .env("OUTBOXD__TRANSPORT__REDIS__URL", url)
                    .env("OUTBOXD__TRANSPORT__PARTITIONS", "4")
                    .env("OUTBOXD__TRANSPORT__TOPICS__CREATE", "true");
            }
        }
    }

    /// On Kafka, which creates no topic by itself: the topic, with
    /// `partitions`, and `<topic>.dlq`, where a dead letter is also
    /// published (it stays until it is). NATS and RabbitMQ: outboxd creates
    /// what it needs at start.
    pub async fn create_topics(&self, partitions: i32) {
        if let Broker::Kafka(bootstrap) = &self.broker {
            create_topic(bootstrap, &self.topic, partitions).await;
            create_topic(bootstrap, &format!("{}.dlq", self.topic), 1).await;
        }
    }
}
