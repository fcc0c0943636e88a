//! The Wasm plugin host: every sandbox limit as an `_obeyed`/`_violated`
//! pair, the example plugins' output, and the relay with transformer chains.
//!
//! The components come from `bash plugins/build.sh` (tests/run.sh runs it);
//! a missing component fails the test with that instruction.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use outboxd::event::NewEvent;
use outboxd::plugin::{
    EngineConfig, ErrorKind, GuestEvent, Limits, PluginEngine, PluginError, PluginSpec,
    TransformerPlugin,
};
use outboxd::relay::transform::output_message_id;
use outboxd::relay::{Relay, RelayConfig, Route, Router, StepOutcome, build_chains};
use outboxd::store::{AnyStore, Db, enqueue};
use serde_json::{Value, json};

use crate::on_both;
use crate::support::{ScriptedPublisher, TestDb};

pub fn plugin_path(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins/dist")
        .join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: build the plugins with `bash plugins/build.sh` (tests/run.sh does it)",
        path.display()
    );
    path
}

/// One engine for the whole test binary, with an artifact cache so the
/// Python component compiles once.
pub fn engine() -> &'static PluginEngine {
    static ENGINE: OnceLock<PluginEngine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        PluginEngine::new(EngineConfig {
            cache_dir: Some(
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/plugin-cache"),
            ),
            pooling: false,
        })
        .expect("plugin engine")
    })
}

pub fn spec(name: &str) -> PluginSpec {
    let mut s = PluginSpec::new(name, plugin_path(name));
    s.version = Some("test-1".into());
    s
}

/// A spec whose deadline is generous, for tests about another limit (page
/// faults of a fresh 64 MiB memory take tens of ms on a busy machine).
fn roomy(name: &str) -> PluginSpec {
    let mut s = spec(name);
    s.limits.timeout_ms = 5_000;
    s
}

fn load(spec: &PluginSpec) -> TransformerPlugin {
    TransformerPlugin::load(engine(), spec).expect("load plugin")
}

pub fn event(payload: Value) -> GuestEvent {
    GuestEvent {
        id: "6f1c1d2e-8a3b-4c5d-9e6f-0a1b2c3d4e5f".into(),
        aggregate_id: "order-7".into(),
        event_type: "order.confirmed".into(),
        payload: serde_json::to_vec(&payload).expect("json"),
        headers: vec![(
            "traceparent".into(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
        )],
        created_at: "2026-11-29T12:00:00+00:00".into(),
        key: b"order-7".to_vec(),
        attempt: 0,
    }
}

fn json_of(payload: &[u8]) -> Value {
    serde_json::from_slice(payload).expect("payload is JSON")
}

// ---- deadline ----------------------------------------------------------

#[tokio::test]
async fn deadline_obeyed() {
    let p = load(&spec("hostile-spin"));
    let out = p.transform(&event(json!({"spin_ms": 5}))).await;
    assert_eq!(out.expect("a 5 ms spin fits the 50 ms deadline").len(), 1);
}

#[tokio::test]
async fn deadline_violated() {
    let p = load(&spec("hostile-spin"));
    let start = Instant::now();
    let err = p
        .transform(&event(json!({"spin_ms": null})))
        .await
        .expect_err("an endless loop must time out");
    assert_eq!(err, PluginError::Timeout(50));
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "took {:?}",
        start.elapsed()
    );
    // The Store was thrown away; the next call gets a fresh instance.
    let before = p.metrics().snapshot().instantiations;
    p.transform(&event(json!({"spin_ms": 1})))
        .await
        .expect("the plugin works again");
    assert_eq!(p.metrics().snapshot().instantiations, before + 1);
    assert_eq!(p.metrics().snapshot().errors_of(ErrorKind::Timeout), 1);
}

// ---- memory cap --------------------------------------------------------

#[tokio::test]
async fn memory_cap_obeyed() {
    let p = load(&roomy("hostile-memory-bomb"));
    let out = p
        .transform(&event(json!({"alloc_mib": 16})))
        .await
        .expect("16 MiB fits the 64 MiB cap");
    assert_eq!(out.len(), 1);
}

#[tokio::test]
async fn memory_cap_violated() {
    let p = load(&roomy("hostile-memory-bomb"));
    let err = p
        .transform(&event(json!({"alloc_mib": 512})))
        .await
        .expect_err("512 MiB exceeds the cap");
    assert_eq!(
        err,
        PluginError::OutOfMemory {
            cap_bytes: 64 << 20
        }
    );
    p.transform(&event(json!({"alloc_mib": 1})))
        .await
        .expect("a fresh instance works");
}

// ---- traps -------------------------------------------------------------

#[tokio::test]
async fn trap_obeyed() {
    let p = load(&spec("hostile-panic"));
    p.transform(&event(json!({"panic": false})))
        .await
        .expect("no panic, no trap");
}

