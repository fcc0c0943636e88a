//! Deploys the registry refuses (hand-built components with the wrong
//! imports or exports, broken or hostile code), while the active version
//! keeps running.

use crate::support::plugins::{engine, hand_built_component, json_of, registry_spec, wasm};
use crate::support::swap::{deploy_t, put_placed, relay, rollout, routes};
use crate::support::{ScriptedPublisher, TestDb, on_both};
use outboxd::plugin::lifecycle::registry::{Registry, RegistryError};
use outboxd::relay::StepOutcome;
use serde_json::json;

// ---- refusals -----------------------------------------------------------

async fn broken_deploys_are_refused_and_the_active_version_keeps_running(t: TestDb) {
    let reg = Registry::new(t.db.clone());
    let v1 = deploy_t(&reg, "cloudevents").await;
    reg.activate("t", v1, "test").await.expect("activate");
    let host = rollout(&t.db, vec![registry_spec("t")], routes());
    host.refresh().await.expect("refresh");
    let broker = ScriptedPublisher::new();
    let relay = relay(&t, broker.clone(), &host, routes());

    let spin_sample = outboxd::plugin::harness::SampleEvent::parse(
        "spin.json",
        r#"{"event_type": "order.placed", "payload": {"spin_ms": null}}"#,
    )
    .expect("sample");
    let cases: Vec<(&str, Vec<u8>, Vec<_>, &str)> = vec![
        (
            "not wasm",
            b"definitely not wasm".to_vec(),
            vec![],
            "not a WebAssembly file",
        ),
        (
            "core module",
            b"\0asm\x01\0\0\0".to_vec(),
            vec![],
            "a core Wasm module, not a component",
        ),
        (
            "hostile import",
            hand_built_component("evil:net/raw@0.1.0", "transform"),
            vec![],
            "import `evil:net/raw@0.1.0` is not provided by outboxd",
        ),
        (
            "wrong world",
            hand_built_component("outbox:plugin/config@0.1.0", "run"),
            vec![],
            "exports neither `transform` nor `handle`",
        ),
        (
            "fails its sample",
            wasm("hostile-spin"),
            vec![spin_sample],
            "sample 0 (order.placed): timed out after 200 ms",
        ),
    ];
    let mut spec = registry_spec("t");
    spec.limits.timeout = std::time::Duration::from_millis(200);
    for (what, bytes, samples, reason) in cases {
        let err = reg
            .deploy(engine(), &spec, &bytes, &samples, "test")
            .await
            .expect_err(what);
        match &err {
            RegistryError::Refused { name, reason: r } => {
                assert_eq!(name, "t");
                assert!(r.contains(reason), "{what}: {r}");
            }
            other => panic!("{what}: not a refusal: {other}"),
        }
    }
    let records = reg.list().await.expect("list");
    assert_eq!(records.len(), 1, "nothing refused was stored: {records:?}");
    assert_eq!(
        (records[0].version, records[0].state.as_str()),
        (v1, "active")
    );
    assert_eq!(
        host.refresh().await.expect("refresh"),
        outboxd::plugin::lifecycle::rollout::Refreshed::Unchanged
    );

    put_placed(&t.db, "o1", json!({"n": 1})).await;
    assert!(
        matches!(relay.step().await.expect("step"), StepOutcome::Published(r) if r.published == 1)
    );
    assert!(
        json_of(&broker.sent()[0].payload)
            .get("specversion")
            .is_some()
    );
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE transformed_by = 't@1'")
            .await,
        1
    );
}
on_both!(broken_deploys_are_refused_and_the_active_version_keeps_running);
