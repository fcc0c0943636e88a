//! Who gets network at all: refused at config load, at plugin load, by
//! `plugin validate` and deploy, naming the key. Also the
//! `consumer-before-commit` fault point, which leaves the intent without
//! its outcome, as a crash there would.

use std::sync::Arc;

use outboxd::config::PluginSpec;
use outboxd::config::{Config, ConfigError, HttpLimits};
use outboxd::consumer::{PluginHandler, process};
use outboxd::fault::{FaultAction, FaultPoint, Faults};
use outboxd::plugin::ConsumerPlugin;
use outboxd::plugin::TransformerPlugin;
use outboxd::plugin::validate::{self, Verdict};
use serde_json::json;

use crate::support::outbound_server::Server;
use crate::support::plugins::{engine, http_spec, order, plugin_path};
use crate::support::{TestDb, on_both, plugin_policy};

fn key_error(toml: &str) -> (String, String) {
    match Config::from_toml("t.toml", toml, Vec::new()) {
        Err(ConfigError::Key { key, message }) => (key, message),
        other => panic!("expected a key error, got {other:?}"),
    }
}

const BASE: &str = "[database]\nurl = \"sqlite::memory:\"\n";

#[test]
fn bad_allow_list_entries_are_named_with_the_shape() {
    for (entry, why) in [
        ("api.example.com", "no scheme"),
        ("ftp://api.example.com", "not http or https"),
        ("https://api.example.com/charges", "path"),
        ("https://*.example.com", "wildcard"),
        ("https://api.example.com:0x50", "port"),
    ] {
        let (key, msg) = key_error(&format!(
            "{BASE}[[plugins]]\nname = \"charge\"\npath = \"c.wasm\"\nallowed_outbound_hosts = [\"https://ok.example.com\", \"{entry}\"]\n"
        ));
        assert_eq!(key, "plugins[0].allowed_outbound_hosts[1]", "{entry}");
        assert!(
            msg.contains(why) && msg.contains("https://HOST[:PORT]"),
            "{entry}: {msg}"
        );
    }
    let (key, msg) = key_error(&format!(
        "{BASE}[[plugins]]\nname = \"charge\"\npath = \"c.wasm\"\n[plugins.http]\nmax_requests_per_message = 0\n"
    ));
    assert_eq!(key, "plugins[0].http.max_requests_per_message", "{msg}");
}

#[test]
fn a_transformer_with_an_allow_list_is_refused() {
    let (key, msg) = key_error(&format!(
        "{BASE}[[routes]]\nevent_type = \"e\"\ntopic = \"t\"\ntransformers = [\"tag\"]\n\
         [[plugins]]\nname = \"tag\"\npath = \"t.wasm\"\nallowed_outbound_hosts = [\"https://api.example.com\"]\n"
    ));
    assert_eq!(key, "plugins[0].allowed_outbound_hosts");
    assert!(msg.contains("transformers never get network"), "{msg}");
}

#[test]
fn a_consumer_importing_http_needs_an_allow_list() {
    let spec = http_spec(&[], HttpLimits::default());
    let e = ConsumerPlugin::load(engine(), &spec)
        .expect_err("no allow-list")
        .to_string();
    assert!(
        e.contains("plugins[hostile-consumer-http].allowed_outbound_hosts is empty"),
        "{e}"
    );
    let wasm = std::fs::read(plugin_path("hostile-consumer-http")).expect("read");
    let v = validate::validate(engine(), &wasm).expect("a component");
    assert_eq!(v.world, Some("consumer"));
    assert!(
        v.problems
            .iter()
            .any(|p| p.contains("allowed_outbound_hosts")),
        "{:?}",
        v.problems
    );
    let hosts = ["https://api.example.com".to_string()];
    let v = validate::validate_with_hosts(engine(), &wasm, &hosts).expect("a component");
    assert!(v.is_ok(), "{:?}", v.problems);
    assert!(
        v.imports
            .iter()
            .any(|(n, verdict)| n.starts_with("wasi:http/outgoing-handler")
                && *verdict == Verdict::Allowed)
    );
    // A consumer built without HTTP does not import it and loads as before.
    let billing = std::fs::read(plugin_path("billing")).expect("read");
    let v = validate::validate(engine(), &billing).expect("a component");
    assert!(
        v.is_ok() && !v.imports.iter().any(|(n, _)| n.starts_with("wasi:http")),
        "{:?}",
        v.imports
    );
}

