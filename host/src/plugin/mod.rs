//! The Wasm plugin host: runs transformer and consumer components in a
//! sandbox.
//!
//! # Layout
//!
//! - [`bindings`]: the only `bindgen!` in outboxd, over `wit/`.
//! - [`runtime`]: the engine, the component cache, and one transformer or
//!   consumer version called in a reused, sandboxed Store.
//! - [`host`]: what a plugin's Store holds, one module per host capability
//!   (the sandbox's WASI and guest output, `config`, `http`, `transaction`),
//!   and one Store type and Linker per world.
//! - [`lifecycle`]: versions in the registry, deploy checks, shadow, and the
//!   rollout that swaps the chains and consumer slots the data path reads.
//! - [`harness`]: `outboxd plugin test`, a plugin run against sample input.
//! - [`sql_values`]: SQL values between the WIT types and outboxd's;
//!   [`limits`]: a Store's memory cap. Both runtime and host use them.
//! - [`metrics`], [`error`], [`validate`].

pub mod bindings;
pub mod error;
pub mod harness;
pub mod host;
pub mod lifecycle;
pub mod limits;
pub mod metrics;
pub mod runtime;
pub mod sql_values;
pub mod validate;

pub use bindings::{GuestEvent, GuestMessage};
pub use error::{ErrorKind, PluginError};
pub use host::http::{HttpRecord, HttpStub, OutboundPolicy, StubResponse, Transport};
pub use lifecycle::chains::{ChainTable, Chains, PinError, RouteChain, Shadow, build_chains};
pub use lifecycle::registry::{Deployed, Registry, RegistryError};
pub use lifecycle::rollout::{Refreshed, Rollout};
pub use lifecycle::slot::{ActiveConsumer, ConsumerVersions};
pub use lifecycle::versions::{RegistryVersions, VersionLabel};
pub use metrics::{MetricsSnapshot, PluginMetrics};
pub use runtime::chain::{Chain, ChainError, TopicPolicy};
pub use runtime::consumer::{ConsumerPlugin, Traced};
pub use runtime::engine::{EngineConfig, PluginEngine};
pub use runtime::transformer::TransformerPlugin;
