//! Running one plugin version: the engine, the compiled-component cache,
//! and a prepared transformer or consumer called in a reused, sandboxed
//! Store.
//!
//! - [`engine`]: the shared `Engine`, a `Linker` per world, the epoch ticker.
//! - [`cache`]: compiled components on disk, keyed by sha256.
//! - [`loaded`]: what both worlds share: the prepared instance, the Store
//!   kept between calls, fuel and epoch deadlines.
//! - [`transformer`]: one transformer version, called per event;
//!   [`chain`]: runs a route's chain of transformers over one event.
//! - [`consumer`]: one consumer version, called per message with a borrowed
//!   transaction whose SQL values are converted by `plugin::sql_values`.

pub mod cache;
pub mod chain;
pub mod consumer;
pub mod engine;
pub(crate) mod loaded;
pub mod transformer;
