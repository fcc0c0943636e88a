//! Unit tests of the producer's error classification and of the
//! configuration guards (no broker needed).

use super::*;

#[test]
fn permanent_errors_are_about_the_message() {
    for code in [
        RDKafkaErrorCode::MessageSizeTooLarge,
        RDKafkaErrorCode::InvalidTopic,
        RDKafkaErrorCode::MessageBatchTooLarge,
    ] {
        assert_eq!(classify(Some(code)), ErrorClass::Permanent, "{code:?}");
    }
}

#[test]
fn broker_state_errors_are_retryable() {
    for code in [
        RDKafkaErrorCode::MessageTimedOut,
        RDKafkaErrorCode::RequestTimedOut,
        RDKafkaErrorCode::BrokerTransportFailure,
        RDKafkaErrorCode::AllBrokersDown,
        RDKafkaErrorCode::QueueFull,
        RDKafkaErrorCode::NotEnoughReplicas,
        RDKafkaErrorCode::NotEnoughReplicasAfterAppend,
        RDKafkaErrorCode::LeaderNotAvailable,
        RDKafkaErrorCode::NotLeaderForPartition,
        RDKafkaErrorCode::Fatal,
        // A restarted broker answers "unknown topic" until it has
        // loaded its metadata (the chaos soak saw whole batches die of
        // it), and credentials or ACLs are the operator's to fix: the
        // events are not at fault, so they back off and wait.
        RDKafkaErrorCode::UnknownTopicOrPartition,
        RDKafkaErrorCode::UnknownTopic,
        RDKafkaErrorCode::UnknownPartition,
        RDKafkaErrorCode::TopicAuthorizationFailed,
        RDKafkaErrorCode::ClusterAuthorizationFailed,
        RDKafkaErrorCode::SaslAuthenticationFailed,
        RDKafkaErrorCode::Authentication,
    ] {
        assert_eq!(classify(Some(code)), ErrorClass::Retryable, "{code:?}");
    }
    assert_eq!(classify(None), ErrorClass::Retryable);
}

#[test]
fn timeouts_and_fatal_errors_replace_the_producer() {
    let timed_out = KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut);
    let too_large = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
    assert!(needs_new_producer(&timed_out, false));
    assert!(needs_new_producer(&too_large, true));
    assert!(!needs_new_producer(&too_large, false));
    let denied = KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed);
    assert!(needs_new_producer(&denied, false));
}

#[test]
fn guarantees_cannot_be_weakened() {
    let props = |k: &str, v: &str| {
        BTreeMap::from([
            ("bootstrap.servers".to_string(), "127.0.0.1:1".to_string()),
            (k.to_string(), v.to_string()),
        ])
    };
    let timeout = Duration::from_secs(5);
    for (k, v) in [
        ("acks", "1"),
        ("enable.idempotence", "false"),
        ("request.required.acks", "0"),
    ] {
        let err = KafkaPublisher::new(&props(k, v), timeout).expect_err(k);
        assert!(err.to_string().contains(k), "{err}");
    }
    assert!(KafkaPublisher::new(&props("acks", "all"), timeout).is_ok());
    let cfg = KafkaConsumerConfig::new("g", vec!["t".into()]);
    assert!(KafkaConsumer::new(&props("enable.auto.commit", "true"), cfg.clone()).is_err());
    assert!(KafkaConsumer::new(&props("group.id", "x"), cfg).is_err());
}

#[test]
fn config_errors_hide_secret_values() {
    let props = BTreeMap::from([
        ("bootstrap.servers".to_string(), "127.0.0.1:1".to_string()),
        ("sasl.password".to_string(), "hunter2".to_string()),
        ("no.such.password".to_string(), "hunter3".to_string()),
    ]);
    let err = KafkaPublisher::new(&props, Duration::from_secs(5)).expect_err("unknown key");
    let text = err.to_string();
    assert!(!text.contains("hunter"), "{text}");
}
