//! The relay and the outbox it reads: what a producer commits is published
//! once and in order per aggregate, through leases, backoff, batches,
//! idempotent producers and the embedded transport.

mod advisory_locks;
mod backoff;
mod batches;
mod claim_plan;
mod embedded;
mod failure_reasons;
mod idempotency;
mod ordering;
mod outbox_basics;
mod sqlite_leases;
mod sqlite_wake;
mod timing;
