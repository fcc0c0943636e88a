//! The relay counts each failed publish under its cause (the
//! `outboxd_relay_publish_failures_total{reason}` label): a broker's
//! retryable or permanent refusal, and no acknowledgement in time.

use std::sync::Arc;
use std::time::Duration;

use outboxd::broker::PublishError;
use outboxd::broker::Publisher;
use outboxd::clock::SystemClock;
use outboxd::event::NewEvent;
use outboxd::message::OutgoingMessage;
use outboxd::metrics::Metrics;
use outboxd::relay::RelayConfig;
use serde_json::json;

use crate::support::{ScriptedPublisher, TestDb, on_both};

/// A broker that never acknowledges.
struct Silent;

impl Publisher for Silent {
    async fn publish(&self, _msg: OutgoingMessage) -> Result<(), PublishError> {
        std::future::pending().await
    }
}

async fn reasons(t: TestDb) {
    let metrics = Arc::new(Metrics::default());
    let failing = ScriptedPublisher::failing();
    t.enqueue(NewEvent::new("a-1", "order.confirmed", json!({})))
        .await;
    let relay = t.relay(failing.clone()).with_metrics(metrics.relay.clone());
    relay.step().await.expect("step");
    assert_eq!(metrics.relay_failures.get("retryable"), 1);

    failing
        .permanent
        .store(true, std::sync::atomic::Ordering::SeqCst);
    t.make_all_due().await;
    relay.step().await.expect("step");
    assert_eq!(metrics.relay_failures.get("permanent"), 1);
    assert_eq!(metrics.relay_failures.get("retryable"), 1);

    t.enqueue(NewEvent::new("a-2", "order.confirmed", json!({})))
        .await;
    let config = RelayConfig {
        publish_timeout: Duration::from_millis(50),
        ..RelayConfig::default()
    };
    let silent = t
        .relay_with(Silent, config, Arc::new(SystemClock))
        .with_metrics(metrics.relay.clone());
    silent.step().await.expect("step");
    assert_eq!(metrics.relay_failures.get("timeout"), 1);
    assert_eq!(
        metrics.relay_failures.get("retryable"),
        1,
        "a timeout is not a refusal"
    );
    assert_eq!(metrics.relay_failures.get("plugin"), 0);
}
on_both!(reasons);

/// A broker whose topic is gone.
struct TopicGone;

impl Publisher for TopicGone {
    async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        Err(PublishError::TopicMissing { topic: msg.topic })
    }
}

/// A missing topic has a label of its own, and its events stay pending.
async fn a_missing_topic_is_counted_as_such(t: TestDb) {
    let metrics = Arc::new(Metrics::default());
    t.enqueue(NewEvent::new("a-1", "order.confirmed", json!({})))
        .await;
    let relay = t.relay(TopicGone).with_metrics(metrics.relay.clone());
    relay.step().await.expect("step");
    assert_eq!(metrics.relay_failures.get("topic_missing"), 1);
    assert_eq!(metrics.relay_failures.get("retryable"), 0);
    assert_eq!(metrics.relay_failures.get("permanent"), 0);
    let pending_with_reason = t
        .count(
            "SELECT count(*) FROM outbox WHERE published_at IS NULL AND dead_at IS NULL \
             AND last_error LIKE '%does not exist%'",
        )
        .await;
    assert_eq!(pending_with_reason, 1, "pending, with the reason");
}
on_both!(a_missing_topic_is_counted_as_such);
