//! The relay on a real Kafka-compatible broker: key, headers and
//! per-aggregate order; a crash between publish and mark republishes exactly
//! the unmarked batch; and the README's demo with `--kafka`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::DateTime;
use outboxd::broker::kafka::KafkaPublisher;
use outboxd::fault::{FaultAction, FaultPoint, Faults};
use outboxd::relay::RelayError;

use crate::support::kafka::{Outbox, bootstrap, create_topic, drain, props, read_all, unique};

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
