//! Consumer plugins in the registry, beyond swapping: a deploy records the
//! consumer world and a name keeps its world; a dead letter and the inbox
//! name the registry version; a message waits while no version is active;
//! a shadow candidate runs in a savepoint that is always rolled back.

use std::sync::Arc;
use std::time::Duration;

use outboxd::broker::embedded::{EmbeddedConsumer, EmbeddedConsumerConfig, EmbeddedPublisher};
use outboxd::config::OnDead;
use outboxd::consumer::Consumer;
use outboxd::consumer::ConsumerConfig;
use outboxd::consumer::ConsumerStep;
use outboxd::message::Delivery;
use outboxd::plugin::lifecycle::registry::{Deployed, Registry};
use outboxd::plugin::lifecycle::rollout::Rollout;
use outboxd_demo::billing;
use serde_json::json;

use crate::support::db::pairs;
use crate::support::plugins::{engine, registry_spec, wasm, with_custom_section};
use crate::support::swap::{consumer_host, deploy};
use crate::support::{TestDb, on_both};

// ---- deploy checks ---------------------------------------------------------

async fn a_consumer_deploy_records_its_world_and_a_name_keeps_its_world(t: TestDb) {
    let reg = Registry::new(t.db.clone());
    let v1 = deploy(&reg, "c", wasm("billing")).await;
    assert_eq!(reg.get("c", v1).await.expect("c@1").world, "consumer");
    let refused = |r: Result<Deployed, outboxd::plugin::RegistryError>| match r {
        Err(outboxd::plugin::RegistryError::Refused { reason, .. }) => reason,
        other => panic!("not refused: {other:?}"),
    };
    let reason = refused(
        reg.deploy(
            engine(),
            &registry_spec("c"),
            &wasm("cloudevents"),
            &[],
            "test",
        )
        .await,
    );
    assert!(
        reason.contains(
            "implements the transformer world, but the stored versions of `c` are consumers"
        ),
        "{reason}"
    );
    let sample = outboxd::plugin::harness::SampleEvent::parse(
        "s.json",
        r#"{"event_type": "order.confirmed", "payload": {}}"#,
    )
    .expect("sample");
    let reason = refused(
        reg.deploy(
            engine(),
            &registry_spec("c2"),
            &wasm("invoicing"),
            &[sample],
            "test",
        )
        .await,
    );
    assert!(
        reason.contains("sample events are run for transformers only"),
        "{reason}"
    );
    assert_eq!(
        reg.list().await.expect("list").len(),
        1,
        "nothing refused was stored"
    );
    // A consumer slot refuses a transformer version: the previous one stays.
    let t1 = deploy(&reg, "t", wasm("cloudevents")).await;
    reg.activate("c", v1, "test").await.expect("activate");
    reg.activate("t", t1, "test").await.expect("activate");
    let host = Rollout::new(
        engine().clone(),
        Registry::new(t.db.clone()),
        vec![registry_spec("t")],
        Vec::new(),
    )
    .expect("rollout")
    .with_consumers(["t".to_string()]);
    assert!(
        host.refresh().await.is_err(),
        "a transformer cannot run as a consumer"
    );
    assert_eq!(host.consumer("t").expect("slot").label(), None);
}
on_both!(a_consumer_deploy_records_its_world_and_a_name_keeps_its_world);

// ---- dead letters ----------------------------------------------------------

