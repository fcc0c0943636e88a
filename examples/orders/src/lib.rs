//! The example service that shows outboxd at work, kept out of the product.
//!
//! # Layout
//!
//! - [`orders`]: the producer. `confirm_order` writes the business change
//!   and its `order.confirmed` event in one local transaction.
//! - [`billing`]: the consumer. [`billing::BillingHandler`] writes one
//!   invoice per confirmed order, through the inbox; a binary registers it
//!   as `builtin:billing` with `Daemon::builder().handler("billing", …)`.
//! - [`latency`]: commit-to-effect latency samples, recorded around the
//!   consumers through the daemon's `on_handled` hook.
//! - [`demo`]: the whole pipeline on a fresh SQLite file, with the
//!   `cloudevents` transformer and the `billing` consumer plugin, both
//!   compiled into this crate at build time (`build.rs`).

pub mod billing;
pub mod demo;
pub mod latency;
pub mod orders;

/// The `outboxd` daemon with the example's native handler registered as
/// `builtin:billing`.
pub fn daemon() -> outboxd::daemon::DaemonBuilder {
    outboxd::daemon::Daemon::builder().handler("billing", billing::BillingHandler)
}
