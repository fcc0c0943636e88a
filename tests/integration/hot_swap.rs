//! Hot swap through the plugin registry: refused deploys, swaps under load,
//! a second host picking up an activation, and shadow runs.
//!
//! Two behaviourally different versions of one plugin `t` come from the
//! example components: `cloudevents` (wraps the payload in an envelope) and
//! `redact-pii` (re-serialises it, masking configured fields).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use outboxd::event::NewEvent;
use outboxd::plugin::registry::{Deployed, Registry, RegistryError};
use outboxd::plugin::{PluginSource, PluginSpec};
use outboxd::relay::{Relay, RelayConfig, Rollout, Route, Router, StepOutcome};
use outboxd::store::{Db, enqueue};
use serde_json::{Value, json};
use sqlx::Row;
use tokio::sync::watch;

use crate::on_both;
use crate::plugins::{engine, plugin_path};
use crate::support::{ScriptedPublisher, TestDb};

/// The registry plugin `t`, with a roomy deadline: these tests are about
/// versions, not limits, and run under load.
fn registry_spec(name: &str) -> PluginSpec {
    let mut s = PluginSpec::new(name, "");
    s.source = PluginSource::Registry;
    s.limits.timeout_ms = 5_000;
    s
}

fn wasm(name: &str) -> Vec<u8> {
    std::fs::read(plugin_path(name)).expect("read component")
}

async fn deploy(reg: &Registry, component: &str) -> i64 {
    match reg
        .deploy(engine(), &registry_spec("t"), &wasm(component), &[], "test")
        .await
        .expect("deploy")
    {
        Deployed::Created(r) => r.version,
        Deployed::Unchanged(r) => panic!("{} was already stored", r.label()),
    }
}

fn routes() -> Vec<Route> {
    vec![Route::new("order.*", "orders").with_transformers(&["t"])]
}

fn rollout(db: &Db, specs: Vec<PluginSpec>, routes: Vec<Route>) -> Rollout {
    Rollout::new(engine().clone(), Registry::new(db.clone()), specs, routes).expect("rollout")
}

/// The label of route 0's active chain on a host.
fn active_label(r: &Rollout) -> String {
    r.chains().snapshot().by_route[0]
        .as_ref()
        .expect("route 0 has a chain")
        .active
        .label()
}

