//! Hot swap seen from outside one relay: an activation reaching another
//! host, shadow runs that report mismatches and publish nothing, and
//! automatic promotion of a clean shadow.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxd::config::PluginSpec;
use outboxd::plugin::lifecycle::registry::Registry;
use outboxd::relay::Relay;
use outboxd::relay::RelayConfig;
use outboxd::relay::StepOutcome;
use outboxd::route::Route;
use outboxd::route::Router;
use outboxd::store::Db;
use serde_json::json;
use tokio::sync::watch;

use crate::support::plugins::{
    engine, json_of, plugin_path, registry_spec, wasm, with_custom_section,
};
use crate::support::swap::{active_label, deploy_t, put_placed, relay, rollout, routes};
use crate::support::{ScriptedPublisher, TestDb, eventually, on_both};

// ---- a second host --------------------------------------------------------

async fn an_activation_reaches_another_host_within_two_seconds(t: TestDb) {
    let reg_a = Registry::new(t.db.clone());
    let v1 = deploy_t(&reg_a, "cloudevents").await;
    let v2 = deploy_t(&reg_a, "redact-pii").await;
    reg_a.activate("t", v1, "host-a").await.expect("activate");
    // Host B: its own pool (as a second process would have) and its own loop.
    let db_b = Db::connect(&t.url, 4).await.expect("connect host B");
    let host_b = Arc::new(rollout(&db_b, vec![registry_spec("t")], routes()));
    let (stop, stopped) = watch::channel(false);
    let runner = {
        let host_b = host_b.clone();
        tokio::spawn(async move { host_b.run(Duration::from_secs(1), stopped).await })
    };
    let mut latencies = Vec::new();
    for (i, v) in [v1, v2, v1, v2, v1, v2, v1].into_iter().enumerate() {
        let start = Instant::now();
        if i > 0 {
            reg_a.activate("t", v, "host-a").await.expect("activate");
        }
        eventually(
            Duration::from_secs(5),
            format!("host B running t@{v}"),
            async || {
                let running = active_label(&host_b);
                if running == format!("t@{v}") {
                    Ok(())
                } else {
                    Err(format!("host B still runs {running}"))
                }
            },
        )
        .await;
        if i > 0 {
            latencies.push(start.elapsed());
        }
    }
    let _ = stop.send(true);
    runner.await.expect("runner");
    let max = latencies.iter().max().copied().unwrap_or_default();
    println!(
        "activation on host A seen by host B ({}): {:?}, max {max:?}",
        if t.is_postgres() {
            "postgres LISTEN/NOTIFY + 1 s poll"
        } else {
            "sqlite, 1 s poll"
        },
        latencies
    );
    assert!(max < Duration::from_secs(2), "{latencies:?}");
    // Host B relays with the version host A activated last.
    let broker = ScriptedPublisher::new();
    let relay_b = Relay::new(
        outboxd::store::AnyStore::new(&db_b, Duration::from_secs(30)),
        broker.clone(),
        Router::new(routes()),
        RelayConfig::default(),
        Arc::new(outboxd::clock::SystemClock),
    )
    .with_chains(host_b.chains());
    put_placed(&t.db, "o1", json!({"n": 1})).await;
    relay_b.step().await.expect("step");
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM outbox WHERE transformed_by = 't@{v1}'"
        ))
        .await,
        1
    );
    db_b.close().await;
}
on_both!(an_activation_reaches_another_host_within_two_seconds);

// ---- shadow runs ----------------------------------------------------------

