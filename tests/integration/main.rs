//! The one integration-test binary (each extra binary would link the whole
//! dependency tree again). Every test gets a fresh database.
//!
//! One folder per subsystem; what the tests share is in `support/`, and no
//! test module imports another.

mod support;

mod architecture;
mod config;
mod consumer;
mod kafka;
mod nats;
mod ops;
mod plugin;
mod process;
mod rabbitmq;
mod redis;
mod relay;
mod wal;
mod webhook;
