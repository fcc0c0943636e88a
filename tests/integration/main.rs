//! The one integration-test binary (each extra binary would link the whole
//! dependency tree again). Every test gets a fresh database.

mod support;

mod admin;

mod backoff;
mod batches;
mod config;
mod consumer_plugins;
mod consumer_swap;
mod consumer_swap_checks;
mod dead_letters;
mod doors;
mod doors_kafka;
mod embedded;
mod hostile;
mod hostile_consumers;
mod hot_swap;
mod idempotency;
mod kafka;
mod kafka_assigned;
mod kafka_auth;
mod matrix;
mod ops;
mod ordering;
mod plugins;
mod process;
mod secrets;
mod seed;
mod swap_processes;
mod timing;
