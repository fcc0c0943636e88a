//! The Wasm plugin host: runs transformer and consumer components in a
//! sandbox.
//!
//! # Layout
//!
//! - [`bindings`]: the only `bindgen!` in outboxd, over `wit/`.
//! - [`engine`]: the shared `Engine`, a `Linker` per world, the epoch ticker.
//! - [`transformer`]: one plugin version, prepared once (`Component` plus
//!   `InstancePre`), called per event in a reused, sandboxed Store.
//! - [`chain`]: runs a route's chain of transformers over one event.
//! - [`consumer`]: one consumer plugin version, called per message with a
//!   borrowed [`host::transaction`] whose SQL values are converted by
//!   [`sql_values`].
//! - [`host`]: what a plugin's Store holds, one module per host capability
//!   (the sandbox's WASI and guest output, `config`, `transaction`), and
//!   one Store type and Linker per world; [`limits`]: the memory cap.
//! - [`cache`]: compiled components on disk, keyed by sha256.
//! - [`dev_dir`]: a directory whose files are deployed and activated (dev).
//! - [`registry`]: plugin versions stored in the database (deploy, activate,
//!   rollback, retire, shadow), shared by every host on that database.
//! - [`chains`]: the chain each route runs (and its shadow), the table a
//!   rollout swaps whole; [`slot`]: the same for one consumer plugin.
//! - [`rollout`]: keeps the chains and the slots on the registry's versions;
//!   [`versions`]: the registry versions a host has loaded, live or pinned
//!   for a redrive (fix-forward).
//! - [`shadow`]: compares a candidate's outputs with the active version's.
//! - [`metrics`], [`error`], [`validate`].

pub mod bindings;
pub mod cache;
pub mod chain;
pub mod chains;
pub mod consumer;
mod deploy_check;
pub mod dev_dir;
pub mod engine;
pub mod error;
pub mod harness;
pub mod host;
pub mod limits;
mod loaded;
pub mod metrics;
pub mod registry;
pub mod rollout;
pub mod shadow;
pub mod slot;
pub mod sql_values;
pub mod transformer;
pub mod validate;
pub mod versions;

pub use bindings::{GuestEvent, GuestMessage};
pub use chain::{Chain, ChainError, TopicPolicy};
pub use chains::{ChainTable, Chains, PinError, RouteChain, Shadow, build_chains};
pub use consumer::{ConsumerPlugin, Traced};
pub use engine::{EngineConfig, PluginEngine};
pub use error::{ErrorKind, PluginError};
pub use host::http::{HttpRecord, HttpStub, OutboundPolicy, StubResponse, Transport};
pub use metrics::{MetricsSnapshot, PluginMetrics};
pub use registry::{Deployed, Registry, RegistryError};
pub use rollout::{Refreshed, Rollout};
pub use slot::{ActiveConsumer, ConsumerVersions};
pub use transformer::TransformerPlugin;
pub use versions::{RegistryVersions, VersionLabel};
