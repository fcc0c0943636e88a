//! The outboxd guest SDK: write a transformer plugin as one function.
//! Consumers use `outboxd-guest-consumer` (in `consumer/`), which builds on
//! this crate: the consumer world's bindings live there, so a transformer,
//! which does not depend on it, never imports `outbox:plugin/transaction`.
//!
//! ```ignore
//! use outboxd_guest::{Event, Message, Result, Transformer};
//!
//! struct Upper;
//!
//! impl Transformer for Upper {
//!     fn transform(event: Event) -> Result<Vec<Message>> {
//!         let text = event.payload_str()?.to_uppercase();
//!         Ok(vec![event.forward().with_payload(text)])
//!     }
//! }
//!
//! outboxd_guest::export_transformer!(Upper);
//! ```
//!
//! Build with `cargo build --release --target wasm32-wasip2` and a
//! `crate-type = ["cdylib"]` library: the result is a component for the
//! `outbox:plugin/transformer@0.1.0` world. The generated bindings live in
//! the hidden [`wit`] module; plugins use the types below instead.

mod delivery;
mod error;
mod event;

pub mod config;

pub use delivery::Delivery;
pub use error::{Error, Result};
pub use event::{Event, Message};

/// A transformer: one event in, zero or more messages out.
///
/// Return an empty list to filter the event (the host records it as
/// filtered), several messages to split it, and a different key to re-key it.
pub trait Transformer {
    fn transform(event: Event) -> Result<Vec<Message>>;
}

/// The generated bindings. Not a stable API: use the crate's own types.
#[doc(hidden)]
#[allow(unsafe_code)] // The generated ABI glue needs it.
pub mod wit {
    pub mod transformer {
        wit_bindgen::generate!({
            world: "transformer",
            path: "../wit",
            pub_export_macro: true,
            export_macro_name: "__export_transformer_world",
            default_bindings_module: "outboxd_guest::wit::transformer",
        });
    }
}

#[doc(hidden)]
pub mod __private {
    use crate::wit::transformer::outbox::plugin::types as wit;

    /// The adapter the export macro calls: converts, runs, converts back.
    pub fn run<T: crate::Transformer>(
        event: wit::Event,
    ) -> Result<Vec<wit::OutgoingMessage>, wit::PluginError> {
        match T::transform(event.into()) {
            Ok(messages) => Ok(messages.into_iter().map(Into::into).collect()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Exports a [`Transformer`] as the component's `transform` function.
#[macro_export]
macro_rules! export_transformer {
    ($ty:ty) => {
        #[doc(hidden)]
        struct __OutboxdTransformerExport;

        impl $crate::wit::transformer::Guest for __OutboxdTransformerExport {
            fn transform(
                event: $crate::wit::transformer::outbox::plugin::types::Event,
            ) -> ::core::result::Result<
                ::std::vec::Vec<$crate::wit::transformer::outbox::plugin::types::OutgoingMessage>,
                $crate::wit::transformer::outbox::plugin::types::PluginError,
            > {
                $crate::__private::run::<$ty>(event)
            }
        }

        $crate::wit::transformer::__export_transformer_world!(
            __OutboxdTransformerExport with_types_in $crate::wit::transformer
        );
    };
}
