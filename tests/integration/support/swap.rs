//! Hot swap through the plugin registry: the shared helpers.
//!
//! Transformers: two behaviourally different versions of one plugin `t`
//! come from the example components: `cloudevents` (wraps the payload in an
//! envelope) and `redact-pii` (re-serialises it, masking configured
//! fields).
//!
//! Consumers: two behaviourally different versions of one consumer plugin
//! `c` come from the example components: `billing` (an invoice stamped with
//! the current time) and `invoicing` (an invoice with `issued_at = 0` plus
//! an `invoice.issued` event emitted in the same transaction). So every
//! effect shows which version wrote it, and can be checked against the
//! inbox row's `handled_by`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use outboxd::config::PluginSpec;
use outboxd::consumer::PluginHandler;
use outboxd::event::NewEvent;
use outboxd::plugin::lifecycle::registry::{Deployed, Registry};
use outboxd::plugin::lifecycle::rollout::Rollout;
use outboxd::relay::Relay;
use outboxd::relay::RelayConfig;
use outboxd::route::Route;
use outboxd::route::Router;
use outboxd::store::Db;
use serde_json::{Value, json};

use super::db::{TestDb, enqueue_on, pairs, put};
use super::plugins::{engine, plugin_policy, registry_spec, wasm};
use super::publisher::ScriptedPublisher;

/// Stores `wasm` as a new version of the registry plugin `name`.
pub async fn deploy(reg: &Registry, name: &str, wasm: Vec<u8>) -> i64 {
    match reg
        .deploy(engine(), &registry_spec(name), &wasm, &[], "test")
        .await
        .expect("deploy")
    {
        Deployed::Created(r) => r.version,
        Deployed::Unchanged(r) => panic!("{} was already stored", r.label()),
    }
}

// ---- transformers: the plugin `t` ------------------------------------------

/// Stores the example component `component` as a new version of `t`.
pub async fn deploy_t(reg: &Registry, component: &str) -> i64 {
    deploy(reg, "t", wasm(component)).await
}

pub fn routes() -> Vec<Route> {
    vec![Route::new("order.*", "orders").with_transformers(&["t"])]
}

pub fn rollout(db: &Db, specs: Vec<PluginSpec>, routes: Vec<Route>) -> Rollout {
    Rollout::new(engine().clone(), Registry::new(db.clone()), specs, routes).expect("rollout")
}

/// The label of route 0's active chain on a host.
pub fn active_label(r: &Rollout) -> String {
    r.chains().snapshot().by_route[0]
        .as_ref()
        .expect("route 0 has a chain")
        .active
        .label()
}

/// Commits one `order.placed` event of `agg`; returns its id.
pub async fn put_placed(db: &Db, agg: &str, payload: Value) -> uuid::Uuid {
    put(db, agg, "order.placed", payload).await
}

/// `transformed_by` of every outbox row, by id.
pub async fn transformed_by(db: &Db) -> BTreeMap<String, Option<String>> {
    pairs(db, "SELECT CAST(id AS TEXT), transformed_by FROM outbox")
        .await
        .into_iter()
        .collect()
}

pub fn relay(
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

/// When each version was active: from the start of the change that swapped
/// it in to the end of the refresh that swapped it out (the swap itself
/// happens at one instant inside that window). The swap-under-load tests
/// check every call against it.
pub struct Timeline(Vec<Active>);

struct Active {
    from: Instant,
    until: Option<Instant>,
    label: String,
}

impl Timeline {
    pub fn new(from: Instant, label: String) -> Self {
        Timeline(vec![Active {
            from,
            until: None,
            label,
        }])
    }

    /// `label` replaced the active version by a change that began at
    /// `from` and whose refresh ended at `until`.
    pub fn swapped(&mut self, from: Instant, until: Instant, label: String) {
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
    pub fn active_during(&self, start: Instant, end: Instant) -> Vec<&str> {
        self.0
            .iter()
            .filter(|a| a.from <= end && a.until.is_none_or(|u| u >= start))
            .map(|a| a.label.as_str())
            .collect()
    }
}

// ---- consumers: the plugin `c` ---------------------------------------------

/// A host whose one plugin is the registry consumer `c`, refreshed once,
/// and a handler that follows its slot (each call runs on the version
/// active when it starts).
pub async fn consumer_host(t: &TestDb) -> (Rollout, PluginHandler) {
    let host = Rollout::new(
        engine().clone(),
        Registry::new(t.db.clone()),
        vec![registry_spec("c")],
        Vec::new(),
    )
    .expect("rollout")
    .with_consumers(["c".to_string()]);
    host.refresh().await.expect("refresh");
    let handler = PluginHandler::swappable(host.consumer("c").expect("slot"), plugin_policy());
    (host, handler)
}

/// Commits the `order.confirmed` event of order `o-{i}`.
pub async fn put_order(db: &Db, i: usize) {
    let ev = NewEvent::new(
        format!("order-{i}"),
        "order.confirmed",
        json!({"order_id": format!("o-{i}"), "customer_id": "c1", "total_cents": i}),
    );
    enqueue_on(db, ev).await;
}
