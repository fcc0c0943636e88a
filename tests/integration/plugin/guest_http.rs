//! The guest SDK's HTTP helper (`outboxd_guest_consumer::http`) is linked
//! only into a plugin that calls it: `charge` imports
//! `wasi:http/outgoing-handler`, the consumers built with the same SDK that
//! never call it import no `wasi:http` interface at all (so they need no
//! `allowed_outbound_hosts`).

use outboxd::plugin::validate;

use crate::support::plugins::{engine, plugin_path};

const OUTGOING_HANDLER: &str = "wasi:http/outgoing-handler@0.2.12";

fn imports(name: &str) -> Vec<String> {
    let wasm = std::fs::read(plugin_path(name)).expect("read the plugin");
    let v = validate::validate(engine(), &wasm).expect("a component");
    v.imports.into_iter().map(|(i, _)| i).collect()
}

#[test]
fn only_the_consumer_that_calls_http_imports_wasi_http() {
    let charge = imports("charge");
    assert!(
        charge.iter().any(|i| i == OUTGOING_HANDLER),
        "charge calls http::post, so it imports {OUTGOING_HANDLER}: {charge:?}"
    );
    assert!(
        charge
            .iter()
            .any(|i| i.starts_with("outbox:plugin/transaction@")),
        "{charge:?}"
    );
    for name in ["billing", "invoicing", "ledger", "hostile-consumer-sql"] {
        let imported = imports(name);
        assert!(
            !imported.iter().any(|i| i.starts_with("wasi:http/")),
            "{name} never calls http, yet imports {imported:?}"
        );
        assert!(
            imported
                .iter()
                .any(|i| i.starts_with("outbox:plugin/transaction@")),
            "{name} is a consumer: {imported:?}"
        );
    }
}