#[test]
fn a_transformer_importing_http_never_loads() {
    let mut spec = PluginSpec::new(
        "hostile-transformer-http",
        plugin_path("hostile-transformer-http"),
    );
    // Even with a list (which the config check refuses for transformers).
    spec.allowed_outbound_hosts = vec!["https://api.example.com".into()];
    let e = TransformerPlugin::load(engine(), &spec)
        .expect_err("no network")
        .to_string();
    assert!(e.contains("transformers never get network"), "{e}");
    let wasm = std::fs::read(plugin_path("hostile-transformer-http")).expect("read");
    let v = validate::validate_with_hosts(engine(), &wasm, &spec.allowed_outbound_hosts)
        .expect("component");
    assert_eq!(v.world, Some("transformer"));
    assert!(
        v.problems
            .iter()
            .any(|p| p.contains("transformers never get network")),
        "{:?}",
        v.problems
    );
}

/// The fault point sits after the plugin's requests and before the inbox
/// commit: the message rolls back, the intent stays, with no outcome.
async fn consumer_before_commit_leaves_the_intent_open(t: TestDb) {
    let server = Server::start(t.db.clone()).await;
    let spec = http_spec(&[server.url("")], HttpLimits::default());
    let plugin = Arc::new(ConsumerPlugin::load(engine(), &spec).expect("load"));
    let handler = PluginHandler::new(plugin, plugin_policy())
        .with_db(&t.db)
        .with_faults(Faults::arm(
            FaultPoint::ConsumerBeforeCommit,
            FaultAction::Error,
            1,
        ));
    let mut d = order(0, "o1");
    d.payload = json!({"requests": [{"method": "POST", "url": server.url("/charges")}]})
        .to_string()
        .into_bytes();
    let id = d.message_id().expect("id").to_string();
    process(&t.db, "test", &d, &handler)
        .await
        .expect_err("the fault");
    assert_eq!(server.seen().len(), 1);
    assert_eq!(t.count("SELECT count(*) FROM inbox").await, 0);
    let open = t
        .count(&format!(
            "SELECT count(*) FROM outbound_calls WHERE idempotency_key = '{id}' AND completed_at IS NULL"
        ))
        .await;
    assert_eq!(open, 1, "the intent without an outcome is the evidence");
    // Redelivered without the fault: the same key again, and this time the
    // outcome commits with the mark.
    process(&t.db, "test", &d, &handler)
        .await
        .expect("second run");
    let keys: Vec<_> = server.seen().iter().map(|s| s.keys.clone()).collect();
    assert_eq!(keys, [vec![id.clone()], vec![id.clone()]]);
    assert_eq!(t.count("SELECT count(*) FROM inbox").await, 1);
    let done = t
        .count(&format!(
            "SELECT count(*) FROM outbound_calls WHERE idempotency_key = '{id}' AND status = 200"
        ))
        .await;
    assert_eq!(done, 1);
}
on_both!(consumer_before_commit_leaves_the_intent_open);

/// Deploy checks the component against the configured spec's list.
async fn deploy_needs_the_allow_list_of_the_config(t: TestDb) {
    let reg = outboxd::plugin::Registry::new(t.db.clone());
    let wasm = std::fs::read(plugin_path("hostile-consumer-http")).expect("read");
    let mut spec = http_spec(&[], HttpLimits::default());
    spec.source = outboxd::config::PluginSource::Registry;
    spec.path = Default::default();
    match reg.deploy(engine(), &spec, &wasm, &[], "test").await {
        Err(outboxd::plugin::RegistryError::Refused { reason, .. }) => {
            assert!(reason.contains("allowed_outbound_hosts"), "{reason}")
        }
        other => panic!("not refused: {other:?}"),
    }
    spec.allowed_outbound_hosts = vec!["https://api.example.com".into()];
    reg.deploy(engine(), &spec, &wasm, &[], "test")
        .await
        .expect("deployed with a list");
}
on_both!(deploy_needs_the_allow_list_of_the_config);
