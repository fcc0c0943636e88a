//! Access errors at the Kafka door, on librdkafka's mock cluster: a topic
//! the producer may not write to, and credentials the broker does not
//! accept. Neither is the events' fault, so no event dies: rows stay
//! pending with the reason until the operator fixes access, and no secret
//! appears in what is stored or shown. (The mock broker has no SASL, so it
//! refuses any login at the handshake; librdkafka reports that as an
//! authentication failure, as it does a wrong password.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use outboxd::broker::kafka::KafkaPublisher;
use outboxd::relay::StepOutcome;
use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use sqlx::Row;

use crate::support::kafka::{Outbox, attempts_of_all, mock_rig};

async fn last_errors(outbox: &Outbox) -> Vec<String> {
    sqlx::query(
        "SELECT coalesce(last_error, '') FROM outbox WHERE published_at IS NULL ORDER BY seq",
    )
    .fetch_all(outbox.pool())
    .await
    .expect("rows")
    .iter()
    .map(|r| r.get(0))
    .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_topic_authorization_error_keeps_events_pending_until_access_is_granted() {
    let rig = mock_rig(
        &["a", "b"],
        Duration::from_millis(1500),
        Duration::from_secs(5),
    )
    .await;
    let (relay, outbox, mock) = (&rig.relay, &rig.outbox, &rig.mock);
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED],
    );
    let StepOutcome::Published(report) = relay.step().await.expect("step") else {
        panic!("expected a batch");
    };
    assert_eq!(
        (report.published, report.dead, report.retried),
        (0, 0, 2),
        "an ACL error is the operator's to fix: retried, never dead"
    );
    let errors = last_errors(outbox).await;
    assert_eq!(errors.len(), 2);
    for e in &errors {
        assert!(
            e.to_lowercase().contains("authoriz"),
            "the reason is kept: {e}"
        );
    }

    // The one injected error is spent: access is back.
    let mut published = 0;
    for _ in 0..20 {
        outbox.clock.advance(2);
        match relay.step().await.expect("step") {
            StepOutcome::Published(r) => {
                assert_eq!(r.dead, 0, "{r:?}");
                published += r.published;
            }
            StepOutcome::Idle => break,
        }
    }
    assert_eq!(published, 2, "published once access is granted");
    assert_eq!(attempts_of_all(outbox).await, vec![(1, true, false); 2]);
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_kafka_credentials_keep_events_pending_and_never_show_the_password() {
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic("t", 2, 1).expect("topic");
    let props = BTreeMap::from([
        ("bootstrap.servers".to_string(), mock.bootstrap_servers()),
        (
            "security.protocol".to_string(),
            "SASL_PLAINTEXT".to_string(),
        ),
        ("sasl.mechanism".to_string(), "PLAIN".to_string()),
        ("sasl.username".to_string(), "relay".to_string()),
        ("sasl.password".to_string(), "hunter2-wrong".to_string()),
    ]);
    let publisher =
        Arc::new(KafkaPublisher::new(&props, Duration::from_millis(1500)).expect("publisher"));
    let health = publisher
        .check(Duration::from_secs(2))
        .await
        .expect_err("a broker that refuses the credentials is not healthy");
    assert!(!health.contains("hunter2"), "{health}");

    let outbox = Outbox::new().await;
    outbox.add("a", 0).await;
    let relay = outbox.relay(publisher, "t", Duration::from_secs(3));
    let StepOutcome::Published(report) = relay.step().await.expect("step") else {
        panic!("expected a batch");
    };
    assert_eq!(
        (report.published, report.dead, report.retried),
        (0, 0, 1),
        "credentials are the operator's to fix: retried, never dead"
    );
    let errors = last_errors(&outbox).await;
    assert_eq!(errors.len(), 1);
    assert!(!errors[0].is_empty(), "the reason is kept");
    assert!(!errors[0].contains("hunter2"), "{}", errors[0]);
    assert!(
        errors[0].contains("Authentication") && errors[0].contains("SASL"),
        "the reason names the refused login, not only a timeout: {}",
        errors[0]
    );
    assert_eq!(attempts_of_all(&outbox).await, vec![(1, false, false)]);
}
