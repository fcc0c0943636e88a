//! The Kafka consumer source: it resumes after the last commit, redelivers
//! after a handler failure, pauses a full partition until commits free it
//! (mock cluster), and hands revoked partitions over uncommitted.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outboxd::broker::MessageSource;
use outboxd::broker::kafka::{KafkaConsumer, KafkaConsumerConfig};
use outboxd::consumer::Consumer;
use outboxd::consumer::ConsumerConfig;
use outboxd::consumer::Handler;
use outboxd::consumer::HandlerError;
use outboxd::message::Delivery;
use outboxd::store::InboxTx;
use rdkafka::mocking::MockCluster;

use crate::support::eventually;
use crate::support::kafka::{Outbox, bootstrap, create_topic, produce, props, unique};

/// Fetches (without committing) until the source holds `want` messages.
async fn fetch_until(source: &mut KafkaConsumer, want: usize) -> Vec<Delivery> {
    eventually(
        Duration::from_secs(30),
        format!("{want} messages fetched"),
        async || {
            let got = source.fetch(1000).await.expect("fetch");
            if got.len() >= want {
                Ok(got)
            } else {
                Err(got.len())
            }
        },
    )
    .await
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
    let mut failures = 0;
    eventually(Duration::from_secs(30), "9 messages handled", async || {
        let handled = handler.handled.lock().expect("lock").len();
        if handled >= 9 {
            return Ok(());
        }
        let failed = consumer.step().await.expect("step").failed();
        failures += usize::from(failed);
        Err(format!("{handled} handled"))
    })
    .await;
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
    eventually(Duration::from_secs(30), "30 offsets read", async || {
        if seen.len() >= 30 {
            return Ok(());
        }
        let batch = source.fetch(100).await.expect("fetch");
        if let Some(last) = batch.last() {
            source.commit(last).await.expect("commit");
        }
        seen.extend(batch.into_iter().map(|d| d.offset));
        Err(seen.len())
    })
    .await;
    assert_eq!(
        seen,
        (0..30).collect::<Vec<i64>>(),
        "every offset once, in order, after resuming"
    );
}

/// Reads `topic` the way a consumer that keeps up does, in fetches as
/// large as the partition limit, committing each partition's last message,
/// and returns every partition's offsets in the order they came.
async fn read_in_full_fetches(
    bootstrap: &str,
    topic: &str,
    want: usize,
) -> (BTreeMap<i32, Vec<i64>>, u64) {
    let cfg = KafkaConsumerConfig::new(unique("full-fetches"), vec![topic.into()]);
    let limit = cfg.partition_limit;
    let mut source = KafkaConsumer::new(&props(bootstrap), cfg).expect("consumer");
    let mut seen: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    let mut got = 0;
    eventually(
        Duration::from_secs(60),
        format!("{want} messages read"),
        async || {
            if got >= want {
                return Ok(());
            }
            let batch = source.fetch(limit).await.expect("fetch");
            let mut ends: BTreeMap<i32, &Delivery> = BTreeMap::new();
            for d in &batch {
                ends.insert(d.partition, d);
            }
            for d in ends.values() {
                source.commit(d).await.expect("commit");
            }
            got += batch.len();
            for d in &batch {
                seen.entry(d.partition).or_default().push(d.offset);
            }
            Err(got)
        },
    )
    .await;
    (seen, source.pauses())
}

/// Every partition's offsets from 0, each once and in order.
fn assert_contiguous(seen: &BTreeMap<i32, Vec<i64>>, total: usize) {
    let mut count = 0;
    for (partition, offsets) in seen {
        let expected: Vec<i64> = (0..offsets.len() as i64).collect();
        if let Some(i) = offsets.iter().zip(&expected).position(|(a, b)| a != b) {
            panic!(
                "partition {partition}: offset {} came where {} was due (after {:?})",
                offsets[i],
                expected[i],
                &offsets[i.saturating_sub(3)..i]
            );
        }
        count += offsets.len();
    }
    assert_eq!(count, total, "every message once");
}

/// A partition far behind fills its buffer in one fetch and is paused; the
/// commit that empties the buffer resumes it, and reading goes on from the
/// next offset: nothing skipped at the pause, nothing twice.
#[tokio::test(flavor = "multi_thread")]
async fn mock_consumer_reads_a_long_backlog_in_full_fetches_without_a_gap() {
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic("backlog", 1, 1).expect("topic");
    let bootstrap = mock.bootstrap_servers();
    // The relay publishes one event per key and step: many keys, few steps.
    let names: Vec<String> = (0..50).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = names.iter().map(String::as_str).collect();
    for _ in 0..7 {
        produce(&bootstrap, "backlog", &keys, 10).await;
    }
    let (seen, pauses) = read_in_full_fetches(&bootstrap, "backlog", 3500).await;
    assert_contiguous(&seen, 3500);
    assert!(pauses > 0, "a full fetch of one partition pauses it");
}

/// The same against the test broker, with partitions that interleave.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_consumer_reads_a_long_backlog_in_full_fetches_without_a_gap() {
    let bootstrap = bootstrap();
    let topic = unique("backlog");
    create_topic(&bootstrap, &topic, 2).await;
    let names: Vec<String> = (0..50).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = names.iter().map(String::as_str).collect();
    for _ in 0..3 {
        produce(&bootstrap, &topic, &keys, 40).await;
    }
    let (seen, pauses) = read_in_full_fetches(&bootstrap, &topic, 6000).await;
    assert_contiguous(&seen, 6000);
    assert!(pauses > 0, "a full fetch of one partition pauses it");
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
    let (held_a, held_b) = eventually(
        Duration::from_secs(60),
        "the group split the topic between both members",
        async || {
            let got_a = a.fetch(1000).await.expect("fetch a");
            let got_b = b.fetch(1000).await.expect("fetch b");
            if !got_b.is_empty() && got_a.len() + got_b.len() == 12 {
                Ok((got_a, got_b))
            } else {
                Err(format!("a holds {}, b {}", got_a.len(), got_b.len()))
            }
        },
    )
    .await;
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
