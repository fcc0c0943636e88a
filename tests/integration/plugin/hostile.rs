//! Hostile transformer plugins beyond the sandbox pairs of `limits.rs`:
//! fork-bomb recursion, stack overflow, ten thousand host calls in one
//! message, outputs that are not UTF-8, and a plugin sending to a topic its
//! route does not allow. Each is tested on the plugin alone and in one relay
//! run with good events: the host stays up, the bad event is retried or
//! dead-lettered with the reason, and the other events are published.

use outboxd::config::PluginSpec;
use outboxd::plugin::ErrorKind;
use outboxd::plugin::PluginError;
use outboxd::plugin::TransformerPlugin;
use outboxd::relay::RelayConfig;
use outboxd::relay::StepOutcome;
use outboxd::route::Route;
use serde_json::{Value, json};

use crate::support::db::put;
use crate::support::plugins::{chained_relay, engine, event, spec};
use crate::support::{ScriptedPublisher, TestDb, on_both};

fn misbehave(timeout_ms: u64) -> TransformerPlugin {
    let mut s = spec("hostile-misbehave");
    s.limits.timeout = std::time::Duration::from_millis(timeout_ms);
    TransformerPlugin::load(engine(), &s).expect("load hostile-misbehave")
}

fn header<'a>(m: &'a outboxd::plugin::GuestMessage, name: &str) -> Option<&'a str> {
    m.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// After any failure the plugin must still serve the next event.
async fn still_serves(p: &TransformerPlugin) {
    let out = p
        .transform(&event(json!({})))
        .await
        .expect("a fresh instance serves the next event");
    assert_eq!(out.len(), 1);
}

// ---- fork-bomb recursion -------------------------------------------------

#[tokio::test]
async fn fork_bomb_obeyed() {
    let out = misbehave(50)
        .transform(&event(json!({"fork": 8})))
        .await
        .expect("2^8 calls fit the deadline");
    assert_eq!(header(&out[0], "fork-calls"), Some("256"));
}

#[tokio::test]
async fn fork_bomb_violated() {
    let p = misbehave(50);
    let err = p
        .transform(&event(json!({"fork": 64})))
        .await
        .expect_err("2^64 calls cannot finish");
    assert_eq!(err, PluginError::Timeout(50));
    still_serves(&p).await;
}

// ---- stack overflow ------------------------------------------------------

#[tokio::test]
async fn stack_overflow_obeyed() {
    let out = misbehave(50)
        .transform(&event(json!({"recurse": 100})))
        .await
        .expect("100 frames of 1 KiB fit the stack");
    assert!(header(&out[0], "recursed").is_some());
}

#[tokio::test]
async fn stack_overflow_violated() {
    let p = misbehave(5_000);
    let err = p
        .transform(&event(json!({"recurse": 100_000_000u64})))
        .await
        .expect_err("100 million frames overflow the stack");
    let PluginError::Trap(reason) = &err else {
        panic!("a stack overflow is a trap, got {err:?}");
    };
    assert!(
        STACK_OVERFLOW
            .iter()
            .any(|s| reason == &format!("wasm trap: {s}")),
        "{reason}"
    );
    assert!(!err.is_permanent(), "a trap is retried");
    assert_eq!(p.metrics().snapshot().errors_of(ErrorKind::Trap), 1);
    still_serves(&p).await;
}

/// How wasmtime reports an overflow of the wasm stack (`max_wasm_stack`)
/// or of the guest's shadow stack in linear memory (it runs below address
/// zero).
const STACK_OVERFLOW: [&str; 2] = ["call stack exhausted", "out of bounds memory access"];

// ---- host calls ----------------------------------------------------------

#[tokio::test]
async fn ten_thousand_host_calls_obeyed() {
    let out = misbehave(5_000)
        .transform(&event(json!({"host_calls": 10_000})))
        .await
        .expect("10,000 config.get calls are allowed within the deadline");
    assert_eq!(header(&out[0], "host-calls"), Some("10000"));
}

#[tokio::test]
async fn endless_host_calls_violated() {
    let p = misbehave(50);
    let err = p
        .transform(&event(json!({"host_calls": null})))
        .await
        .expect_err("host calls without end meet the deadline");
    assert_eq!(err, PluginError::Timeout(50));
    still_serves(&p).await;
}

// ---- what crosses the boundary ------------------------------------------

/// Topics and header values are WIT `string`s: the canonical ABI requires
/// UTF-8 and wasmtime's lift checks it, so a guest that writes other bytes
/// there fails its call (a trap, retried) instead of reaching the broker.
/// Keys and payloads are `list<u8>`: any bytes are allowed and published
/// as they are.
#[tokio::test]
async fn invalid_utf8_topic_and_header_are_refused_at_the_boundary() {
    let p = misbehave(50);
    for field in ["topic", "header"] {
        let err = p
            .transform(&event(json!({"bad_utf8": field})))
            .await
            .expect_err("a string that is not UTF-8 cannot be lifted");
        let PluginError::Trap(reason) = &err else {
            panic!("{field}: expected a trap, got {err:?}");
        };
        assert!(reason.contains("utf-8"), "{field}: {reason}");
        still_serves(&p).await;
    }
}

