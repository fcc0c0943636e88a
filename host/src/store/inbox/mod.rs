//! The inbox side: the consumer's transaction (`tx.rs`), its dead letters,
//! the offsets of static Kafka consumers, and plugins' outbound calls.

pub mod dead_letters;
pub mod offsets;
pub mod outbound;
pub(in crate::store) mod tx;
