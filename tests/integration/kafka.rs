//! The Kafka transport against a real Kafka-compatible broker (tansu, started
//! by `tests/tansu.sh`) and against librdkafka's mock cluster.
//!
//! Every test uses its own topics, consumer groups and SQLite outbox, so the
//! tests run in parallel against one broker. The broker-restart test starts
//! a private tansu so that killing it does not disturb the others.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use outboxd::broker::kafka::{KafkaConsumer, KafkaConsumerConfig, KafkaPublisher};
use outboxd::broker::{Delivery, MessageSource};
use outboxd::clock::Clock;
use outboxd::consumer::{Consumer, ConsumerConfig, Handler, HandlerError, InboxTx};
use outboxd::fault::{FaultAction, FaultPoint, Faults};
use outboxd::relay::{Backoff, Relay, RelayConfig, RelayError, Route, Router, StepOutcome};
use outboxd::store::sqlite::SqliteStore;
use outboxd::store::{Db, migrate};
use outboxd::{NewEvent, enqueue};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use sqlx::Row;

/// The broker address; a missing one fails the test with the fix.
fn bootstrap() -> String {
    match std::env::var("OUTBOXD_TEST_KAFKA") {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "OUTBOXD_TEST_KAFKA is not set: start a broker with `tests/tansu.sh` and export \
             OUTBOXD_TEST_KAFKA=<the printed KAFKA_BOOTSTRAP>"
        ),
    }
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Client properties; `OUTBOXD_TEST_KAFKA_DEBUG=eos,msg` turns on
/// librdkafka debug logs, shown with `RUST_LOG=debug`.
pub(crate) fn props(bootstrap: &str) -> BTreeMap<String, String> {
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

pub(crate) async fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
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
pub(crate) struct ShiftedClock(AtomicI64);

impl ShiftedClock {
    pub(crate) fn advance(&self, secs: i64) {
        self.0.fetch_add(secs, Ordering::SeqCst);
    }
}

impl Clock for ShiftedClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + chrono::Duration::seconds(self.0.load(Ordering::SeqCst))
    }
}

pub(crate) struct Outbox {
    _dir: tempfile::TempDir,
    db: Db,
    store: SqliteStore,
    pub(crate) clock: Arc<ShiftedClock>,
}

