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

use outboxd::plugin::lifecycle::registry::Registry;
use outboxd::relay::StepOutcome;
use serde_json::json;

use crate::support::plugins::{json_of, registry_spec};
use crate::support::swap::{
    Timeline, active_label, deploy_t, put_placed, relay, rollout, routes, transformed_by,
};
use crate::support::{ScriptedPublisher, TestDb, eventually, on_both};

// ---- swaps under load -----------------------------------------------------

async fn twenty_swaps_under_load_lose_nothing_and_process_nothing_twice(t: TestDb) {
    const EVENTS: usize = 1_000;
    const SWAPS: usize = 20;
    let reg = Registry::new(t.db.clone());
    let v_ce = deploy_t(&reg, "cloudevents").await;
    let v_pii = deploy_t(&reg, "redact-pii").await;
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
                put_placed(
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
        eventually(
            Duration::from_secs(60),
            format!("relay stalled at swap {i}"),
            async || {
                let sent = broker.sent.lock().expect("lock").len();
                if sent >= target_count {
                    Ok(())
                } else {
                    Err(format!("{sent} sent"))
                }
            },
        )
        .await;
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
    let slow = deploy_t(&reg, "hostile-spin").await;
    let next = deploy_t(&reg, "redact-pii").await;
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
    let first = put_placed(&t.db, "o1", json!({"spin_ms": 1000})).await;
    let started = Instant::now();
    let in_flight = tokio::spawn(async move {
        let outcome = relay.step().await.expect("step");
        (relay, outcome, started.elapsed())
    });
    // The call has begun once its Store is being instantiated. It spins for
    // a second (blocking one runtime thread, as a busy plugin does), which
    // leaves the swap ample time to finish first.
    eventually(
        Duration::from_secs(10),
        "the call never started",
        async || slow_plugin.metrics().snapshot().instantiations != 0,
    )
    .await;
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
    let second = put_placed(&t.db, "o2", json!({"spin_ms": 0})).await;
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
