//! outboxd-core: the parts of outboxd that are plain code over plain data,
//! with no Wasm engine and no Kafka client, so the fuzz workspace can build
//! them alone. The `outboxd` host re-exports each module where its own code
//! expects it (`outboxd::config`, …).
//!
//! # Layout
//!
//! - [`config`]: the typed configuration: TOML, then `OUTBOXD__`
//!   environment overrides, then validation whose errors name the key.
//! - [`event`]: what producers write and what the relay claims, and the
//!   stored header object of an outbox row.
//! - [`route`]: which topic an event type goes to, through which plugins.
//! - [`backoff`]: the delay after a failed publish.
//! - [`message`]: the broker message an event or a plugin output becomes,
//!   the headers only the host sets, and the message id a consumer
//!   deduplicates on.
//! - [`embedded_headers`]: headers as the embedded transport stores them.
//! - [`sql_gate`]: admission of plugin SQL, one [`sql_gate::admit`] call:
//!   the lexical rules, then a parsed statement checked against the tables
//!   and functions a consumer plugin may use.
//! - [`sql_values`]: plugin SQL values bound as parameters and read back
//!   from rows, for Postgres and SQLite.
//! - [`db_url`]: which database a URL names, and the URL with its password
//!   masked.

pub mod backoff;
pub mod config;
pub mod db_url;
pub mod embedded_headers;
pub mod event;
pub mod message;
pub mod route;
pub mod sql_gate;
pub mod sql_values;
