//! The topics `outboxd run` needs, against the shared tansu (which creates
//! no topic by itself): a missing one is refused at start with its name
//! and both fixes; `[transport.topics] create = true` creates it and events
//! flow. A publish to a topic the cluster no longer has is reported as
//! missing (a typed error, which the relay counts as `topic_missing`), not
//! as a timeout: on librdkafka's mock cluster.

use std::collections::BTreeSet;
use std::time::Duration;

use outboxd::broker::PublishError;
use outboxd::broker::Publisher;
use outboxd::broker::kafka::{KafkaPublisher, KafkaSetupError, check_at_start};
use outboxd::config::{Config, NewTopics};
use outboxd::daemon::{Daemon, DaemonError};
use outboxd::fault::Faults;
use outboxd::message::OutgoingMessage;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::mocking::MockCluster;

use crate::support::TestDb;
use crate::support::kafka::{
    bootstrap, create_topic, flows_end_to_end, pipeline_toml, props, unique,
};

/// The partition count of `topic` on the cluster (0: no such topic).
fn partitions_of(bootstrap: &str, topic: &str) -> usize {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let metadata = admin
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("metadata");
    metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map_or(0, |t| t.partitions().len())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_topic_is_refused_at_start_naming_it_and_both_fixes() {
    let bootstrap = bootstrap();
    let t = TestDb::sqlite().await;
    let present = unique("present");
    let missing = unique("missing");
    create_topic(&bootstrap, &present, 1).await;
    let mut config = Config::from_toml(
        "(test)",
        &pipeline_toml(
            &t.url,
            &present,
            &format!(r#""bootstrap.servers" = "{bootstrap}""#),
        ),
        std::iter::empty(),
    )
    .expect("config");
    config.transport.topics = Default::default();
    config.routes[0].allowed_topics = vec![missing.clone()];
    let Err(err) = Daemon::default()
        .spawn_pipeline(
            &config,
            &t.db,
            Faults::none(),
            tokio::sync::watch::channel(false).1,
        )
        .await
    else {
        panic!("a missing topic is refused");
    };
    match &err {
        DaemonError::Kafka(KafkaSetupError::TopicsMissing { topics, .. }) => {
            assert_eq!(topics, &vec![missing.clone()], "only the missing one");
        }
        other => panic!("expected TopicsMissing, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains(&missing)
            && text.contains("kafka-topics.sh")
            && text.contains("[transport.topics] create = true"),
        "{text}"
    );
    assert_eq!(
        partitions_of(&bootstrap, &missing),
        0,
        "nothing was created"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn with_create_true_the_missing_topics_are_created_and_events_flow() {
    let bootstrap = bootstrap();
    let t = TestDb::sqlite().await;
    let topic = unique("created");
    let config = Config::from_toml(
        "(test)",
        &pipeline_toml(
            &t.url,
            &topic,
            &format!(r#""bootstrap.servers" = "{bootstrap}""#),
        ),
        std::iter::empty(),
    )
    .expect("config");
    assert_eq!(partitions_of(&bootstrap, &topic), 0);
    flows_end_to_end(&t, &config, 10).await;
    assert_eq!(
        partitions_of(&bootstrap, &topic),
        2,
        "created with transport.topics.partitions"
    );

    // A second start finds it and creates nothing.
    let report = check_at_start(
        &props(&bootstrap),
        &BTreeSet::from([topic.clone()]),
        Some(NewTopics {
            partitions: 2,
            replication: 1,
        }),
        Duration::from_secs(10),
    )
    .await
    .expect("check");
    assert!(report.created.is_empty(), "{report:?}");
}

fn message(topic: &str) -> OutgoingMessage {
    OutgoingMessage {
        topic: topic.to_string(),
        key: b"k".to_vec(),
        payload: b"{}".to_vec(),
        headers: Vec::new(),
        message_id: uuid::Uuid::new_v4(),
        created_at: chrono::Utc::now(),
    }
}

/// On librdkafka's mock cluster, which, unlike tansu 0.6.0, answers for a
/// topic it does not have as Kafka does after a deletion (tansu acknowledges
/// a produce to a deleted topic on memory storage and panics on sqlite).
/// Without auto-creation the producer fails the message instead of waiting
/// for ever, and the relay learns that the topic is missing.
#[tokio::test(flavor = "multi_thread")]
async fn a_publish_to_a_topic_the_cluster_does_not_have_is_reported_as_missing() {
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic("present", 1, 1).expect("topic");
    let mut p = props(&mock.bootstrap_servers());
    p.insert("allow.auto.create.topics".into(), "false".into());
    p.insert("topic.metadata.propagation.max.ms".into(), "500".into());
    let publisher = KafkaPublisher::new(&p, Duration::from_secs(5)).expect("publisher");
    publisher
        .publish(message("present"))
        .await
        .expect("published");

    let err = publisher
        .publish(message("gone"))
        .await
        .expect_err("no such topic");
    match &err {
        PublishError::TopicMissing { topic } => assert_eq!(topic, "gone"),
        other => panic!("expected TopicMissing, got {other:?}"),
    }
    assert!(!err.is_permanent(), "retried, never dead: {err}");
    assert!(err.to_string().contains("create it again"), "{err}");
}
