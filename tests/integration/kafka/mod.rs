//! The Kafka transport, on tansu (tests/tansu.sh) or a private one, and on
//! librdkafka's mock cluster: relay, consumers, groups, failures, TLS and
//! SASL, and bad input at the door.

mod assigned;
mod auth;
mod bad_input;
mod consumers;
mod failures;
mod lag;
mod liveness;
mod membership;
mod relay;
mod secure;
mod topics;
