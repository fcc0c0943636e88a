//! Kafka consumers with statically assigned partitions
//! (`consumers[].kafka_partitions`): no consumer group, offsets in the
//! consumer's database. Run against librdkafka's mock cluster, so they need
//! no broker; the chaos soak runs them against tansu.

use std::time::Duration;

use outboxd::broker::MessageSource;
use outboxd::broker::kafka::{KafkaConsumer, KafkaConsumerConfig};
use outboxd::message::Delivery;
use outboxd::store::inbox::offsets;
use rdkafka::mocking::MockCluster;

use crate::support::kafka::{produce, props};
use crate::support::{TestDb, eventually};

fn assigned(topic: &str, partitions: &[i32]) -> KafkaConsumerConfig {
    let mut cfg = KafkaConsumerConfig::new("ledger", vec![topic.to_string()]);
    cfg.partitions = Some(partitions.to_vec());
    cfg
}

/// Fetches from both sources until they hold `want` messages between them.
async fn fetch_both(
    a: &mut KafkaConsumer,
    b: &mut KafkaConsumer,
    want: usize,
) -> (Vec<Delivery>, Vec<Delivery>) {
    eventually(
        Duration::from_secs(30),
        format!("{want} messages from both"),
        async || {
            let got_a = a.fetch(1000).await.expect("fetch a");
            let got_b = b.fetch(1000).await.expect("fetch b");
            let got = got_a.len() + got_b.len();
            if got >= want {
                Ok((got_a, got_b))
            } else {
                Err(got)
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn assigned_partitions_are_read_alone_and_resume_from_offsets_in_the_database() {
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic("t", 2, 1).expect("topic");
    let bootstrap = mock.bootstrap_servers();
    produce(&bootstrap, "t", &["k1", "k2", "k3", "k4", "k5", "k6"], 5).await;
    let db = TestDb::sqlite().await;

    let mut zero = KafkaConsumer::assigned(&props(&bootstrap), assigned("t", &[0]), db.db.clone())
        .await
        .expect("consumer of partition 0");
    let mut one = KafkaConsumer::assigned(&props(&bootstrap), assigned("t", &[1]), db.db.clone())
        .await
        .expect("consumer of partition 1");
    let (got0, got1) = fetch_both(&mut zero, &mut one, 30).await;
    assert_eq!(got0.len() + got1.len(), 30, "every message, once");
    assert!(
        !got0.is_empty() && !got1.is_empty(),
        "the keys span both partitions"
    );
    assert!(
        got0.iter().all(|d| d.partition == 0),
        "only its own partition"
    );
    assert!(
        got1.iter().all(|d| d.partition == 1),
        "only its own partition"
    );
    let offsets0: Vec<i64> = got0.iter().map(|d| d.offset).collect();
    assert_eq!(
        offsets0,
        (0..got0.len() as i64).collect::<Vec<_>>(),
        "a partition never committed is read from its start"
    );

    // Commit part of partition 0, then "restart" its reader.
    let cut = got0.len() / 2;
    zero.commit(&got0[cut - 1]).await.expect("commit");
    let stored = offsets::load_offsets(&db.db, "ledger", "t")
        .await
        .expect("stored offsets");
    assert_eq!(stored, [(0, cut as i64)].into_iter().collect());
    // A stale writer (an older commit arriving late) never moves it back.
    offsets::save_offset(&db.db, "ledger", "t", 0, 1)
        .await
        .expect("save an older offset");
    let stored = offsets::load_offsets(&db.db, "ledger", "t")
        .await
        .expect("stored offsets");
    assert_eq!(
        stored.get(&0),
        Some(&(cut as i64)),
        "offsets only move forward"
    );
    drop(zero);

    let mut again = KafkaConsumer::assigned(&props(&bootstrap), assigned("t", &[0]), db.db.clone())
        .await
        .expect("restarted consumer of partition 0");
    let rest = eventually(
        Duration::from_secs(30),
        "the rest of partition 0",
        async || {
            let got = again.fetch(1000).await.expect("fetch");
            if got.len() >= got0.len() - cut {
                Ok(got)
            } else {
                Err(got.len())
            }
        },
    )
    .await;
    let rest: Vec<i64> = rest.iter().map(|d| d.offset).collect();
    assert_eq!(
        rest,
        offsets0[cut..].to_vec(),
        "resumes right after the offset stored in the database"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_assigned_consumer_without_partitions_is_refused() {
    let mock = MockCluster::new(1).expect("mock cluster");
    let db = TestDb::sqlite().await;
    let err = KafkaConsumer::assigned(
        &props(&mock.bootstrap_servers()),
        assigned("t", &[]),
        db.db.clone(),
    )
    .await
    .expect_err("no partitions");
    assert!(err.to_string().contains("kafka_partitions"), "{err}");
}
