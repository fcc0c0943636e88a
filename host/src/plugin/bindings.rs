//! The only place `bindgen!` runs: Rust types and glue for the WIT package
//! in `wit/`. Everything else in the host goes through these modules.

/// The `transformer` world. Exports are async because the engine runs with
/// async support (WASI's streams are async in the host).
pub mod transformer {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "transformer",
        exports: { default: async },
    });
}

/// The `consumer` world. The transaction calls are async on the
/// host (they run SQL); the guest still sees blocking calls.
pub mod consumer {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "consumer",
        exports: { default: async },
        imports: { "outbox:plugin/transaction": async | trappable },
        with: {
            "outbox:plugin/types": super::transformer::outbox::plugin::types,
            "outbox:plugin/config": super::transformer::outbox::plugin::config,
            "outbox:plugin/transaction.transaction": crate::plugin::transaction::ActiveTransaction,
        },
    });
}
