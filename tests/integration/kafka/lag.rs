//! A Kafka consumer group's lag as `/api/consumers` reports it: every
//! message before the group's first commit, then what lies past its
//! commits, read without joining the group.

use std::time::Duration;

use outboxd::broker::MessageSource;
use outboxd::broker::kafka::{GroupLag, KafkaConsumer, KafkaConsumerConfig};

use rdkafka::mocking::MockCluster;

use crate::support::eventually;
use crate::support::kafka::{produce, props, unique};

async fn lag_of(reader: &std::sync::Arc<GroupLag>) -> i64 {
    let reader = reader.clone();
    tokio::task::spawn_blocking(move || reader.messages_behind(Duration::from_secs(10)))
        .await
        .expect("lag task")
        .expect("lag")
}

/// `Ok(want)` once the group's lag is `want`, else `Err(lag)`.
async fn lag_at(reader: &std::sync::Arc<GroupLag>, want: i64) -> Result<i64, i64> {
    let lag = lag_of(reader).await;
    if lag == want { Ok(lag) } else { Err(lag) }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_groups_lag_is_what_lies_past_its_commits() {
    // librdkafka's mock cluster: tansu 0.6.0 reports a high watermark one
    // short on a partition written in multi-record batches (4 + 4 + 7 for
    // 16 messages), which would make an exact count flaky.
    let mock = MockCluster::new(1).expect("mock cluster");
    let topic = unique("lag");
    mock.create_topic(&topic, 3, 1).expect("topic");
    let bootstrap = mock.bootstrap_servers();
    produce(&bootstrap, &topic, &["k1", "k2", "k3", "k4"], 4).await;
    let group = unique("group");
    let reader = std::sync::Arc::new(
        GroupLag::new(&props(&bootstrap), group.clone(), vec![topic.clone()]).expect("reader"),
    );
    let lag = eventually(Duration::from_secs(10), "a lag of 16", async || {
        lag_at(&reader, 16).await
    })
    .await;
    assert_eq!(lag, 16, "nothing committed yet");

    let mut source = KafkaConsumer::new(
        &props(&bootstrap),
        KafkaConsumerConfig::new(group, vec![topic]),
    )
    .expect("consumer");
    let got = eventually(Duration::from_secs(30), "16 messages fetched", async || {
        let got = source.fetch(1000).await.expect("fetch");
        if got.len() >= 16 {
            Ok(got)
        } else {
            Err(got.len())
        }
    })
    .await;
    assert_eq!(got.len(), 16);
    // Commit everything but the last message of one partition.
    let mut last: std::collections::BTreeMap<i32, _> = Default::default();
    for d in &got {
        last.insert(d.partition, d.clone());
    }
    let (&held, _) = last.iter().next().expect("a partition");
    for (partition, d) in &last {
        let upto = if *partition == held {
            got.iter()
                .filter(|m| m.partition == held)
                .rev()
                .nth(1)
                .cloned()
        } else {
            Some(d.clone())
        };
        if let Some(m) = upto {
            source.commit(&m).await.expect("commit");
        }
    }
    let lag = eventually(Duration::from_secs(15), "a lag of 1", async || {
        lag_at(&reader, 1).await
    })
    .await;
    assert_eq!(lag, 1, "one message past the commits");
}
