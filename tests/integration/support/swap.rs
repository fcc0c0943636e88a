//! Hot swap of consumer plugins through the registry: the shared helpers.
//! `consumer_swap_load.rs` has twenty swaps (one a rollback) while the relay
//! and a consumer are both busy; `consumer_swap_in_flight.rs` a message in
//! flight during a swap; `consumer_swap_checks.rs` deploy checks, dead
//! letters and shadow runs; `swap_processes.rs` two `outboxd` processes.
//!
//! Two behaviourally different versions of one consumer plugin `c` come
//! from the example components: `billing` (an invoice stamped with the
//! current time) and `invoicing` (an invoice with `issued_at = 0` plus an
//! `invoice.issued` event emitted in the same transaction). So every effect
//! shows which version wrote it, and can be checked against the inbox row's
//! `handled_by`.

use outboxd::config::PluginSource;
use outboxd::config::PluginSpec;
use outboxd::consumer::PluginHandler;
use outboxd::event::NewEvent;
use outboxd::plugin::registry::{Deployed, Registry};
use outboxd::plugin::rollout::Rollout;
use outboxd::store::{Db, enqueue};
use serde_json::json;
use sqlx::Row;

use crate::plugins::{engine, plugin_path};
use crate::support::TestDb;

pub(crate) fn registry_spec(name: &str) -> PluginSpec {
    let mut s = PluginSpec::new(name, "");
    s.source = PluginSource::Registry;
    s.limits.timeout = std::time::Duration::from_millis(5_000);
    s
}

/// A host whose one plugin is the registry consumer `c`, refreshed once,
/// and a handler that follows its slot (each call runs on the version
/// active when it starts).
pub(crate) async fn consumer_host(t: &TestDb) -> (Rollout, PluginHandler) {
    let host = Rollout::new(
        engine().clone(),
        Registry::new(t.db.clone()),
        vec![registry_spec("c")],
        Vec::new(),
    )
    .expect("rollout")
    .with_consumers(["c".to_string()]);
    host.refresh().await.expect("refresh");
    let handler = PluginHandler::swappable(
        host.consumer("c").expect("slot"),
        crate::support::plugin_policy(),
    );
    (host, handler)
}

pub(crate) async fn deploy(reg: &Registry, name: &str, wasm: Vec<u8>) -> i64 {
    match reg
        .deploy(engine(), &registry_spec(name), &wasm, &[], "test")
        .await
        .expect("deploy")
    {
        Deployed::Created(r) => r.version,
        Deployed::Unchanged(r) => panic!("{} was already stored", r.label()),
    }
}

pub(crate) fn wasm(name: &str) -> Vec<u8> {
    std::fs::read(plugin_path(name)).expect("read component")
}

pub(crate) async fn put_order(db: &Db, i: usize) {
    let ev = NewEvent::new(
        format!("order-{i}"),
        "order.confirmed",
        json!({"order_id": format!("o-{i}"), "customer_id": "c1", "total_cents": i}),
    );
    match db {
        Db::Postgres(p) => {
            let mut tx = p.begin().await.expect("begin");
            enqueue(&mut tx, ev).await.expect("enqueue");
            tx.commit().await.expect("commit");
        }
        Db::Sqlite(p) => {
            let mut tx = p.begin().await.expect("begin");
            enqueue(&mut tx, ev).await.expect("enqueue");
            tx.commit().await.expect("commit");
        }
    }
}

/// Rows of two text columns.
pub(crate) async fn pairs(db: &Db, sql: &str) -> Vec<(String, Option<String>)> {
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