async fn put(db: &Db, agg: &str, payload: Value) -> uuid::Uuid {
    let ev = NewEvent::new(agg, "order.placed", payload);
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

/// `transformed_by` of every outbox row, by id.
async fn transformed_by(db: &Db) -> BTreeMap<String, Option<String>> {
    let sql = "SELECT CAST(id AS TEXT), transformed_by FROM outbox";
    match db {
        Db::Postgres(p) => sqlx::query(sql)
            .fetch_all(p)
            .await
            .expect(sql)
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect(),
        Db::Sqlite(p) => sqlx::query(sql)
            .fetch_all(p)
            .await
            .expect(sql)
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect(),
    }
}

fn relay(
    t: &TestDb,
    broker: Arc<ScriptedPublisher>,
    r: &Rollout,
    routes: Vec<Route>,
) -> Relay<outboxd::store::AnyStore, Arc<ScriptedPublisher>> {
    Relay::new(
        t.store(),
        broker,
        Router::new(routes),
        RelayConfig {
            batch_size: 25,
            ..RelayConfig::default()
        },
        Arc::new(outboxd::clock::SystemClock),
    )
    .with_chains(r.chains())
}

// ---- hand-built hostile components --------------------------------------

/// A component that imports instance `import` (one function `get: func()`)
/// and exports a lifted no-op `func()` as `export`: enough for the checks,
/// which refuse it before anything runs.
fn hand_built_component(import: &str, export: &str) -> Vec<u8> {
    use wasm_encoder::{
        Alias, CanonicalFunctionSection, CodeSection, Component, ComponentAliasSection,
        ComponentExportKind, ComponentExportSection, ComponentImportSection, ComponentTypeRef,
        ComponentTypeSection, ComponentValType, ExportKind, ExportSection, Function,
        FunctionSection, InstanceSection, InstanceType, Instruction, Module, ModuleArg,
        ModuleSection, TypeSection,
    };
    let mut core = Module::new();
    let mut core_types = TypeSection::new();
    core_types.ty().function([], []);
    let mut funcs = FunctionSection::new();
    funcs.function(0);
    let mut core_exports = ExportSection::new();
    core_exports.export("f", ExportKind::Func, 0);
    let mut code = CodeSection::new();
    let mut body = Function::new([]);
    body.instruction(&Instruction::End);
    code.function(&body);
    core.section(&core_types)
        .section(&funcs)
        .section(&core_exports)
        .section(&code);

    let mut instance = InstanceType::new();
    let no_params: [(&str, ComponentValType); 0] = [];
    instance.ty().function().params(no_params).result(None);
    instance.export("get", ComponentTypeRef::Func(0));
    let mut types = ComponentTypeSection::new();
    types.instance(&instance);
    types.function().params(no_params).result(None);
    let mut imports = ComponentImportSection::new();
    imports.import(import, ComponentTypeRef::Instance(0));
    let mut core_instances = InstanceSection::new();
    core_instances.instantiate(0, Vec::<(&str, ModuleArg)>::new());
    let mut aliases = ComponentAliasSection::new();
    aliases.alias(Alias::CoreInstanceExport {
        instance: 0,
        kind: ExportKind::Func,
        name: "f",
    });
    let mut canon = CanonicalFunctionSection::new();
    canon.lift(0, 1, []);
    let mut exports = ComponentExportSection::new();
    exports.export(export, ComponentExportKind::Func, 0, None);
    let mut c = Component::new();
    c.section(&types)
        .section(&imports)
        .section(&ModuleSection(&core))
        .section(&core_instances)
        .section(&aliases)
        .section(&canon)
        .section(&exports);
    c.finish()
}

/// The same component with a custom section appended: identical behaviour,
/// different bytes, so a new version.
pub(crate) fn with_custom_section(mut wasm: Vec<u8>, tag: &str) -> Vec<u8> {
    let body: Vec<u8> = [&[tag.len() as u8][..], tag.as_bytes()].concat();
    assert!(body.len() < 128, "one-byte LEB sizes only");
    wasm.push(0);
    wasm.push(body.len() as u8);
    wasm.extend(body);
    wasm
}

// ---- refusals -----------------------------------------------------------

async fn broken_deploys_are_refused_and_the_active_version_keeps_running(t: TestDb) {
    let reg = Registry::new(t.db.clone());
    let v1 = deploy(&reg, "cloudevents").await;
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
    spec.limits.timeout_ms = 200;
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
        outboxd::relay::Refreshed::Unchanged
    );

    put(&t.db, "o1", json!({"n": 1})).await;
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

fn json_of(payload: &[u8]) -> Value {
    serde_json::from_slice(payload).expect("payload is JSON")
}

// ---- swaps under load -----------------------------------------------------

/// When a version was active: from the start of the refresh that swapped it
/// in to the end of the one that swapped it out (the swap itself happens at
/// one instant inside each refresh).
struct Active {
    from: Instant,
    until: Option<Instant>,
    label: String,
}

async fn twenty_swaps_under_load_lose_nothing_and_process_nothing_twice(t: TestDb) {
    const EVENTS: usize = 1_000;
    const SWAPS: usize = 20;
    let reg = Registry::new(t.db.clone());
    let v_ce = deploy(&reg, "cloudevents").await;
    let v_pii = deploy(&reg, "redact-pii").await;
    reg.activate("t", v_ce, "test").await.expect("activate");
    let host = Arc::new(rollout(&t.db, vec![registry_spec("t")], routes()));
    let t0 = Instant::now();
    host.refresh().await.expect("refresh");
    let mut timeline = vec![Active {
        from: t0,
        until: None,
        label: format!("t@{v_ce}"),
    }];

    let broker = ScriptedPublisher::new();
    let relay = relay(&t, broker.clone(), &host, routes());
    let producing = Arc::new(AtomicBool::new(true));
    let producer = {
        let (db, producing) = (t.db.clone(), producing.clone());
        tokio::spawn(async move {
            for i in 0..EVENTS {
                put(
                    &db,
                    &format!("agg-{}", i % 50),
                    json!({"n": i, "email": "a@b"}),
                )
                .await;
            }
            producing.store(false, Ordering::SeqCst);
        })
    };
    let relaying = {
        let (broker, producing) = (broker.clone(), producing.clone());
        tokio::spawn(async move {
            // (start, end, indexes of broker.sent published in between)
            let mut steps = Vec::new();
            loop {
                let before = broker.sent.lock().expect("lock").len();
                let start = Instant::now();
                let outcome = relay.step().await.expect("step");
                let end = Instant::now();
                let after = broker.sent.lock().expect("lock").len();
                steps.push((start, end, before..after));
                if outcome == StepOutcome::Idle {
                    if !producing.load(Ordering::SeqCst)
                        && relay.step().await.expect("step") == StepOutcome::Idle
                    {
                        return steps;
                    }
                    tokio::task::yield_now().await;
                }
            }
        })
    };

    // Swap every EVENTS / 25 published events, so every version sees load.
    let mut rolled_back = false;
    for i in 0..SWAPS {
        let target_count = (i + 1) * EVENTS / (SWAPS + 5);
        let wait = Instant::now();
        while broker.sent.lock().expect("lock").len() < target_count {
            assert!(
                wait.elapsed() < Duration::from_secs(60),
                "relay stalled at swap {i}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let from = Instant::now();
        let record = if i == SWAPS / 2 {
            rolled_back = true;
            reg.rollback("t", "test").await.expect("rollback")
        } else {
            let v = if i % 2 == 0 { v_pii } else { v_ce };
            reg.activate("t", v, "test").await.expect("activate")
        };
        host.refresh().await.expect("refresh");
        let until = Instant::now();
        assert_eq!(active_label(&host), record.label());
        if let Some(last) = timeline.last_mut() {
            last.until = Some(until);
        }
        timeline.push(Active {
            from,
            until: None,
            label: record.label(),
        });
    }
    assert!(rolled_back);
    producer.await.expect("producer");
    let steps = relaying.await.expect("relay");

    let sent = broker.sent();
    let ids: BTreeSet<_> = sent.iter().map(|m| m.message_id).collect();
    assert_eq!(sent.len(), EVENTS, "every event published once");
    assert_eq!(ids.len(), EVENTS, "no event published twice");
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .await,
        0
    );
    let by = transformed_by(&t.db).await;
    let mut per_version: BTreeMap<String, usize> = BTreeMap::new();
    for (start, end, range) in steps {
        let allowed: Vec<&str> = timeline
            .iter()
            .filter(|a| a.from <= end && a.until.is_none_or(|u| u >= start))
            .map(|a| a.label.as_str())
            .collect();
        for m in &sent[range] {
            let label = by[&m.message_id.to_string()]
                .clone()
                .expect("transformed_by set");
            // The whole event ran on the version it records.
            let enveloped = json_of(&m.payload).get("specversion").is_some();
            assert_eq!(
                enveloped,
                label == format!("t@{v_ce}"),
                "event {} recorded {label}",
                m.message_id
            );
            assert!(
                allowed.contains(&label.as_str()),
                "event {} ran on {label}, active then: {allowed:?}",
                m.message_id
            );
            *per_version.entry(label).or_default() += 1;
        }
    }
    println!(
        "hot swap under load: {EVENTS} events, {SWAPS} swaps (one rollback), events per version: {per_version:?}"
    );
    assert_eq!(per_version.len(), 2, "both versions ran: {per_version:?}");
}
on_both!(twenty_swaps_under_load_lose_nothing_and_process_nothing_twice);

// ---- a second host --------------------------------------------------------

async fn an_activation_reaches_another_host_within_two_seconds(t: TestDb) {
    let reg_a = Registry::new(t.db.clone());
    let v1 = deploy(&reg_a, "cloudevents").await;
    let v2 = deploy(&reg_a, "redact-pii").await;
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
        while active_label(&host_b) != format!("t@{v}") {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "host B still runs {}",
                active_label(&host_b)
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
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
    put(&t.db, "o1", json!({"n": 1})).await;
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
        let id = put(&t.db, "o1", payload).await;
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
    let v1 = deploy(&reg, "cloudevents").await;
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
        put(&t.db, "o1", json!({"n": i})).await;
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

async fn an_event_in_flight_finishes_on_the_version_it_started_with(t: TestDb) {
    let reg = Registry::new(t.db.clone());
    let slow = deploy(&reg, "hostile-spin").await;
    let next = deploy(&reg, "redact-pii").await;
    reg.activate("t", slow, "test").await.expect("activate");
    let host = rollout(&t.db, vec![registry_spec("t")], routes());
    host.refresh().await.expect("refresh");
    let slow_plugin = host.chains().snapshot().by_route[0]
        .as_ref()
        .expect("chain")
        .active
        .plugins()[0]
        .clone();
    let relay = relay(&t, ScriptedPublisher::new(), &host, routes());
    let first = put(&t.db, "o1", json!({"spin_ms": 1000})).await;
    let started = Instant::now();
    let in_flight = tokio::spawn(async move {
        let outcome = relay.step().await.expect("step");
        (relay, outcome, started.elapsed())
    });
    // The call has begun once its Store is being instantiated. It spins for
    // a second (blocking one runtime thread, as a busy plugin does), which
    // leaves the swap ample time to finish first.
    while slow_plugin.metrics().snapshot().instantiations == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the call never started"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let swap = Instant::now();
    reg.activate("t", next, "test").await.expect("activate");
    host.refresh().await.expect("refresh");
    let swap_took = swap.elapsed();
    assert_eq!(active_label(&host), format!("t@{next}"));
    // A plugin call holds its runtime thread (the deadline traps, it does
    // not yield), which can delay this task's I/O until the call ends; the
    // versions below are checked either way, the overlap is reported.
    let overlapped = !in_flight.is_finished();
    let (relay, outcome, call_took) = in_flight.await.expect("in flight");
    assert!(matches!(outcome, StepOutcome::Published(r) if r.published == 1));
    let second = put(&t.db, "o2", json!({"spin_ms": 0})).await;
    relay.step().await.expect("step");
    let by = transformed_by(&t.db).await;
    assert_eq!(
        by[&first.to_string()],
        Some(format!("t@{slow}")),
        "in flight: old version"
    );
    assert_eq!(
        by[&second.to_string()],
        Some(format!("t@{next}")),
        "next event: new version"
    );
    println!(
        "in flight: activate + swap took {swap_took:?} (done while the call ran: {overlapped}); the 1000 ms call finished on t@{slow} after {call_took:?}"
    );
}
on_both!(an_event_in_flight_finishes_on_the_version_it_started_with);
