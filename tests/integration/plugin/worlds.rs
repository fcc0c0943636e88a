//! Each world links only its own imports: a transformer's Linker has no
//! `outbox:plugin/transaction`, a consumer's has, and the guest SDK builds
//! transformers that do not import it.

use outboxd::plugin::validate::{self, Verdict};
use outboxd::plugin::{ConsumerPlugin, PluginError, TransformerPlugin};

use crate::support::plugins::{engine, hand_built_component, plugin_path, spec};

const TRANSACTION: &str = "outbox:plugin/transaction@0.1.0";

/// A real consumer component imports `transaction` with its true types, so
/// only a missing definition can stop the transformer's Linker from
/// linking it: were `transaction` linked there, the load would fail later,
/// on the missing `transform` export, with another message.
#[test]
fn the_transformer_linker_refuses_a_component_that_imports_transaction() {
    let err = TransformerPlugin::load(engine(), &spec("ledger")).expect_err("not linked");
    let PluginError::Invalid(message) = &err else {
        panic!("expected a refused link, got {err:?}");
    };
    assert!(
        message.contains("plugin `ledger`")
            && message.contains("imports something outboxd does not provide")
            && message.contains(TRANSACTION)
            && message.contains("outbox:plugin/transaction is for consumers"),
        "{message}"
    );
}

#[test]
fn the_consumer_linker_links_transaction() {
    let plugin = ConsumerPlugin::load(engine(), &spec("ledger")).expect("a consumer links");
    assert_eq!(plugin.name(), "ledger");
}

/// The guest SDK keeps the consumer world's bindings out of transformers:
/// no transformer it builds (nor the Python and JavaScript ones) imports
/// `transaction`, and each validates.
#[test]
fn no_transformer_in_dist_imports_transaction() {
    for name in [
        "cloudevents",
        "redact-pii",
        "route-by-amount",
        "hostile-spin",
        "hostile-memory-bomb",
        "hostile-panic",
        "hostile-huge-output",
        "hostile-escape",
        "hostile-misbehave",
        "amount-cents",
        "amount-cents-v2",
        "python-tag",
        "js-tag",
    ] {
        let wasm = std::fs::read(plugin_path(name)).expect("read");
        let v = validate::validate(engine(), &wasm).expect("validates");
        assert_eq!(v.world, Some("transformer"), "{name}");
        let imported: Vec<&str> = v.imports.iter().map(|(i, _)| i.as_str()).collect();
        assert!(
            !imported.iter().any(|i| i.contains("transaction")),
            "{name} imports {imported:?}"
        );
        assert!(v.is_ok(), "{name}: {:?}", v.problems);
    }
}

#[test]
fn validate_refuses_a_transformer_that_imports_transaction_and_says_why() {
    let wasm = hand_built_component(TRANSACTION, "transform");
    let v = validate::validate(engine(), &wasm).expect("a component");
    assert_eq!(v.world, Some("transformer"));
    assert!(
        v.imports
            .iter()
            .any(|(i, verdict)| i == TRANSACTION && *verdict == Verdict::Missing),
        "{:?}",
        v.imports
    );
    assert!(
        v.problems
            .iter()
            .any(|p| p.contains(TRANSACTION) && p.contains("for consumers only")),
        "{:?}",
        v.problems
    );
}

#[test]
fn validate_accepts_transaction_in_a_consumer() {
    let wasm = std::fs::read(plugin_path("ledger")).expect("read");
    let v = validate::validate(engine(), &wasm).expect("validates");
    assert_eq!(v.world, Some("consumer"));
    assert!(
        v.imports
            .iter()
            .any(|(i, verdict)| i == TRANSACTION && *verdict == Verdict::Allowed),
        "{:?}",
        v.imports
    );
    assert!(v.is_ok(), "{:?}", v.problems);
}
