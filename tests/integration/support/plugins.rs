//! The Wasm plugins the tests load: the components of plugins/dist (built
//! by `bash plugins/build.sh`, which tests/run.sh runs; a missing one fails
//! the test with that instruction), the one engine, specs and sample
//! events, consumer plugin handlers and their orders, registry specs,
//! hand-built hostile components, and the tables the hostile SQL reads.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use outboxd::config::{HttpLimits, PluginSource, PluginSpec, TxnPolicy};
use outboxd::consumer::PluginHandler;
use outboxd::message::{Delivery, headers};
use outboxd::plugin::bindings::transformer::outbox::plugin::types::Message;
use outboxd::plugin::lifecycle::chains::build_chains;
use outboxd::plugin::{ConsumerPlugin, EngineConfig, GuestEvent, PluginEngine, TransformerPlugin};
use outboxd::plugin::{Traced, Transport};
use outboxd::relay::{Relay, RelayConfig};
use outboxd::route::{Route, Router};
use outboxd::store::AnyStore;
use outboxd::store::InboxTx;
use outboxd_demo::billing;
use serde_json::Value;

use super::db::TestDb;
use super::publisher::ScriptedPublisher;

pub fn plugin_path(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins/dist")
        .join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: build the plugins with `bash plugins/build.sh` (tests/run.sh does it)",
        path.display()
    );
    path
}

/// One engine for the whole test binary, with an artifact cache so the
/// Python component compiles once.
pub fn engine() -> &'static PluginEngine {
    static ENGINE: OnceLock<PluginEngine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        PluginEngine::new(EngineConfig {
            cache_dir: Some(
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/plugin-cache"),
            ),
            pooling: false,
        })
        .expect("plugin engine")
    })
}

pub fn spec(name: &str) -> PluginSpec {
    let mut s = PluginSpec::new(name, plugin_path(name));
    s.version = Some("test-1".into());
    s
}

/// A spec whose deadline is generous, for tests about another limit (page
/// faults of a fresh 64 MiB memory take tens of ms on a busy machine).
pub fn roomy(name: &str) -> PluginSpec {
    let mut s = spec(name);
    s.limits.timeout = std::time::Duration::from_millis(5_000);
    s
}

pub fn load(spec: &PluginSpec) -> TransformerPlugin {
    TransformerPlugin::load(engine(), spec).expect("load plugin")
}

