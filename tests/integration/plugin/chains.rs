//! Transformer plugins in the relay: routes to chains, filter, split with
//! deterministic ids, re-key, permanent errors and traps, and plain routes
//! beside chained ones.

use std::collections::BTreeMap;
use std::sync::Arc;

use outboxd::config::Limits;
use outboxd::config::PluginSpec;
use outboxd::message::output_message_id;
use outboxd::plugin::lifecycle::chains::build_chains;
use outboxd::relay::Relay;
use outboxd::relay::RelayConfig;
use outboxd::relay::StepOutcome;
use outboxd::route::Route;
use outboxd::store::AnyStore;
use serde_json::json;

use crate::support::db::put;
use crate::support::plugins::{chained_relay, engine, json_of, spec};
use crate::support::{ScriptedPublisher, TestDb, on_both};

// ---- the relay with chains ---------------------------------------------

fn relay_with_chain(
    t: &TestDb,
    broker: Arc<ScriptedPublisher>,
    plugins: Vec<PluginSpec>,
    chain: &[&str],
    config: RelayConfig,
) -> Relay<AnyStore, Arc<ScriptedPublisher>> {
    let routes = vec![
        Route::new("order.*", "orders")
            .with_transformers(chain)
            .allowing_topics(&["orders.large"]),
    ];
    chained_relay(t, broker, &plugins, routes, config)
}

fn amount_spec() -> PluginSpec {
    let mut s = spec("route-by-amount");
    s.config = BTreeMap::from([("threshold".to_string(), "100".to_string())]);
    s
}

async fn chain_filter_marks_the_event_filtered(t: TestDb) {
    let broker = ScriptedPublisher::new();
    let relay = relay_with_chain(
        &t,
        broker.clone(),
        vec![amount_spec()],
        &["route-by-amount"],
        RelayConfig::default(),
    );
    put(
        &t.db,
        "o1",
        "order.placed",
        json!({"order_id": "o1", "items": []}),
    )
    .await;
    let StepOutcome::Published(report) = relay.step().await.expect("step") else {
        panic!("idle");
    };
    assert_eq!((report.published, report.filtered), (0, 1));
    assert!(broker.sent().is_empty());
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE outcome = 'filtered' AND published_at IS NOT NULL AND transformed_by = 'route-by-amount@test-1'").await,
        1
    );
    assert!(matches!(
        relay.step().await.expect("step"),
        StepOutcome::Idle
    ));
}
on_both!(chain_filter_marks_the_event_filtered);

async fn chain_split_rekeys_with_deterministic_ids(t: TestDb) {
    let broker = ScriptedPublisher::new();
    let relay = relay_with_chain(
        &t,
        broker.clone(),
        vec![amount_spec()],
        &["route-by-amount"],
        RelayConfig::default(),
    );
    let id = put(
        &t.db,
        "o2",
        "order.placed",
        json!({"order_id": "o2", "items": [{"sku": "a", "amount": 5}, {"sku": "b", "amount": 500}, {"sku": "c", "amount": 7}]}),
    )
    .await;
    relay.step().await.expect("step");
    let sent = broker.sent();
    assert_eq!(sent.len(), 3);
    let mut by_key: Vec<_> = sent
        .iter()
        .map(|m| (m.key.clone(), m.topic.clone(), m.message_id))
        .collect();
    by_key.sort();
    assert_eq!(
        by_key,
        vec![
            (
                b"a".to_vec(),
                "orders".to_string(),
                output_message_id(id, 0)
            ),
            (
                b"b".to_vec(),
                "orders.large".to_string(),
                output_message_id(id, 1)
            ),
            (
                b"c".to_vec(),
                "orders".to_string(),
                output_message_id(id, 2)
            ),
        ]
    );
    for m in &sent {
        assert_eq!(
            m.header("message-id"),
            Some(m.message_id.to_string().as_bytes())
        );
        assert_eq!(
            m.header("source-message-id"),
            Some(id.to_string().as_bytes())
        );
    }
    // A republish (the crash-between-publish-and-mark case) gives the same ids.
    t.exec("UPDATE outbox SET published_at = NULL, outcome = NULL")
        .await;
    relay.step().await.expect("step");
    let again: Vec<_> = broker.sent()[3..].iter().map(|m| m.message_id).collect();
    let first: Vec<_> = sent.iter().map(|m| m.message_id).collect();
    assert_eq!(again, first);
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE outcome = 'published'")
            .await,
        1
    );
}
on_both!(chain_split_rekeys_with_deterministic_ids);

