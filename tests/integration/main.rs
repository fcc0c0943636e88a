//! The one integration-test binary (each extra binary would link the whole
//! dependency tree again). Every test gets a fresh database.

mod support;

mod backoff;
mod config;
mod embedded;
mod idempotency;
mod matrix;
mod ordering;
mod plugins;
mod process;
mod seed;
mod timing;
