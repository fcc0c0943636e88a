//! The relay when the Kafka broker fails: produce errors on librdkafka's
//! mock cluster (permanent kills the event, retryable retries), a broker
//! that is down, and a private tansu killed and restarted. Rows stay
//! unmarked until published; no event dies of an outage.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outboxd::broker::kafka::KafkaPublisher;
use outboxd::relay::{Relay, StepOutcome};
use outboxd::store::outbox::sqlite_claim::SqliteStore;
use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use sqlx::Row;

use crate::support::eventually;
use crate::support::kafka::{
    Outbox, attempts_of_all, create_topic, drain, mock_publisher, mock_rig, props, read_all, unique,
};
use crate::support::private_kafka::{Tansu, TansuOptions, free_port};

#[tokio::test(flavor = "multi_thread")]
async fn mock_permanent_produce_error_kills_the_event() {
    let rig = mock_rig(&["a"], Duration::from_secs(5), Duration::from_secs(10)).await;
    let (relay, outbox, mock) = (&rig.relay, &rig.outbox, &rig.mock);
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
    );
    let StepOutcome::Published(report) = relay.step().await.expect("step") else {
        panic!("expected a batch");
    };
    assert_eq!((report.published, report.dead, report.retried), (0, 1, 0));
    assert_eq!(attempts_of_all(outbox).await, vec![(1, false, true)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn mock_retryable_produce_errors_retry_then_publish() {
    let rig = mock_rig(
        &["a", "b"],
        Duration::from_millis(1500),
        Duration::from_secs(5),
    )
    .await;
    let (relay, outbox, mock) = (&rig.relay, &rig.outbox, &rig.mock);
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 200],
    );
    let StepOutcome::Published(report) = relay.step().await.expect("step") else {
        panic!("expected a batch");
    };
    assert_eq!((report.published, report.dead, report.retried), (0, 0, 2));
    assert_eq!(attempts_of_all(outbox).await, vec![(1, false, false); 2]);

    mock.clear_request_errors(RDKafkaApiKey::Produce);
    outbox.clock.advance(2);
    assert_eq!(drain(relay).await, 2);
    assert_eq!(attempts_of_all(outbox).await, vec![(1, true, false); 2]);
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
    eventually(within, "every row published", async || {
        if outbox.count("published_at IS NULL").await == 0 {
            return Ok(());
        }
        let errors: Vec<String> = sqlx::query(
            "SELECT last_error FROM outbox WHERE last_error IS NOT NULL AND published_at IS NULL",
        )
        .fetch_all(outbox.pool())
        .await
        .expect("errors")
        .iter()
        .map(|r| r.get(0))
        .collect();
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
        Err(format!("still unpublished; last errors: {errors:?}"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_broker_restart_keeps_rows_until_published() {
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let topic = unique("restart");
    let broker = Tansu::start(TansuOptions::on(port)).await;
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
    let _broker = Tansu::start(TansuOptions::on(port)).await;
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