#[tokio::test]
async fn trap_violated() {
    let p = load(&spec("hostile-panic"));
    let err = p
        .transform(&event(json!({"panic": true})))
        .await
        .expect_err("a panic is a trap");
    assert!(matches!(err, PluginError::Trap(_)), "{err:?}");
    assert!(!err.is_permanent());
    p.transform(&event(json!({"panic": false})))
        .await
        .expect("a fresh instance works");
}

// ---- output caps -------------------------------------------------------

#[tokio::test]
async fn output_cap_obeyed() {
    let p = load(&roomy("hostile-huge-output"));
    let out = p
        .transform(&event(json!({"bytes": 100_000, "count": 3})))
        .await
        .expect("300 kB in 3 messages is within the caps");
    assert_eq!(out.len(), 3);
}

#[tokio::test]
async fn output_cap_violated() {
    let p = load(&roomy("hostile-huge-output"));
    let err = p
        .transform(&event(json!({"bytes": 4 << 20})))
        .await
        .expect_err("4 MiB exceeds max_output_bytes");
    assert!(
        matches!(err, PluginError::OutputTooLarge { cap, .. } if cap == 1 << 20),
        "{err:?}"
    );
}

#[tokio::test]
async fn fan_out_cap_obeyed() {
    let mut s = roomy("hostile-huge-output");
    s.limits.max_outputs = 10;
    let out = load(&s)
        .transform(&event(json!({"bytes": 1, "count": 10})))
        .await
        .expect("10 outputs are allowed");
    assert_eq!(out.len(), 10);
}

#[tokio::test]
async fn fan_out_cap_violated() {
    let mut s = roomy("hostile-huge-output");
    s.limits.max_outputs = 10;
    let err = load(&s)
        .transform(&event(json!({"bytes": 1, "count": 11})))
        .await
        .expect_err("11 outputs exceed the cap");
    assert_eq!(err, PluginError::TooManyOutputs { count: 11, cap: 10 });
}

// ---- files, sockets, environment ---------------------------------------

#[tokio::test]
async fn sandbox_obeyed() {
    let p = load(&spec("hostile-escape"));
    let out = p.transform(&event(json!({}))).await.expect("forwarded");
    assert_eq!(json_of(&out[0].payload), json!({}));
}

#[tokio::test]
async fn sandbox_violated() {
    // Something is listening, so only the sandbox can refuse the connect.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let secret = std::env::temp_dir().join(format!("outboxd-secret-{}", std::process::id()));
    std::fs::write(&secret, "the secret").expect("write");
    let p = load(&spec("hostile-escape"));
    let out = p
        .transform(&event(json!({
            "file": secret.display().to_string(),
            "connect": addr.to_string(),
            "env": "PATH",
        })))
        .await
        .expect("the plugin reports what it could do");
    let report = json_of(&out[0].payload);
    for key in ["file", "connect", "env"] {
        let verdict = report[key].as_str().expect("a verdict");
        assert!(verdict.starts_with("denied"), "{key}: {verdict}");
    }
    assert!(!report.to_string().contains("the secret"));
    let _ = std::fs::remove_file(secret);
}

// ---- the example plugins -----------------------------------------------

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
    s.limits.timeout_ms = 1000;
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

// ---- the relay with chains ---------------------------------------------

pub async fn put(db: &Db, agg: &str, ty: &str, payload: Value) -> uuid::Uuid {
    let ev = NewEvent::new(agg, ty, payload);
    let r = match db {
        Db::Postgres(p) => {
            let mut tx = p.begin().await.expect("begin");
            let r = enqueue(&mut tx, ev).await.expect("enqueue");
            tx.commit().await.expect("commit");
            r
        }
        Db::Sqlite(p) => {
            let mut tx = p.begin().await.expect("begin");
            let r = enqueue(&mut tx, ev).await.expect("enqueue");
            tx.commit().await.expect("commit");
            r
        }
    };
    r.id().0
}

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
    let chains = build_chains(engine(), &plugins, &routes).expect("chains");
    Relay::new(
        t.store(),
        broker,
        Router::new(routes),
        config,
        Arc::new(outboxd::clock::SystemClock),
    )
    .with_chains(chains)
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
                output_message_id(id, 0, 3)
            ),
            (
                b"b".to_vec(),
                "orders.large".to_string(),
                output_message_id(id, 1, 3)
            ),
            (
                b"c".to_vec(),
                "orders".to_string(),
                output_message_id(id, 2, 3)
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
    let chains = build_chains(engine(), &plugins, &routes).expect("chains");
    let relay = Relay::new(
        t.store(),
        broker.clone(),
        Router::new(routes),
        RelayConfig::default(),
        Arc::new(outboxd::clock::SystemClock),
    )
    .with_chains(chains);
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
    assert_eq!((limits.timeout_ms, limits.memory_mib), (50, 64));
}