pub fn event(payload: Value) -> GuestEvent {
    GuestEvent {
        id: "6f1c1d2e-8a3b-4c5d-9e6f-0a1b2c3d4e5f".into(),
        aggregate_id: "order-7".into(),
        event_type: "order.confirmed".into(),
        payload: serde_json::to_vec(&payload).expect("json"),
        headers: vec![(
            "traceparent".into(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
        )],
        created_at: "2026-11-29T12:00:00+00:00".into(),
        key: b"order-7".to_vec(),
        attempt: 0,
    }
}

pub fn json_of(payload: &[u8]) -> Value {
    serde_json::from_slice(payload).expect("payload is JSON")
}

/// The grants of the test plugins' tables (`invoices`, `ledger`): what
/// their consumers' `tables` say.
pub fn plugin_tables() -> outboxd::config::TableGrants {
    outboxd::config::TableGrants {
        read: vec![],
        write: vec!["invoices".into(), "ledger".into()],
    }
}

/// The default policy of a test plugin's consumer: its tables granted.
pub fn plugin_policy() -> outboxd::config::TxnPolicy {
    outboxd::config::TxnPolicy {
        consumer: "test".into(),
        tables: plugin_tables(),
        ..outboxd::config::TxnPolicy::default()
    }
}

pub fn handler(name: &str, config: &[(&str, &str)], policy: TxnPolicy) -> PluginHandler {
    let mut spec = PluginSpec::new(name, plugin_path(name));
    spec.version = Some("test-1".into());
    // Database round trips count against the deadline; a busy CI machine
    // needs room.
    spec.limits.timeout = std::time::Duration::from_millis(2_000);
    for (k, v) in config {
        spec.config.insert((*k).into(), (*v).into());
    }
    let plugin = ConsumerPlugin::load(engine(), &spec).expect("load consumer plugin");
    PluginHandler::new(Arc::new(plugin), policy)
}

pub fn billing_plugin() -> PluginHandler {
    handler("billing", &[], plugin_policy())
}

pub fn order(offset: i64, order_id: &str) -> Delivery {
    Delivery {
        attempt: 0,
        topic: "order.confirmed".into(),
        partition: 0,
        offset,
        key: Some(order_id.as_bytes().to_vec()),
        payload: format!(r#"{{"order_id":"{order_id}","customer_id":"c1","total_cents":500}}"#)
            .into_bytes(),
        headers: vec![(
            headers::MESSAGE_ID.into(),
            uuid::Uuid::new_v4().to_string().into_bytes(),
        )],
    }
}

pub async fn counts(t: &TestDb) -> (i64, i64, i64) {
    (
        t.count("SELECT count(*) FROM invoices").await,
        t.count("SELECT count(*) FROM inbox").await,
        t.count("SELECT count(*) FROM outbox").await,
    )
}

/// Runs `message` (its id set here) through the consumer plugin `plugin` as
/// the consumer `consumer` would: the inbox mark first (so on SQLite the
/// transaction holds the write lock while the plugin runs), then `handle`,
/// then commit, or roll back when the plugin failed. Returns the message
/// id and what the plugin did.
pub async fn handle_once(
    t: &TestDb,
    plugin: &ConsumerPlugin,
    consumer: &str,
    mut message: Message,
    policy: &TxnPolicy,
    transport: Transport,
) -> (String, Traced) {
    let id = uuid::Uuid::new_v4();
    message.id = id.to_string();
    let mut tx = InboxTx::begin(&t.db).await.expect("begin");
    assert!(tx.mark(consumer, id, None).await.expect("mark"));
    let traced = plugin
        .handle_traced(&mut tx, &message, policy, Some(&t.db), transport)
        .await;
    if traced.result.is_ok() {
        tx.commit().await.expect("commit");
    } else {
        tx.rollback().await.expect("rollback");
    }
    (id.to_string(), traced)
}

/// A relay on `t` to `broker` whose `routes` run the transformer chains
/// of `plugins`.
pub fn chained_relay(
    t: &TestDb,
    broker: Arc<ScriptedPublisher>,
    plugins: &[PluginSpec],
    routes: Vec<Route>,
    config: RelayConfig,
) -> Relay<AnyStore, Arc<ScriptedPublisher>> {
    let chains = build_chains(engine(), plugins, &routes).expect("chains");
    Relay::new(
        t.store(),
        broker,
        Router::new(routes),
        config,
        Arc::new(outboxd::clock::SystemClock),
    )
    .with_chains(chains)
}

// ---- the plugin registry ------------------------------------------------

/// The registry plugin `name`, with a roomy deadline: the tests that use
/// it are about versions, not limits, and run under load.
pub fn registry_spec(name: &str) -> PluginSpec {
    let mut s = PluginSpec::new(name, "");
    s.source = PluginSource::Registry;
    s.limits.timeout = std::time::Duration::from_millis(5_000);
    s
}

/// The bytes of the example component `name` (plugins/dist).
pub fn wasm(name: &str) -> Vec<u8> {
    std::fs::read(plugin_path(name)).expect("read component")
}

// ---- hand-built hostile components --------------------------------------

/// A component that imports instance `import` (one function `get: func()`)
/// and exports a lifted no-op `func()` as `export`: enough for the checks,
/// which refuse it before anything runs.
pub fn hand_built_component(import: &str, export: &str) -> Vec<u8> {
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
pub fn with_custom_section(mut wasm: Vec<u8>, tag: &str) -> Vec<u8> {
    let body: Vec<u8> = [&[tag.len() as u8][..], tag.as_bytes()].concat();
    assert!(body.len() < 128, "one-byte LEB sizes only");
    wasm.push(0);
    wasm.push(body.len() as u8);
    wasm.extend(body);
    wasm
}

pub fn http_spec(hosts: &[String], http: HttpLimits) -> PluginSpec {
    let mut spec = PluginSpec::new(
        "hostile-consumer-http",
        plugin_path("hostile-consumer-http"),
    );
    spec.version = Some("test-1".into());
    spec.limits.timeout = std::time::Duration::from_secs(20);
    spec.allowed_outbound_hosts = hosts.to_vec();
    spec.http = http;
    spec
}

// ---- hostile SQL ---------------------------------------------------------

/// A literal of `bytes` doubled `levels` times through nested subqueries:
/// no function and no recursion, but the planners inline each level, so
/// the gate refuses it as a planner bomb (its expansion bound weighs the
/// literal's copies too).
pub fn doubling_bomb(levels: usize, bytes: usize) -> String {
    let mut sql = format!("SELECT '{}' AS c0", "x".repeat(bytes));
    for i in 1..=levels {
        sql = format!("SELECT c{p} || c{p} AS c{i} FROM ({sql}) t{i}", p = i - 1);
    }
    sql
}

pub async fn seed_tables(t: &TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    t.exec_app("CREATE TABLE customers (id text PRIMARY KEY, name text NOT NULL)")
        .await;
    t.exec_app("CREATE TABLE secrets (id integer PRIMARY KEY, secret text NOT NULL)")
        .await;
    t.exec("INSERT INTO secrets (id, secret) VALUES (1, 'the crown jewels')")
        .await;
    // One 100 MB value, granted to the plugin: a statement that passes the
    // gate can still build 300 MB from it (`b || b || b`).
    t.exec_app("CREATE TABLE blobs (id integer PRIMARY KEY, b text NOT NULL)")
        .await;
    if t.is_postgres() {
        t.exec("INSERT INTO blobs (id, b) SELECT 1, repeat('x', 100000000)")
            .await;
    } else {
        t.exec("INSERT INTO blobs (id, b) VALUES (1, zeroblob(100000000))")
            .await;
    }
    for i in 0..60 {
        t.exec(&format!(
            "INSERT INTO customers (id, name) VALUES ('c{i}', 'customer {i}')"
        ))
        .await;
    }
}