#[tokio::test]
async fn a_key_that_is_not_utf8_passes_the_boundary() {
    let out = misbehave(50)
        .transform(&event(json!({"key_bytes": [255, 0, 1]})))
        .await
        .expect("keys are bytes");
    assert_eq!(out[0].key, vec![255, 0, 1]);
}

// ---- in the relay --------------------------------------------------------

async fn put_bad(t: &TestDb, agg: &str, payload: Value) {
    put(&t.db, agg, "bad.thing", payload).await;
}

async fn reason_of(t: &TestDb, agg: &str) -> (i64, String) {
    let sql = format!(
        "SELECT attempts, coalesce(dead_reason, '') FROM outbox WHERE aggregate_id = '{agg}' AND dead_at IS NOT NULL"
    );
    match &t.db {
        outboxd::store::Db::Postgres(p) => {
            let r: (i32, String) = sqlx::query_as(&sql).fetch_one(p).await.expect(&sql);
            (i64::from(r.0), r.1)
        }
        outboxd::store::Db::Sqlite(p) => sqlx::query_as(&sql).fetch_one(p).await.expect(&sql),
    }
}

async fn hostile_events_fail_alone_and_good_events_keep_flowing(t: TestDb) {
    let broker = ScriptedPublisher::new();
    let mut cloudevents = spec("cloudevents");
    cloudevents.config.insert("source".into(), "/shop".into());
    let plugins: Vec<PluginSpec> = vec![spec("hostile-misbehave"), cloudevents];
    let routes = vec![
        Route::new("bad.*", "bad")
            .with_transformers(&["hostile-misbehave"])
            .allowing_topics(&["bad.audit"]),
        Route::new("order.*", "orders").with_transformers(&["cloudevents"]),
        Route::new("*", "other"),
    ];
    let config = RelayConfig {
        max_attempts: 2,
        ..RelayConfig::default()
    };
    let relay = chained_relay(&t, broker.clone(), &plugins, routes, config);

    put_bad(&t, "fork", json!({"fork": 64})).await;
    put_bad(&t, "stack", json!({"recurse": 100_000_000u64})).await;
    put_bad(&t, "calls", json!({"host_calls": null})).await;
    put_bad(&t, "utf8-topic", json!({"bad_utf8": "topic"})).await;
    put_bad(&t, "utf8-header", json!({"bad_utf8": "header"})).await;
    put_bad(&t, "rekey", json!({"topic": "payments", "key": "stolen"})).await;
    // The same plugin, behaving: an allowed topic, the route's topic, a
    // binary key.
    put_bad(&t, "allowed", json!({"topic": "bad.audit", "key": "k2"})).await;
    put_bad(&t, "plain", json!({})).await;
    put_bad(&t, "binary-key", json!({"key_bytes": [255, 0]})).await;
    // Other plugins and the plain path.
    put(&t.db, "o1", "order.placed", json!({"n": 1})).await;
    put(&t.db, "u1", "user.created", json!({"n": 2})).await;

    let StepOutcome::Published(first) = relay.step().await.expect("step") else {
        panic!("idle");
    };
    assert_eq!(
        (first.published, first.dead, first.retried),
        (5, 1, 5),
        "{first:?}"
    );
    let mut sent: Vec<(String, Vec<u8>)> = broker
        .sent()
        .iter()
        .map(|m| (m.topic.clone(), m.key.clone()))
        .collect();
    sent.sort();
    let mut expected: Vec<(String, Vec<u8>)> = vec![
        ("bad".into(), vec![255, 0]),
        ("bad".into(), b"plain".to_vec()),
        ("bad.audit".into(), b"k2".to_vec()),
        ("orders".into(), b"o1".to_vec()),
        ("other".into(), b"u1".to_vec()),
    ];
    expected.sort();
    assert_eq!(sent, expected, "good events of every route were published");
    // A forbidden topic is dead at once, naming plugin, topic and fix.
    let (attempts, reason) = reason_of(&t, "rekey").await;
    assert_eq!(attempts, 1);
    assert_eq!(
        reason,
        "plugin hostile-misbehave@test-1: output topic `payments` is not allowed: routes[0] \
         publishes to `bad`; add `payments` to routes[0].allowed_topics if this plugin may send there"
    );

    // The rest were retried; the second failure is their last.
    t.make_all_due().await;
    let StepOutcome::Published(second) = relay.step().await.expect("step") else {
        panic!("idle");
    };
    assert_eq!((second.published, second.dead, second.retried), (0, 5, 0));
    for (agg, expected) in [
        ("fork", "timed out after 50 ms (limits.timeout)"),
        ("calls", "timed out after 50 ms (limits.timeout)"),
        ("stack", "trapped: wasm trap: "),
        ("utf8-topic", "utf-8"),
        ("utf8-header", "utf-8"),
    ] {
        let (attempts, reason) = reason_of(&t, agg).await;
        assert_eq!(attempts, 2, "{agg}");
        assert!(
            reason.starts_with("plugin hostile-misbehave@test-1: ") && reason.contains(expected),
            "{agg}: {reason}"
        );
    }
    assert_eq!(broker.sent().len(), 5, "nothing bad was published");
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE published_at IS NULL AND dead_at IS NULL")
            .await,
        0,
        "every event is published or dead: nothing is left behind or lost"
    );
}
on_both!(hostile_events_fail_alone_and_good_events_keep_flowing);
