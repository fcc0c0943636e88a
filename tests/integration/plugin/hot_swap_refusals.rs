//! Deploys the registry refuses (hand-built components with the wrong
//! imports or exports, broken or hostile code), while the active version
//! keeps running.

use super::hot_swap::{deploy, json_of, put, registry_spec, relay, rollout, routes, wasm};
use crate::on_both;
use crate::plugins::engine;
use crate::support::{ScriptedPublisher, TestDb};
use outboxd::plugin::registry::{Registry, RegistryError};
use outboxd::relay::StepOutcome;
use serde_json::json;

// ---- hand-built hostile components --------------------------------------

/// A component that imports instance `import` (one function `get: func()`)
/// and exports a lifted no-op `func()` as `export`: enough for the checks,
/// which refuse it before anything runs.
pub(crate) fn hand_built_component(import: &str, export: &str) -> Vec<u8> {
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
        outboxd::plugin::rollout::Refreshed::Unchanged
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