async fn chain_permanent_error_is_dead_at_once_with_the_plugin_named(t: TestDb) {
    let broker = ScriptedPublisher::new();
    let relay = relay_with_chain(
        &t,
        broker.clone(),
        vec![amount_spec()],
        &["route-by-amount"],
        RelayConfig::default(),
    );
    put(&t.db, "o3", "order.placed", json!({"not": "an order"})).await;
    let StepOutcome::Published(report) = relay.step().await.expect("step") else {
        panic!("idle");
    };
    assert_eq!(report.dead, 1);
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL AND attempts = 1 AND dead_reason LIKE 'plugin route-by-amount@test-1: permanent:%'").await,
        1
    );
}
on_both!(chain_permanent_error_is_dead_at_once_with_the_plugin_named);

async fn chain_trap_retries_then_dead(t: TestDb) {
    let broker = ScriptedPublisher::new();
    let config = RelayConfig {
        max_attempts: 3,
        ..RelayConfig::default()
    };
    let relay = relay_with_chain(
        &t,
        broker.clone(),
        vec![spec("hostile-panic")],
        &["hostile-panic"],
        config,
    );
    put(&t.db, "o4", "order.placed", json!({"panic": true})).await;
    for attempt in 1..=3 {
        t.make_all_due().await;
        let StepOutcome::Published(report) = relay.step().await.expect("step") else {
            panic!("idle on attempt {attempt}");
        };
        assert_eq!(
            (report.retried, report.dead),
            if attempt < 3 { (1, 0) } else { (0, 1) }
        );
    }
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL AND attempts = 3 AND dead_reason LIKE 'plugin hostile-panic@test-1: trapped:%'").await,
        1
    );
    assert!(broker.sent().is_empty());
}
on_both!(chain_trap_retries_then_dead);

async fn chain_of_two_plugins_and_plain_routes_side_by_side(t: TestDb) {
    let broker = ScriptedPublisher::new();
    let mut redact = spec("redact-pii");
    redact.config.insert("drop".into(), "email".into());
    let plugins = vec![redact, spec("cloudevents")];
    let routes = vec![
        Route::new("order.*", "orders").with_transformers(&["redact-pii", "cloudevents"]),
        Route::new("*", "other"),
    ];
    let relay = chained_relay(&t, broker.clone(), &plugins, routes, RelayConfig::default());
    let id = put(&t.db, "o5", "order.placed", json!({"email": "x@y", "n": 1})).await;
    put(&t.db, "u1", "user.created", json!({"email": "x@y"})).await;
    relay.step().await.expect("step");
    let sent = broker.sent();
    let order = sent
        .iter()
        .find(|m| m.topic == "orders")
        .expect("order message");
    assert_eq!(order.message_id, id, "a 1:1 chain keeps the outbox id");
    let ce = json_of(&order.payload);
    assert_eq!(ce["data"], json!({"n": 1}));
    assert_eq!(ce["id"], json!(id.to_string()));
    let user = sent
        .iter()
        .find(|m| m.topic == "other")
        .expect("plain message");
    assert_eq!(json_of(&user.payload), json!({"email": "x@y"}));
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE transformed_by = 'redact-pii@test-1,cloudevents@test-1'").await,
        1
    );
}
on_both!(chain_of_two_plugins_and_plain_routes_side_by_side);

#[test]
fn unknown_plugin_in_a_route_names_the_key() {
    let routes = vec![Route::new("order.*", "orders").with_transformers(&["nope"])];
    let err = build_chains(engine(), &[], &routes).expect_err("unknown plugin");
    assert!(err.contains("routes[0].transformers[0]"), "{err}");
    let limits = Limits::default();
    assert_eq!((limits.timeout.as_millis(), limits.memory_mib), (50, 64));
}
