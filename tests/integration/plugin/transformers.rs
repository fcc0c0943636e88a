//! The example transformer plugins' output: CloudEvents, PII redaction,
//! and transformers written in Python and JavaScript. (Their sandbox limits
//! are in `limits.rs`, chains in the relay in `chains.rs`.)
//!
//! The components come from `bash plugins/build.sh` (tests/run.sh runs it);
//! a missing component fails the test with that instruction.

use serde_json::json;

use crate::support::plugins::{event, json_of, load, spec};

#[tokio::test]
async fn cloudevents_wraps_the_event_in_a_structured_envelope() {
    let mut s = spec("cloudevents");
    s.config.insert("source".into(), "/shop/orders".into());
    let out = load(&s)
        .transform(&event(json!({"order_id": "o-7", "total": 42})))
        .await
        .expect("transform");
    assert_eq!(out.len(), 1);
    let ce = json_of(&out[0].payload);
    assert_eq!(
        ce,
        json!({
            "specversion": "1.0",
            "id": "6f1c1d2e-8a3b-4c5d-9e6f-0a1b2c3d4e5f",
            "source": "/shop/orders",
            "type": "order.confirmed",
            "subject": "order-7",
            "time": "2026-11-29T12:00:00+00:00",
            "datacontenttype": "application/json",
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "data": {"order_id": "o-7", "total": 42},
        })
    );
    let header = |n: &str| {
        out[0]
            .headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        header("traceparent").as_deref(),
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    );
    assert_eq!(
        header("content-type").as_deref(),
        Some("application/cloudevents+json")
    );
    assert_eq!(out[0].key, b"order-7");
}

#[tokio::test]
async fn redact_pii_drops_and_masks_configured_fields() {
    let mut s = spec("redact-pii");
    s.config.insert("drop".into(), "customer.email".into());
    s.config.insert("mask".into(), "customer.name, card".into());
    let out = load(&s)
        .transform(&event(json!({
            "customer": {"email": "a@example.com", "name": "Ada", "tier": "gold"},
            "card": "4111111111111111",
            "total": 3,
        })))
        .await
        .expect("transform");
    assert_eq!(
        json_of(&out[0].payload),
        json!({"customer": {"name": "***", "tier": "gold"}, "card": "***", "total": 3})
    );
}

/// A transformer in another language (`python-tag`, `js-tag`): adds
/// `"tagged_by": <tag>` and refuses `"reject": true` permanently.
async fn tagging_transformer_runs(plugin: &str, tag: &str) {
    let mut s = spec(plugin);
    s.limits.memory_mib = 256;
    s.limits.timeout = std::time::Duration::from_millis(1000);
    let p = load(&s);
    let out = p
        .transform(&event(json!({"n": 1})))
        .await
        .unwrap_or_else(|e| panic!("{tag} transform: {e}"));
    assert_eq!(out.len(), 1);
    assert_eq!(json_of(&out[0].payload), json!({"n": 1, "tagged_by": tag}));
    let err = p
        .transform(&event(json!({"reject": true})))
        .await
        .expect_err("a permanent error");
    assert!(err.is_permanent(), "{err:?}");
    assert!(
        format!("{err}").contains(&format!("rejected by the {tag} plugin")),
        "{err}"
    );
}

#[tokio::test]
async fn python_transformer_runs() {
    tagging_transformer_runs("python-tag", "python").await;
}

#[tokio::test]
async fn javascript_transformer_runs() {
    tagging_transformer_runs("js-tag", "javascript").await;
}
