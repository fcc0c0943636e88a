//! The outbox: producers' writes (`enqueue.rs`, `fingerprint.rs`), the claim
//! stores the relay takes batches from (`pg_claim.rs`, `sqlite_claim.rs`,
//! and `AnyStore` over either in `any.rs`),
//! dead events, retention, reconciliation, the WAL relay's publication
//! and slot (`wal.rs`, `wal_status.rs`), and the outbox gauges of
//! `/metrics` (`metrics.rs`).

pub mod any;
pub mod dead;
pub(in crate::store) mod enqueue;
pub(in crate::store) mod fingerprint;
pub mod metrics;
pub mod pg_claim;
pub mod reconcile;
pub mod retention;
pub mod route_pauses;
pub mod sqlite_claim;
pub mod wal;
pub mod wal_status;
