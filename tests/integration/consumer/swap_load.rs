//! Twenty hot swaps of the registry consumer plugin `c` (one a rollback),
//! with the route's transformer swapped at the same moments, while the relay
//! and a consumer are both busy: nothing is lost or handled twice, and each
//! message ran on a version that was active during its call. The two
//! versions, `billing` and `invoicing`, are described in `support/swap.rs`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outboxd::broker::embedded::{EmbeddedConsumer, EmbeddedConsumerConfig, EmbeddedPublisher};
use outboxd::consumer::Consumer;
use outboxd::consumer::ConsumerConfig;
use outboxd::consumer::Handler;
use outboxd::consumer::HandlerError;
use outboxd::consumer::Pinned;
use outboxd::consumer::PluginHandler;
use outboxd::message::Delivery;
use outboxd::plugin::lifecycle::registry::Registry;
use outboxd::plugin::lifecycle::rollout::Rollout;
use outboxd::relay::Relay;
use outboxd::relay::RelayConfig;
use outboxd::relay::StepOutcome;
use outboxd::route::Route;
use outboxd::route::Router;
use outboxd::store::InboxTx;
use outboxd_demo::billing;
use tokio::sync::watch;

use crate::support::db::pairs;
use crate::support::plugins::{engine, registry_spec, wasm, with_custom_section};
use crate::support::swap::{Timeline, deploy, put_order};
use crate::support::{TestDb, eventually, on_both};

/// One call of the consumer's handler, as the test saw it from outside.
pub(crate) struct Call {
    start: Instant,
    end: Instant,
    message_id: String,
    label: Option<String>,
    ok: bool,
}

/// The registry consumer plugin, with every call recorded.
pub(crate) struct Recording {
    inner: PluginHandler,
    calls: Mutex<Vec<Call>>,
}

impl Handler for Recording {
    async fn begin(&self, tx: &mut InboxTx) -> Result<(), sqlx::Error> {
        self.inner.begin(tx).await
    }

    async fn handle(&self, tx: &mut InboxTx, d: &Delivery) -> Result<(), HandlerError> {
        self.handle_pinned(&self.pin(), tx, d).await
    }

    fn pin(&self) -> Pinned {
        self.inner.pin()
    }

    async fn handle_pinned(
        &self,
        pinned: &Pinned,
        tx: &mut InboxTx,
        d: &Delivery,
    ) -> Result<(), HandlerError> {
        let result = self.inner.handle_pinned(pinned, tx, d).await;
        let call = Call {
            start: pinned.picked_at,
            end: Instant::now(),
            message_id: d.message_id().map(|u| u.to_string()).unwrap_or_default(),
            label: pinned.label.clone(),
            ok: result.is_ok(),
        };
        self.calls.lock().expect("lock").push(call);
        result
    }
}

