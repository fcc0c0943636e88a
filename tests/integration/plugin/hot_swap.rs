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

use outboxd::config::PluginSource;
use outboxd::config::PluginSpec;
use outboxd::event::NewEvent;
use outboxd::plugin::registry::{Deployed, Registry};
use outboxd::plugin::rollout::Rollout;
use outboxd::relay::Relay;
use outboxd::relay::RelayConfig;
use outboxd::relay::StepOutcome;
use outboxd::route::Route;
use outboxd::route::Router;
use outboxd::store::{Db, enqueue};
use serde_json::{Value, json};
use sqlx::Row;

use crate::on_both;
use crate::plugins::{engine, plugin_path};
use crate::support::{ScriptedPublisher, TestDb};

/// The registry plugin `t`, with a roomy deadline: these tests are about
/// versions, not limits, and run under load.
pub(crate) fn registry_spec(name: &str) -> PluginSpec {
    let mut s = PluginSpec::new(name, "");
    s.source = PluginSource::Registry;
    s.limits.timeout = std::time::Duration::from_millis(5_000);
    s
}

pub(crate) fn wasm(name: &str) -> Vec<u8> {
    std::fs::read(plugin_path(name)).expect("read component")
}

pub(crate) async fn deploy(reg: &Registry, component: &str) -> i64 {
    match reg
        .deploy(engine(), &registry_spec("t"), &wasm(component), &[], "test")
        .await
        .expect("deploy")
    {
        Deployed::Created(r) => r.version,
        Deployed::Unchanged(r) => panic!("{} was already stored", r.label()),
    }
}

pub(crate) fn routes() -> Vec<Route> {
    vec![Route::new("order.*", "orders").with_transformers(&["t"])]
}

pub(crate) fn rollout(db: &Db, specs: Vec<PluginSpec>, routes: Vec<Route>) -> Rollout {
    Rollout::new(engine().clone(), Registry::new(db.clone()), specs, routes).expect("rollout")
}

/// The label of route 0's active chain on a host.
pub(crate) fn active_label(r: &Rollout) -> String {
    r.chains().snapshot().by_route[0]
        .as_ref()
        .expect("route 0 has a chain")
        .active
        .label()
}

pub(crate) async fn put(db: &Db, agg: &str, payload: Value) -> uuid::Uuid {
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
pub(crate) async fn transformed_by(db: &Db) -> BTreeMap<String, Option<String>> {
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

pub(crate) fn relay(
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

pub(crate) fn json_of(payload: &[u8]) -> Value {
    serde_json::from_slice(payload).expect("payload is JSON")
}

// ---- swaps under load -----------------------------------------------------

/// When each version was active: from the start of the change that swapped
/// it in to the end of the refresh that swapped it out (the swap itself
/// happens at one instant inside that window). The swap-under-load tests
/// check every call against it.
pub(crate) struct Timeline(Vec<Active>);

struct Active {
    from: Instant,
    until: Option<Instant>,
    label: String,
}

impl Timeline {
    pub(crate) fn new(from: Instant, label: String) -> Self {
        Timeline(vec![Active {
            from,
            until: None,
            label,
        }])
    }

    /// `label` replaced the active version by a change that began at
    /// `from` and whose refresh ended at `until`.
    pub(crate) fn swapped(&mut self, from: Instant, until: Instant, label: String) {
        if let Some(last) = self.0.last_mut() {
            last.until = Some(until);
        }
        self.0.push(Active {
            from,
            until: None,
            label,
        });
    }

    /// The versions active at some moment between `start` and `end`.
    pub(crate) fn active_during(&self, start: Instant, end: Instant) -> Vec<&str> {
        self.0
            .iter()
            .filter(|a| a.from <= end && a.until.is_none_or(|u| u >= start))
            .map(|a| a.label.as_str())
            .collect()
    }
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
    let mut timeline = Timeline::new(t0, format!("t@{v_ce}"));

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
        timeline.swapped(from, until, record.label());
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
        let allowed = timeline.active_during(start, end);
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