async fn shadow_reports_exactly_the_mismatching_events_and_publishes_nothing(t: TestDb) {
    // Route chain: `norm` (redact-pii with no rules: canonical JSON), then
    // `t`. Active t = redact-pii masking `email`; the candidate is a
    // pass-through (hostile-spin with spin_ms 0), so the two differ exactly
    // on the events that carry an email.
    let routes = vec![Route::new("order.*", "orders").with_transformers(&["norm", "t"])];
    let mut norm = PluginSpec::new("norm", plugin_path("redact-pii"));
    norm.version = Some("test-1".into());
    let mut t_spec = registry_spec("t");
    t_spec.config.insert("mask".into(), "email".into());
    let reg = Registry::new(t.db.clone());
    let deploy_t = |component: Vec<u8>| {
        let (reg, t_spec) = (reg.clone(), t_spec.clone());
        async move {
            reg.deploy(engine(), &t_spec, &component, &[], "test")
                .await
                .expect("deploy")
                .record()
                .version
        }
    };
    let active = deploy_t(wasm("redact-pii")).await;
    let candidate = deploy_t(wasm("hostile-spin")).await;
    reg.activate("t", active, "test").await.expect("activate");
    reg.shadow("t", candidate, true, None)
        .await
        .expect("shadow");
    let host = rollout(&t.db, vec![norm, t_spec.clone()], routes.clone());
    host.refresh().await.expect("refresh");
    let broker = ScriptedPublisher::new();
    let relay = relay(&t, broker.clone(), &host, routes);

    let mut differing = BTreeSet::new();
    for i in 0..10 {
        let payload = if i % 3 == 0 {
            json!({"spin_ms": 0, "n": i, "email": "a@b"})
        } else {
            json!({"spin_ms": 0, "n": i})
        };
        let id = put_placed(&t.db, "o1", payload).await;
        if i % 3 == 0 {
            differing.insert(id.to_string());
        }
    }
    while relay.step().await.expect("step") != StepOutcome::Idle {}

    let sent = broker.sent();
    assert_eq!(sent.len(), 10, "only the active version publishes");
    for m in &sent {
        let p = json_of(&m.payload);
        assert_ne!(
            p.get("email"),
            Some(&json!("a@b")),
            "an unmasked (candidate) output was published"
        );
    }
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM outbox WHERE transformed_by = 'norm@test-1,t@{active}'"
        ))
        .await,
        10
    );
    host.save_stats_and_promote().await.expect("save stats");
    let record = reg.get("t", candidate).await.expect("candidate");
    let s = &record.shadow_stats;
    assert_eq!((s.matches, s.mismatches, s.errors), (6, 4, 0), "{s:?}");
    let sampled: BTreeSet<String> = s
        .samples
        .iter()
        .map(|x| {
            x.trim_start_matches("event ")
                .split(':')
                .next()
                .expect("id")
                .to_string()
        })
        .collect();
    assert_eq!(
        sampled, differing,
        "samples name exactly the differing events"
    );
    assert!(
        s.samples
            .iter()
            .all(|x| x.ends_with("output 0: payload differs")),
        "{s:?}"
    );
    assert_eq!(record.state, "candidate");
}
on_both!(shadow_reports_exactly_the_mismatching_events_and_publishes_nothing);

async fn a_clean_shadow_is_promoted_after_n_events(t: TestDb) {
    let reg = Registry::new(t.db.clone());
    let v1 = deploy_t(&reg, "cloudevents").await;
    let same = with_custom_section(wasm("cloudevents"), "rebuild-2");
    let v2 = reg
        .deploy(engine(), &registry_spec("t"), &same, &[], "test")
        .await
        .expect("deploy")
        .record()
        .version;
    assert_ne!(v1, v2, "different bytes are a new version");
    reg.activate("t", v1, "test").await.expect("activate");
    reg.shadow("t", v2, true, Some(5)).await.expect("shadow");
    let host = rollout(&t.db, vec![registry_spec("t")], routes());
    host.refresh().await.expect("refresh");
    let relay = relay(&t, ScriptedPublisher::new(), &host, routes());
    for i in 0..5 {
        put_placed(&t.db, "o1", json!({"n": i})).await;
    }
    while relay.step().await.expect("step") != StepOutcome::Idle {}
    host.refresh().await.expect("refresh promotes");
    assert_eq!(reg.get("t", v2).await.expect("v2").state, "active");
    host.refresh().await.expect("refresh swaps");
    assert_eq!(active_label(&host), format!("t@{v2}"));
    assert_eq!(
        reg.rollback("t", "test").await.expect("rollback").version,
        v1
    );
}
on_both!(a_clean_shadow_is_promoted_after_n_events);

// ---- in flight ------------------------------------------------------------
