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
//! [`config`], [`event`], plugin SQL admission (`outboxd_core::sql_gate`), the message and header
//! rules (`broker::headers`, `relay::message_for_event`) and the plugin SQL
//! values come from `outboxd-core`, which links neither wasmtime nor
//! rdkafka; the host re-exports them where its modules expect them.

pub mod admin;
pub mod broker;
pub mod cli;
pub mod clock;
pub mod config;
pub mod consumer;
pub mod daemon;
pub mod fault;
pub mod metrics;
pub mod ops;
pub mod plugin;
pub mod relay;
pub mod store;
pub mod telemetry;

pub use outboxd_core::event;

pub use event::{Enqueued, EventId, NewEvent, OutboxEvent};
pub use store::{EnqueueError, enqueue};
