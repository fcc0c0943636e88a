//! outboxd: a transactional outbox, relay and inbox host.
//!
//! # Layout
//!
//! - [`event`]: what producers write and what the relay claims.
//! - [`store`]: the outbox and inbox tables behind one trait, on Postgres or
//!   SQLite, with the write API [`store::enqueue`] and the migrations.
//! - [`relay`]: claims due events, publishes them, marks them; one
//!   [`relay::Relay::step`] plus a thin loop.
//! - [`broker`]: the [`broker::Publisher`] and [`broker::MessageSource`]
//!   traits, the embedded SQL transport and Kafka.
//! - [`consumer`]: the inbox, which makes a redelivered message a no-op, and
//!   the consumer loop.
//! - [`plugin`]: the Wasm plugin host (transformers in the relay), the only
//!   module that touches wasmtime.
//! - [`daemon`]: `outboxd run` as a library ([`daemon::Daemon`]), with the
//!   native handlers a binary registers by name; [`config`] and [`cli`]
//!   around it.
//! - [`ops`], [`admin`], [`metrics`]: retention, dead events and
//!   reconciliation; the admin API and dashboard; Prometheus metrics.
//! - [`telemetry`]: OpenTelemetry traces of each event, producer to inbox
//!   commit, off unless an OTLP endpoint is set.
//! - [`fault`], [`clock`]: seams that let tests crash and time-travel it.
//!
//! [`config`], [`event`], [`message`] (the message and header rules),
//! [`backoff`], [`route`], [`db_url`], [`sql_values`] and plugin SQL admission
//! (`outboxd_core::sql_gate`) come from `outboxd-core`, which links neither
//! wasmtime nor rdkafka. This file is the crate's one façade: it re-exports
//! them at the root, and no other module re-exports another's items, so each
//! item has one path (`crate_layout.rs` checks it); [`settings`] turns the
//! configuration into the host components' settings.

pub mod admin;
pub mod broker;
pub mod cli;
pub mod clock;
pub mod consumer;
pub mod daemon;
pub mod fault;
pub mod metrics;
pub mod ops;
pub mod plugin;
pub mod relay;
pub mod settings;
pub mod store;
pub mod telemetry;

// The façade: the modules and items of `outboxd-core` that the host's API
// hands out, at the crate root, so one path names each item outside it.
pub use outboxd_core::{backoff, config, db_url, event, message, route, sql_values};

pub use event::{Enqueued, EventId, NewEvent, OutboxEvent};
pub use store::{EnqueueError, enqueue};
