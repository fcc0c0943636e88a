//! The outboxd guest SDK: write a transformer or a consumer plugin as one
//! function. Consumers: see [`Consumer`] and [`export_consumer!`].
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

mod consumer;
mod error;
mod event;

pub mod config;

pub use consumer::{Consumer, DbError, Delivery, NewEvent, Rows, Transaction, Value};
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

    pub mod consumer {
        wit_bindgen::generate!({
            world: "consumer",
            path: "../wit",
            pub_export_macro: true,
            export_macro_name: "__export_consumer_world",
            default_bindings_module: "outboxd_guest::wit::consumer",
            with: {
                "outbox:plugin/types@0.1.0": crate::wit::transformer::outbox::plugin::types,
                "outbox:plugin/config@0.1.0": crate::wit::transformer::outbox::plugin::config,
            },
        });
    }
}

#[doc(hidden)]
pub mod __private {
    pub use crate::consumer::run_consumer;

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

/// Exports a [`Consumer`] as the component's `handle` function.
#[macro_export]
macro_rules! export_consumer {
    ($ty:ty) => {
        #[doc(hidden)]
        struct __OutboxdConsumerExport;

        impl $crate::wit::consumer::Guest for __OutboxdConsumerExport {
            fn handle(
                tx: &$crate::wit::consumer::outbox::plugin::transaction::Transaction,
                message: $crate::wit::transformer::outbox::plugin::types::Message,
            ) -> ::core::result::Result<(), $crate::wit::transformer::outbox::plugin::types::PluginError>
            {
                $crate::__private::run_consumer::<$ty>(tx, message)
            }
        }

        $crate::wit::consumer::__export_consumer_world!(
            __OutboxdConsumerExport with_types_in $crate::wit::consumer
        );
    };
}