async fn a_dead_letter_names_the_registry_version_that_failed(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let reg = Registry::new(t.db.clone());
    let v1 = deploy(&reg, "c", wasm("billing")).await;
    let (host, handler) = consumer_host(&t).await;
    let handler = Arc::new(handler);
    let publisher = EmbeddedPublisher::new(t.db.clone(), 1);
    let topic = "orders";
    let send = |payload: serde_json::Value| {
        let publisher = &publisher;
        async move {
            use outboxd::broker::Publisher;
            use outboxd::message::OutgoingMessage;
            let id = uuid::Uuid::new_v4();
            publisher
                .publish(OutgoingMessage {
                    topic: topic.into(),
                    key: b"k".to_vec(),
                    payload: payload.to_string().into_bytes(),
                    headers: vec![(
                        outboxd::message::headers::MESSAGE_ID.into(),
                        id.to_string().into_bytes(),
                    )],
                    message_id: id,
                    created_at: chrono::Utc::now(),
                })
                .await
                .expect("publish");
            id
        }
    };
    let mut consumer = Consumer::new(
        t.db.clone(),
        EmbeddedConsumer::new(
            t.db.clone(),
            EmbeddedConsumerConfig {
                group: "billing".into(),
                topics: vec![topic.into()],
                partitions: 1,
                lease: Duration::from_secs(30),
            },
        ),
        handler.clone(),
        ConsumerConfig {
            name: "billing".into(),
            // The fallback, for a message that fails before a version is
            // picked; every message below names its own.
            handler_id: handler.handler_id(),
            max_attempts: 1,
            // One key throughout: both poison messages are dead letters
            // of their own, not the second parked behind the first.
            on_dead: OnDead::Skip,
            ..ConsumerConfig::default()
        },
    );
    // billing refuses a CloudEvents envelope of an unknown specversion
    // permanently: a dead letter at once, but only once a version runs.
    // With none active the message waits, whatever max_attempts says.
    let poison = json!({"specversion": "9", "data": {"order_id": "x", "customer_id": "c", "total_cents": 1}});
    send(poison.clone()).await;
    for _ in 0..3 {
        assert_eq!(
            consumer.step().await.expect("step"),
            ConsumerStep::Failed { handled: 0 }
        );
    }
    assert_eq!(
        t.count("SELECT count(*) FROM consumer_dead_letters").await,
        0,
        "no version was active: nothing may be dead-lettered"
    );
    reg.activate("c", v1, "test").await.expect("activate");
    host.refresh().await.expect("refresh");
    consumer.step().await.expect("step");
    // Swap to v2 (the same plugin, rebuilt) and fail again.
    let v2 = deploy(&reg, "c", with_custom_section(wasm("billing"), "rebuild-2")).await;
    reg.activate("c", v2, "test").await.expect("activate v2");
    host.refresh().await.expect("refresh");
    send(poison).await;
    let ok = send(json!({"order_id": "o1", "customer_id": "c", "total_cents": 5})).await;
    consumer.step().await.expect("step");
    consumer.step().await.expect("step");
    let handlers = pairs(
        &t.db,
        "SELECT handler, CAST(NULL AS TEXT) FROM consumer_dead_letters ORDER BY id",
    )
    .await;
    let handlers: Vec<String> = handlers.into_iter().map(|(h, _)| h).collect();
    assert_eq!(
        handlers,
        vec![format!("plugin c@{v1}"), format!("plugin c@{v2}")]
    );
    assert_eq!(handler.handler_id(), "plugin c (registry)");
    assert_eq!(
        pairs(
            &t.db,
            &format!(
                "SELECT CAST(message_id AS TEXT), handled_by FROM inbox WHERE CAST(message_id AS TEXT) = '{ok}'"
            )
        )
        .await,
        vec![(ok.to_string(), Some(format!("c@{v2}")))]
    );
}
on_both!(a_dead_letter_names_the_registry_version_that_failed);

// ---- consumer shadow ---------------------------------------------------------

async fn a_consumer_shadow_runs_in_a_rolled_back_savepoint_and_counts(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let reg = Registry::new(t.db.clone());
    let active = deploy(&reg, "c", wasm("billing")).await;
    // The candidate writes an invoice and emits an event (both must vanish),
    // and fails on a CloudEvents envelope, which billing accepts.
    let candidate = deploy(&reg, "c", wasm("invoicing")).await;
    reg.activate("c", active, "test").await.expect("activate");
    reg.shadow("c", candidate, true, None)
        .await
        .expect("shadow");
    let (host, handler) = consumer_host(&t).await;
    for i in 0..6 {
        let payload = if i % 3 == 0 {
            json!({"specversion": "1.0", "data": {"order_id": format!("o{i}"), "customer_id": "c", "total_cents": 1}})
        } else {
            json!({"order_id": format!("o{i}"), "customer_id": "c", "total_cents": 1})
        };
        let d = Delivery {
            attempt: 0,
            topic: "orders".into(),
            partition: 0,
            offset: i,
            key: None,
            payload: payload.to_string().into_bytes(),
            headers: vec![(
                outboxd::message::headers::MESSAGE_ID.into(),
                uuid::Uuid::new_v4().to_string().into_bytes(),
            )],
        };
        outboxd::consumer::process(&t.db, "billing", &d, &handler)
            .await
            .expect("the active version handles it");
    }
    assert_eq!(t.count("SELECT count(*) FROM invoices").await, 6);
    assert_eq!(
        t.count("SELECT count(*) FROM invoices WHERE issued_at = 0")
            .await,
        0,
        "no candidate write survived"
    );
    assert_eq!(
        t.count("SELECT count(*) FROM outbox").await,
        0,
        "no candidate event survived"
    );
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM inbox WHERE handled_by = 'c@{active}'"
        ))
        .await,
        6
    );
    host.save_stats_and_promote().await.expect("save stats");
    let s = reg
        .get("c", candidate)
        .await
        .expect("candidate")
        .shadow_stats;
    assert_eq!((s.matches, s.mismatches, s.errors), (4, 0, 2), "{s:?}");
}
on_both!(a_consumer_shadow_runs_in_a_rolled_back_savepoint_and_counts);
