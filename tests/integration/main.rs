//! The one integration-test binary (each extra binary would link the whole
//! dependency tree again). Every test gets a fresh database.

mod support;

mod admin;
mod admin_metrics;
mod advisory_locks;

mod backoff;
mod batches;
mod config;
mod consumer_partitions;
mod consumer_plugin_policy;
mod consumer_plugins;
mod consumer_swap;
mod consumer_swap_checks;
mod consumer_swap_in_flight;
mod consumer_swap_load;
mod dead_letters;
mod doors;
mod doors_kafka;
mod doors_pg_full;
mod embedded;
mod host_schema;
mod hostile;
mod hostile_consumers;
mod hostile_sql_corpus;
mod hot_swap;
mod hot_swap_refusals;
mod hot_swap_spread;
mod idempotency;
mod kafka;
mod kafka_assigned;
mod kafka_auth;
mod kafka_consumers;
mod kafka_failures;
mod kafka_relay;
mod matrix;
mod ops;
mod ordering;
mod plugin_chains;
mod plugin_limits;
mod plugin_sql_walls;
mod plugins;
mod process;
mod process_consumers;
mod relay_failure_reasons;
mod secrets;
mod seed;
mod sqlite_leases;
mod sqlite_wake;
mod swap_processes;
mod timing;
