//! The receiving half: each message is handled inside a database
//! transaction that also records its message id in the inbox, so a
//! redelivered message has no second effect.
//!
//! [`inbox::process`] is one message; [`runner::Consumer`] is the loop that
//! fetches from a [`MessageSource`](crate::broker::MessageSource), handles
//! partitions in parallel, and commits offsets only after the effect commits.

pub mod batch;
pub mod configured;
pub mod dead_letter;
pub mod inbox;
pub mod metrics;
pub mod plugin_handler;
pub mod runner;
pub use configured::{ConsumerHandler, NativeHandler, NativeHandlers};
pub use inbox::{Attempt, Handler, HandlerError, Pinned, Processed, attempt, process};
pub use plugin_handler::{DryRun, PluginHandler};
pub use runner::{Consumer, ConsumerConfig, ConsumerStats, ConsumerStep};
