//! The only place `bindgen!` runs: Rust types and glue for the WIT package
//! in `wit/`. Everything else in the host goes through these modules; this
//! one imports nothing of the host, so every other plugin module may build
//! on it.

/// The event a transformer receives and the message it returns, under the
/// names the rest of the host uses.
pub use transformer::outbox::plugin::types::{
    Event as GuestEvent, OutgoingMessage as GuestMessage,
};

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
/// host (they run SQL); the guest still sees blocking calls. The
/// `transaction` resource is bindgen's own empty type: the host keeps what
/// a lent transaction needs in the consumer's Store, not in the handle.
pub mod consumer {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "consumer",
        exports: { default: async },
        imports: { "outbox:plugin/transaction": async | trappable },
        with: {
            "outbox:plugin/types": crate::plugin::bindings::transformer::outbox::plugin::types,
            "outbox:plugin/config": crate::plugin::bindings::transformer::outbox::plugin::config,
        },
    });
}