impl Outbox {
    pub(crate) async fn new() -> Self {
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

    pub(crate) fn pool(&self) -> &sqlx::SqlitePool {
        self.store.pool()
    }

    /// Enqueues one committed event; returns its id.
    pub(crate) async fn add(&self, aggregate: &str, n: usize) -> uuid::Uuid {
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

    pub(crate) fn relay(
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

    pub(crate) async fn count(&self, condition: &str) -> i64 {
        sqlx::query(&format!("SELECT count(*) FROM outbox WHERE {condition}"))
            .fetch_one(self.pool())
            .await
            .expect("count")
            .get(0)
    }
}

/// Steps until nothing is due; returns how many were published.
async fn drain<P: outboxd::broker::Publisher>(relay: &Relay<SqliteStore, P>) -> usize {
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

struct Seen {
    key: Vec<u8>,
    partition: i32,
    headers: HashMap<String, String>,
    payload: serde_json::Value,
}

/// Reads `topic` from the start with plain rdkafka until `want` messages
/// arrived (then a short grace period for unexpected extras) or 30 s passed.
async fn read_all(bootstrap: &str, topic: &str, want: usize) -> Vec<Seen> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", unique("reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("reader");
    consumer.subscribe(&[topic]).expect("subscribe");
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let wait = if out.len() >= want {
            Duration::from_millis(500)
        } else {
            deadline.saturating_duration_since(Instant::now())
        };
        let Ok(msg) = tokio::time::timeout(wait, consumer.recv()).await else {
            break;
        };
        let m = msg.expect("read");
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
        out.push(Seen {
            key: m.key().unwrap_or_default().to_vec(),
            partition: m.partition(),
            headers,
            payload: serde_json::from_slice(m.payload().unwrap_or_default()).expect("json payload"),
        });
    }
    assert!(
        out.len() >= want,
        "read {} of {want} messages from {topic}",
        out.len()
    );
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_relay_sets_key_headers_and_keeps_aggregate_order() {
    let bootstrap = bootstrap();
    let topic = unique("orders");
    create_topic(&bootstrap, &topic, 4).await;
    let outbox = Outbox::new().await;
    let mut ids = HashMap::new();
    for n in 0..5 {
        for agg in ["order-a", "order-b", "order-c"] {
            ids.insert(outbox.add(agg, n).await.to_string(), (agg, n));
        }
    }
    let publisher = Arc::new(
        KafkaPublisher::new(&props(&bootstrap), Duration::from_secs(10)).expect("publisher"),
    );
    let relay = outbox.relay(publisher, &topic, Duration::from_secs(10));
    assert_eq!(drain(&relay).await, 15);
    assert_eq!(outbox.count("published_at IS NOT NULL").await, 15);

    let seen = read_all(&bootstrap, &topic, 15).await;
    assert_eq!(seen.len(), 15, "exactly once when nothing failed");
    let mut order: HashMap<Vec<u8>, Vec<i64>> = HashMap::new();
    let mut partitions: HashMap<Vec<u8>, HashSet<i32>> = HashMap::new();
    for s in &seen {
        let id = &s.headers["message-id"];
        let (agg, n) = ids[id];
        assert_eq!(s.key, agg.as_bytes());
        assert_eq!(s.headers["aggregate-id"], agg);
        assert_eq!(s.headers["event-type"], "order.changed");
        assert!(DateTime::parse_from_rfc3339(&s.headers["created-at"]).is_ok());
        assert!(s.headers["traceparent"].starts_with("00-"));
        assert_eq!(s.payload["n"], n);
        order
            .entry(s.key.clone())
            .or_default()
            .push(s.payload["n"].as_i64().unwrap_or(-1));
        partitions
            .entry(s.key.clone())
            .or_default()
            .insert(s.partition);
    }
    for (key, ns) in order {
        assert_eq!(
            ns,
            vec![0, 1, 2, 3, 4],
            "order of {}",
            String::from_utf8_lossy(&key)
        );
        assert_eq!(partitions[&key].len(), 1, "one partition per aggregate");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_relay_republishes_when_it_fails_between_publish_and_mark() {
    let bootstrap = bootstrap();
    let topic = unique("crash");
    create_topic(&bootstrap, &topic, 3).await;
    let outbox = Outbox::new().await;
    let mut first_batch = HashSet::new();
    for agg in ["a", "b", "c", "d"] {
        first_batch.insert(outbox.add(agg, 0).await.to_string());
        outbox.add(agg, 1).await;
    }
    let publisher = Arc::new(
        KafkaPublisher::new(&props(&bootstrap), Duration::from_secs(10)).expect("publisher"),
    );
    let crashing = outbox
        .relay(publisher.clone(), &topic, Duration::from_secs(10))
        .with_faults(Faults::arm(
            FaultPoint::AfterPublishBeforeMark,
            FaultAction::Error,
            1,
        ));
    assert!(matches!(crashing.step().await, Err(RelayError::Fault(_))));
    assert_eq!(outbox.count("published_at IS NOT NULL").await, 0);

    // The crashed step's SQLite lease (30 s) must run out first.
    outbox.clock.advance(31);
    let relay = outbox.relay(publisher, &topic, Duration::from_secs(10));
    assert_eq!(drain(&relay).await, 8);
    assert_eq!(outbox.count("published_at IS NOT NULL").await, 8);

    let seen = read_all(&bootstrap, &topic, 12).await;
    let mut counts: HashMap<String, usize> = HashMap::new();
    for s in &seen {
        *counts.entry(s.headers["message-id"].clone()).or_default() += 1;
    }
    assert_eq!(counts.len(), 8, "every event at least once");
    let duplicated: HashSet<String> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(
        duplicated, first_batch,
        "the duplicates are exactly the first batch"
    );
    assert!(counts.values().all(|n| *n <= 2));
    let mut by_key: HashMap<Vec<u8>, Vec<i64>> = HashMap::new();
    for s in &seen {
        by_key
            .entry(s.key.clone())
            .or_default()
            .push(s.payload["n"].as_i64().unwrap_or(-1));
    }
    for (key, ns) in by_key {
        assert_eq!(
            ns,
            vec![0, 0, 1],
            "order of {}",
            String::from_utf8_lossy(&key)
        );
    }
}

/// Publishes `n` messages per key straight to `topic`.
pub(crate) async fn produce(bootstrap: &str, topic: &str, keys: &[&str], n: usize) {
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

/// Fetches (without committing) until the source holds `want` messages.
async fn fetch_until(source: &mut KafkaConsumer, want: usize) -> Vec<Delivery> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = source.fetch(1000).await.expect("fetch");
        if got.len() >= want || Instant::now() > deadline {
            return got;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_consumer_resumes_after_the_last_commit() {
    let bootstrap = bootstrap();
    let topic = unique("commits");
    create_topic(&bootstrap, &topic, 3).await;
    produce(&bootstrap, &topic, &["k1", "k2", "k3", "k4"], 4).await;
    let group = unique("group");
    let cfg = KafkaConsumerConfig::new(group.clone(), vec![topic.clone()]);

    let mut first = KafkaConsumer::new(&props(&bootstrap), cfg.clone()).expect("consumer");
    let all = fetch_until(&mut first, 16).await;
    assert_eq!(all.len(), 16);
    // Uncommitted messages come again on every fetch.
    assert_eq!(first.fetch(1000).await.expect("fetch again").len(), 16);
    let mut by_partition: BTreeMap<i32, Vec<Delivery>> = BTreeMap::new();
    for d in &all {
        by_partition.entry(d.partition).or_default().push(d.clone());
    }
    let mut expected = HashSet::new();
    for msgs in by_partition.values() {
        let cut = msgs.len() / 2;
        if cut > 0 {
            first.commit(&msgs[cut - 1]).await.expect("commit");
        }
        expected.extend(msgs[cut..].iter().map(|d| (d.partition, d.offset)));
    }
    assert_eq!(first.buffered(), expected.len());
    drop(first);

    let mut second = KafkaConsumer::new(&props(&bootstrap), cfg).expect("consumer");
    let rest = fetch_until(&mut second, expected.len()).await;
    let got: HashSet<_> = rest.iter().map(|d| (d.partition, d.offset)).collect();
    assert_eq!(
        got, expected,
        "resumes right after each partition's last commit"
    );
    assert_eq!(rest.len(), expected.len());
}

/// Fails the first attempt at each message whose payload has `n == 1`.
#[derive(Default)]
struct FlakyHandler {
    failed_once: std::sync::Mutex<HashSet<i64>>,
    handled: std::sync::Mutex<Vec<(i32, i64)>>,
    broken: AtomicBool,
}

impl Handler for FlakyHandler {
    async fn handle(&self, _tx: &mut InboxTx, d: &Delivery) -> Result<(), HandlerError> {
        let payload: serde_json::Value = serde_json::from_slice(&d.payload)
            .map_err(|e| HandlerError::Permanent(e.to_string()))?;
        if payload["n"] == 1
            && self
                .failed_once
                .lock()
                .expect("lock")
                .insert(d.offset * 1000 + i64::from(d.partition))
        {
            self.broken.store(true, Ordering::SeqCst);
            return Err(HandlerError::Retryable("injected".into()));
        }
        self.handled
            .lock()
            .expect("lock")
            .push((d.partition, d.offset));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_consumer_redelivers_after_a_handler_failure() {
    let bootstrap = bootstrap();
    let topic = unique("redeliver");
    create_topic(&bootstrap, &topic, 2).await;
    produce(&bootstrap, &topic, &["x", "y", "z"], 3).await;
    let outbox = Outbox::new().await;
    let handler = Arc::new(FlakyHandler::default());
    let source = KafkaConsumer::new(
        &props(&bootstrap),
        KafkaConsumerConfig::new(unique("group"), vec![topic.clone()]),
    )
    .expect("consumer");
    let mut consumer = Consumer::new(
        outbox.db.clone(),
        source,
        handler.clone(),
        ConsumerConfig {
            name: "redeliver".into(),
            ..ConsumerConfig::default()
        },
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut failures = 0;
    while handler.handled.lock().expect("lock").len() < 9 && Instant::now() < deadline {
        let (_, failed) = consumer.step().await.expect("step");
        failures += usize::from(failed);
    }
    let handled = handler.handled.lock().expect("lock").clone();
    assert!(handler.broken.load(Ordering::SeqCst));
    assert!(failures >= 1);
    assert_eq!(
        handled.len(),
        9,
        "every message handled once it stopped failing"
    );
    let unique_handled: HashSet<_> = handled.iter().collect();
    assert_eq!(unique_handled.len(), 9, "nothing handled twice");
    // Per partition, offsets were handled in order despite the failures.
    for p in 0..2 {
        let offsets: Vec<i64> = handled
            .iter()
            .filter(|(q, _)| *q == p)
            .map(|(_, o)| *o)
            .collect();
        let mut sorted = offsets.clone();
        sorted.sort_unstable();
        assert_eq!(offsets, sorted, "partition {p}");
    }
    assert_eq!(consumer.source_mut().buffered(), 0, "everything committed");
}

/// A publisher on a mock cluster; librdkafka gives up after `timeout`.
pub(crate) fn mock_publisher(
    mock: &MockCluster<'_, impl rdkafka::client::ClientContext>,
    timeout: Duration,
) -> Arc<KafkaPublisher> {
    Arc::new(KafkaPublisher::new(&props(&mock.bootstrap_servers()), timeout).expect("publisher"))
}

pub(crate) async fn attempts_of_all(outbox: &Outbox) -> Vec<(i64, bool, bool)> {
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

#[tokio::test(flavor = "multi_thread")]
async fn mock_permanent_produce_error_kills_the_event() {
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic("t", 2, 1).expect("topic");
    let outbox = Outbox::new().await;
    outbox.add("a", 0).await;
    let relay = outbox.relay(
        mock_publisher(&mock, Duration::from_secs(5)),
        "t",
        Duration::from_secs(10),
    );
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
    );
    let StepOutcome::Published(report) = relay.step().await.expect("step") else {
        panic!("expected a batch");
    };
    assert_eq!((report.published, report.dead, report.retried), (0, 1, 0));
    assert_eq!(attempts_of_all(&outbox).await, vec![(1, false, true)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn mock_retryable_produce_errors_retry_then_publish() {
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic("t", 2, 1).expect("topic");
    let outbox = Outbox::new().await;
    outbox.add("a", 0).await;
    outbox.add("b", 0).await;
    let relay = outbox.relay(
        mock_publisher(&mock, Duration::from_millis(1500)),
        "t",
        Duration::from_secs(5),
    );
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 200],
    );
    let StepOutcome::Published(report) = relay.step().await.expect("step") else {
        panic!("expected a batch");
    };
    assert_eq!((report.published, report.dead, report.retried), (0, 0, 2));
    assert_eq!(attempts_of_all(&outbox).await, vec![(1, false, false); 2]);

    mock.clear_request_errors(RDKafkaApiKey::Produce);
    outbox.clock.advance(2);
    assert_eq!(drain(&relay).await, 2);
    assert_eq!(attempts_of_all(&outbox).await, vec![(1, true, false); 2]);
}

#[tokio::test(flavor = "multi_thread")]
async fn mock_broker_down_keeps_rows_unmarked_until_it_is_back() {
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic("t", 2, 1).expect("topic");
    let outbox = Outbox::new().await;
    let relay = outbox.relay(
        mock_publisher(&mock, Duration::from_millis(1500)),
        "t",
        Duration::from_secs(3),
    );
    outbox.add("warm", 0).await;
    assert_eq!(drain(&relay).await, 1);

    let publisher = mock_publisher(&mock, Duration::from_millis(1500));
    assert_eq!(publisher.check(Duration::from_secs(5)).await, Ok(()));
    mock.broker_down(1).expect("down");
    assert!(publisher.check(Duration::from_secs(1)).await.is_err());
    outbox.add("a", 0).await;
    outbox.add("b", 0).await;
    let StepOutcome::Published(report) = relay.step().await.expect("step") else {
        panic!("expected a batch");
    };
    assert_eq!((report.published, report.dead, report.retried), (0, 0, 2));
    assert_eq!(outbox.count("published_at IS NOT NULL").await, 1);

    mock.broker_up(1).expect("up");
    // The producer reconnects with backoff, so the first steps after the
    // broker returns may still fail; they must only ever retry.
    publish_all(&outbox, &relay, Duration::from_secs(30)).await;
    assert_eq!(outbox.count("published_at IS NOT NULL").await, 3);
}

/// Steps, skipping backoff, until no row is unpublished; no row may die.
async fn publish_all<P: outboxd::broker::Publisher>(
    outbox: &Outbox,
    relay: &Relay<SqliteStore, P>,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    while outbox.count("published_at IS NULL").await > 0 {
        let errors: Vec<String> = sqlx::query(
            "SELECT last_error FROM outbox WHERE last_error IS NOT NULL AND published_at IS NULL",
        )
        .fetch_all(outbox.pool())
        .await
        .expect("errors")
        .iter()
        .map(|r| r.get(0))
        .collect();
        assert!(
            Instant::now() < deadline,
            "still unpublished; last errors: {errors:?}"
        );
        outbox.clock.advance(600);
        relay.step().await.expect("step");
        let dead: Vec<String> =
            sqlx::query("SELECT dead_reason FROM outbox WHERE dead_at IS NOT NULL")
                .fetch_all(outbox.pool())
                .await
                .expect("dead")
                .iter()
                .map(|r| r.get(0))
                .collect();
        assert!(dead.is_empty(), "no event may die: {dead:?}");
    }
}

/// A private tansu on a fixed port, killed on drop.
struct Tansu {
    child: std::process::Child,
}

impl Tansu {
    fn binary() -> String {
        if let Ok(b) = std::env::var("OUTBOXD_TEST_TANSU") {
            return b;
        }
        let home = std::env::var("HOME").unwrap_or_default();
        // Where tests/tansu.sh installs it (TANSU_ROOT).
        let installed = format!("{home}/.cache/outboxd/tansu-0.6.0/bin/tansu");
        if std::path::Path::new(&installed).exists() {
            return installed;
        }
        panic!(
            "no tansu binary: run `tests/tansu.sh` once (it installs tansu 0.6.0) or set OUTBOXD_TEST_TANSU"
        );
    }

    async fn start(port: u16) -> Self {
        let url = format!("tcp://127.0.0.1:{port}");
        let child = std::process::Command::new(Self::binary())
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
                "--storage-engine",
                "memory://tansu/",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(std::env::temp_dir().join(format!("outboxd-tansu-{port}.log")))
                    .map(std::process::Stdio::from)
                    .unwrap_or_else(|_| std::process::Stdio::null()),
            )
            .spawn()
            .expect("start tansu");
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "tansu did not listen on {port}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self { child }
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_broker_restart_keeps_rows_until_published() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let bootstrap = format!("127.0.0.1:{port}");
    let topic = unique("restart");
    let broker = Tansu::start(port).await;
    create_topic(&bootstrap, &topic, 3).await;
    let outbox = Outbox::new().await;
    let publisher = Arc::new(
        KafkaPublisher::new(&props(&bootstrap), Duration::from_secs(2)).expect("publisher"),
    );
    let relay = outbox.relay(publisher, &topic, Duration::from_secs(3));
    outbox.add("before", 0).await;
    assert_eq!(drain(&relay).await, 1);

    drop(broker);
    let mut during = HashSet::new();
    for agg in ["r1", "r2", "r3"] {
        during.insert(outbox.add(agg, 0).await.to_string());
    }
    let StepOutcome::Published(report) = relay.step().await.expect("step") else {
        panic!("expected a batch");
    };
    assert_eq!((report.published, report.retried), (0, 3));
    assert_eq!(outbox.count("published_at IS NULL").await, 3);

    // Memory storage: the restarted broker has no topics and no producer
    // state, so the topic is created again.
    let _broker = Tansu::start(port).await;
    create_topic(&bootstrap, &topic, 3).await;
    publish_all(&outbox, &relay, Duration::from_secs(60)).await;
    let seen = read_all(&bootstrap, &topic, 3).await;
    let ids: HashSet<String> = seen
        .iter()
        .map(|s| s.headers["message-id"].clone())
        .collect();
    assert!(
        during.is_subset(&ids),
        "every event enqueued while the broker was down is on the restarted broker"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn mock_consumer_pauses_a_full_partition_and_resumes_after_commits() {
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic("t", 1, 1).expect("topic");
    let bootstrap = mock.bootstrap_servers();
    produce(&bootstrap, "t", &["only"], 30).await;
    let mut cfg = KafkaConsumerConfig::new("g", vec!["t".into()]);
    cfg.partition_limit = 10;
    let mut source = KafkaConsumer::new(&props(&bootstrap), cfg).expect("consumer");

    let first = fetch_until(&mut source, 10).await;
    assert_eq!(first.len(), 10);
    // Without commits the partition stays paused: the same ten come again.
    for _ in 0..5 {
        let again = source.fetch(100).await.expect("fetch");
        assert_eq!(again, first, "a paused partition only re-serves its buffer");
    }
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.len() < 30 && Instant::now() < deadline {
        let batch = source.fetch(100).await.expect("fetch");
        if let Some(last) = batch.last() {
            source.commit(last).await.expect("commit");
        }
        seen.extend(batch.into_iter().map(|d| d.offset));
    }
    assert_eq!(
        seen,
        (0..30).collect::<Vec<i64>>(),
        "every offset once, in order, after resuming"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_consumer_hands_revoked_partitions_over_uncommitted() {
    let bootstrap = bootstrap();
    let topic = unique("rebalance");
    create_topic(&bootstrap, &topic, 4).await;
    produce(&bootstrap, &topic, &["k1", "k2", "k3", "k4", "k5", "k6"], 2).await;
    let cfg = KafkaConsumerConfig::new(unique("group"), vec![topic.clone()]);
    let mut a = KafkaConsumer::new(&props(&bootstrap), cfg.clone()).expect("consumer a");
    let all = fetch_until(&mut a, 12).await;
    assert_eq!(all.len(), 12);

    // A second member joins; both poll until the group has split the topic.
    let mut b = KafkaConsumer::new(&props(&bootstrap), cfg).expect("consumer b");
    let deadline = Instant::now() + Duration::from_secs(60);
    let (held_a, held_b) = loop {
        let got_a = a.fetch(1000).await.expect("fetch a");
        let got_b = b.fetch(1000).await.expect("fetch b");
        if (!got_b.is_empty() && got_a.len() + got_b.len() == 12) || Instant::now() > deadline {
            break (got_a, got_b);
        }
    };
    assert!(!held_b.is_empty(), "the new member got partitions");
    let parts = |v: &[Delivery]| v.iter().map(|d| d.partition).collect::<HashSet<_>>();
    assert!(
        parts(&held_a).is_disjoint(&parts(&held_b)),
        "a partition has one owner"
    );
    let key = |d: &Delivery| (d.partition, d.offset);
    let mut union: Vec<_> = held_a.iter().chain(&held_b).map(key).collect();
    union.sort_unstable();
    let mut expected: Vec<_> = all.iter().map(key).collect();
    expected.sort_unstable();
    assert_eq!(
        union, expected,
        "nothing was committed, so the new owner starts at the beginning"
    );

    // The old owner may not commit what it no longer holds.
    let moved = all
        .iter()
        .find(|d| parts(&held_b).contains(&d.partition))
        .expect("a moved message");
    assert!(a.commit(moved).await.is_err());
    assert!(b.commit(moved).await.is_ok());
}

/// The README's demo with `--kafka`: the whole pipeline through a real
/// Kafka-compatible broker ends with one invoice per order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_over_kafka_ends_with_one_invoice_per_order() {
    let bootstrap = bootstrap();
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("demo.db");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args([
            "demo",
            "--orders",
            "200",
            "--timeout-secs",
            "120",
            "--kafka",
            &bootstrap,
            "--db",
        ])
        .arg(&db)
        .output()
        .await
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("invoices: 200 for 200 confirmed orders; lost 0, duplicated 0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("duplicates dropped by the inbox     10"),
        "{stdout}"
    );
}