async fn twenty_consumer_swaps_under_load_lose_nothing_and_handle_nothing_twice(t: TestDb) {
    const EVENTS: usize = 600;
    const SWAPS: usize = 20;
    const PARTITIONS: i32 = 4;
    billing::create_schema(&t.db).await.expect("billing schema");
    let reg = Registry::new(t.db.clone());
    let v_billing = deploy(&reg, "c", wasm("billing")).await;
    let v_invoicing = deploy(&reg, "c", wasm("invoicing")).await;
    // The route's transformer swaps at the same moments: two builds of
    // redact-pii (no rules: canonical JSON, which both consumers read).
    let t1 = deploy(&reg, "t", wasm("redact-pii")).await;
    let t2 = deploy(
        &reg,
        "t",
        with_custom_section(wasm("redact-pii"), "rebuild-2"),
    )
    .await;
    reg.activate("c", v_billing, "test")
        .await
        .expect("activate");
    reg.activate("t", t1, "test").await.expect("activate");
    let routes = vec![Route::new("order.*", "orders").with_transformers(&["t"])];
    let host = Rollout::new(
        engine().clone(),
        Registry::new(t.db.clone()),
        vec![registry_spec("c"), registry_spec("t")],
        routes.clone(),
    )
    .expect("rollout")
    .with_consumers(["c".to_string()]);
    let t0 = Instant::now();
    host.refresh().await.expect("refresh");
    let mut timeline = Timeline::new(t0, format!("c@{v_billing}"));
    let slot = host.consumer("c").expect("consumer slot");
    assert_eq!(slot.label(), Some(format!("c@{v_billing}")));

    let (stop, stopped) = watch::channel(false);
    let relay = Relay::new(
        t.store(),
        Arc::new(EmbeddedPublisher::new(t.db.clone(), PARTITIONS)),
        Router::new(routes),
        RelayConfig {
            batch_size: 25,
            ..RelayConfig::default()
        },
        Arc::new(outboxd::clock::SystemClock),
    )
    .with_chains(host.chains());
    let relaying = {
        let stopped = stopped.clone();
        tokio::spawn(async move {
            while !*stopped.borrow() {
                if relay.step().await.expect("relay step") == StepOutcome::Idle {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        })
    };
    let handler = Arc::new(Recording {
        inner: PluginHandler::swappable(slot.clone(), crate::support::plugin_policy()),
        calls: Mutex::default(),
    });
    let source = EmbeddedConsumer::new(
        t.db.clone(),
        EmbeddedConsumerConfig {
            group: "billing".into(),
            topics: vec!["orders".into()],
            partitions: PARTITIONS,
            lease: Duration::from_secs(30),
        },
    );
    let mut consumer = Consumer::new(
        t.db.clone(),
        source,
        handler.clone(),
        ConsumerConfig {
            name: "billing".into(),
            poll_interval: Duration::from_millis(5),
            retry_delay: Duration::from_millis(20),
            // A savepoint per message: each message still pins its version.
            batch_in_transaction: 4,
            ..ConsumerConfig::default()
        },
    );
    let stats = consumer.stats();
    let consuming = {
        let stopped = stopped.clone();
        tokio::spawn(async move { consumer.run(stopped).await.expect("consumer") })
    };
    let handled = {
        let stats = stats.clone();
        move || stats.handled.load(Ordering::SeqCst) as usize
    };
    // The producer stays at most 40 events ahead of the consumer, so it
    // enqueues for the whole run and the relay and the consumer never idle
    // for long.
    let producing = Arc::new(AtomicBool::new(true));
    let producer = {
        let (db, producing, handled) = (t.db.clone(), producing.clone(), handled.clone());
        tokio::spawn(async move {
            for i in 0..EVENTS {
                while i >= handled() + 40 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                put_order(&db, i).await;
            }
            producing.store(false, Ordering::SeqCst);
        })
    };

    let mut rolled_back = false;
    for i in 0..SWAPS {
        let target = (i + 1) * EVENTS / (SWAPS + 5);
        eventually(
            Duration::from_secs(120),
            format!("consumer stalled at swap {i}"),
            async || {
                let handled = handled();
                if handled >= target {
                    Ok(())
                } else {
                    Err(format!("{handled} handled"))
                }
            },
        )
        .await;
        assert!(
            producing.load(Ordering::SeqCst),
            "the producer finished before swap {i}: not under load"
        );
        let from = Instant::now();
        let record = if i == SWAPS / 2 {
            rolled_back = true;
            reg.rollback("t", "test").await.expect("rollback t");
            reg.rollback("c", "test").await.expect("rollback c")
        } else {
            let (c, tv) = if i % 2 == 0 {
                (v_invoicing, t2)
            } else {
                (v_billing, t1)
            };
            reg.activate("t", tv, "test").await.expect("activate t");
            reg.activate("c", c, "test").await.expect("activate c")
        };
        host.refresh().await.expect("refresh");
        let until = Instant::now();
        assert_eq!(slot.label(), Some(record.label()));
        timeline.swapped(from, until, record.label());
    }
    assert!(rolled_back);
    producer.await.expect("producer");
    eventually(
        Duration::from_secs(120),
        "not every event was handled",
        async || {
            let handled = t.count("SELECT count(*) FROM inbox").await;
            if handled >= EVENTS as i64 {
                Ok(())
            } else {
                Err(format!("{handled} of {EVENTS}"))
            }
        },
    )
    .await;
    let _ = stop.send(true);
    relaying.await.expect("relay task");
    consuming.await.expect("consumer task");

    // Nothing lost, nothing twice: one inbox row and one invoice per event.
    let billing_label = format!("c@{v_billing}");
    let invoicing_label = format!("c@{v_invoicing}");
    assert_eq!(t.count("SELECT count(*) FROM inbox").await, EVENTS as i64);
    assert_eq!(
        t.count("SELECT count(*) FROM invoices").await,
        EVENTS as i64
    );
    assert_eq!(
        t.count("SELECT count(DISTINCT message_id) FROM invoices")
            .await,
        EVENTS as i64,
        "an event was handled twice"
    );
    assert_eq!(
        t.count("SELECT count(DISTINCT order_id) FROM invoices")
            .await,
        EVENTS as i64
    );
    assert_eq!(
        t.count("SELECT count(*) FROM consumer_dead_letters").await,
        0
    );
    // The effect shows which version ran; the inbox row must name it.
    let by_inbox: BTreeMap<String, Option<String>> = pairs(
        &t.db,
        "SELECT CAST(message_id AS TEXT), handled_by FROM inbox",
    )
    .await
    .into_iter()
    .collect();
    let effects = pairs(
        &t.db,
        "SELECT message_id, CASE WHEN issued_at = 0 THEN 'invoicing' ELSE 'billing' END FROM invoices",
    )
    .await;
    let mut per_version: BTreeMap<String, usize> = BTreeMap::new();
    for (message_id, effect) in &effects {
        let label = by_inbox[message_id].clone().expect("handled_by is set");
        let want = match effect.as_deref() {
            Some("invoicing") => &invoicing_label,
            _ => &billing_label,
        };
        assert_eq!(&label, want, "message {message_id}: effect vs handled_by");
        *per_version.entry(label).or_default() += 1;
    }
    // Only invoicing emits, in the handler's transaction.
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE event_type = 'invoice.issued'")
            .await,
        per_version.get(&invoicing_label).copied().unwrap_or(0) as i64
    );
    // Each call ran on a version that was active at some point during it.
    let calls = std::mem::take(&mut *handler.calls.lock().expect("lock"));
    for call in calls.iter().filter(|c| c.ok) {
        let label = call.label.as_deref().expect("an ok call names its version");
        let allowed = timeline.active_during(call.start, call.end);
        assert!(
            allowed.contains(&label),
            "message {} ran on {label}, active then: {allowed:?}",
            call.message_id
        );
    }
    for (message_id, label) in &by_inbox {
        assert!(
            calls
                .iter()
                .any(|c| c.ok && &c.message_id == message_id && c.label == *label),
            "message {message_id}: recorded {label:?} but no such call"
        );
    }
    let t_versions = t
        .count("SELECT count(DISTINCT transformed_by) FROM outbox WHERE event_type = 'order.confirmed'")
        .await;
    println!(
        "consumer hot swap under load ({}): {EVENTS} events, {SWAPS} swaps of consumer and transformer (one rollback), messages per consumer version: {per_version:?}, handler calls {}, duplicates {}, transformer versions used {t_versions}",
        if t.is_postgres() {
            "postgres"
        } else {
            "sqlite"
        },
        calls.len(),
        stats.duplicates.load(Ordering::SeqCst),
    );
    assert_eq!(per_version.len(), 2, "both versions ran: {per_version:?}");
    assert!(
        per_version.values().all(|n| *n >= EVENTS / 10),
        "each version handled a fair share: {per_version:?}"
    );
    assert_eq!(t_versions, 2, "both transformer versions ran");
}
on_both!(twenty_consumer_swaps_under_load_lose_nothing_and_handle_nothing_twice);
