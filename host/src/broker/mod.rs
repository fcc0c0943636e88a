//! Brokers: where the relay publishes and where consumers read.
//!
//! The relay only knows [`Publisher`]; an acknowledged `publish` is what lets
//! it mark a row. Consumers only know [`MessageSource`]: fetch in partition
//! order, commit after the inbox transaction. Each broker is one folder that
//! implements both and is the only module linking its client crate: the
//! embedded transport, Kafka ([`kafka`], rdkafka), NATS JetStream
//! ([`nats`], async-nats), RabbitMQ ([`rabbitmq`], lapin) and Redis Streams
//! ([`redis`], redis-rs). A webhook
//! route sends over HTTP instead ([`webhook`]), beside whichever broker.

mod any;
pub mod embedded;
mod group_commit;
pub mod kafka;
pub mod nats;
pub mod rabbitmq;
pub mod redis;
pub mod webhook;

use crate::message::{Delivery, OutgoingMessage};
pub use any::{AnyPublisher, AnySource, BrokerSetupError};
use std::future::Future;

/// Why a publish failed; the relay branches on it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PublishError {
    /// Worth another attempt with backoff: the broker is down, slow, or busy.
    #[error("retryable broker error: {0}")]
    Retryable(String),
    /// Another attempt cannot succeed, for example a message that is too
    /// large or an invalid topic name; the event goes to the dead state.
    #[error("permanent broker error: {0}")]
    Permanent(String),
    /// The topic does not exist on the broker (deleted while outboxd runs):
    /// retried with backoff like any broker state, and reported as such.
    #[error(
        "retryable broker error: topic `{topic}` does not exist on the broker; create it again \
         (or restart outboxd with [transport.topics] create = true)"
    )]
    TopicMissing { topic: String },
    /// The destination asked to wait (HTTP 429 or 503 with `Retry-After`):
    /// an attempt, retried no sooner than `after`.
    #[error("retryable broker error: {reason} (retry after {after:?})")]
    Throttled {
        reason: String,
        after: std::time::Duration,
    },
    /// The destination is stopped (a webhook route its endpoint ended with
    /// 410 Gone): not an attempt; the event waits until it is resumed.
    #[error("{reason}")]
    Paused { reason: String },
}

impl PublishError {
    pub fn is_permanent(&self) -> bool {
        matches!(self, PublishError::Permanent(_))
    }

    /// How long the destination asked to be left alone, if it did.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            PublishError::Throttled { after, .. } => Some(*after),
            _ => None,
        }
    }
}

pub trait Publisher: Send + Sync + 'static {
    /// Resolves only once the broker has acknowledged the message durably.
    fn publish(
        &self,
        msg: OutgoingMessage,
    ) -> impl Future<Output = Result<(), PublishError>> + Send;
}

impl<P: Publisher> Publisher for std::sync::Arc<P> {
    fn publish(
        &self,
        msg: OutgoingMessage,
    ) -> impl Future<Output = Result<(), PublishError>> + Send {
        (**self).publish(msg)
    }
}

/// Acknowledges nothing and everything: for code that needs a relay only
/// to build messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct NullPublisher;

impl Publisher for NullPublisher {
    async fn publish(&self, _msg: OutgoingMessage) -> Result<(), PublishError> {
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConsumeError {
    #[error("transport error: {0}")]
    Transport(String),
    /// The client cannot consume again (a fenced static member): the
    /// consumer stops instead of retrying.
    #[error("fatal transport error: {0}")]
    Fatal(String),
    #[error("database error in the transport: {0}")]
    Database(#[from] sqlx::Error),
}

impl ConsumeError {
    /// The outcome of a commit after which `lost` partitions (`TOPIC/N`)
    /// turned out to be another member's: `Ok` when none was; otherwise
    /// an error saying that the new owner resumes from `position` (the
    /// last committed offset, stream sequence or entry).
    pub(crate) fn unless_leases_lost(
        lost: &[String],
        group: &str,
        position: &str,
    ) -> Result<(), ConsumeError> {
        if lost.is_empty() {
            return Ok(());
        }
        Err(ConsumeError::Transport(format!(
            "lost the lease on {} for group {group}; the new owner resumes from the last committed {position}",
            lost.join(", ")
        )))
    }
}

/// What consumers read from: a consumer group's view of its assigned
/// partitions. Offsets are committed only after handling is complete.
pub trait MessageSource: Send {
    /// Up to `max` next messages, in partition order; may return fewer.
    fn fetch(
        &mut self,
        max: usize,
    ) -> impl Future<Output = Result<Vec<Delivery>, ConsumeError>> + Send;
    /// Marks everything up to and including `delivery` as handled.
    fn commit(
        &mut self,
        delivery: &Delivery,
    ) -> impl Future<Output = Result<(), ConsumeError>> + Send;
    /// [`commit`](Self::commit) for the last handled delivery of several
    /// partitions (one each). A source may do them together (one database
    /// commit instead of one per partition); every delivery is committed or
    /// the error says which was not.
    fn commit_all(
        &mut self,
        deliveries: Vec<Delivery>,
    ) -> impl Future<Output = Result<(), ConsumeError>> + Send {
        async move {
            for d in &deliveries {
                self.commit(d).await?;
            }
            Ok(())
        }
    }
    /// True when an empty [`fetch`](Self::fetch) has already waited for new
    /// messages (a bounded long poll), so the consumer fetches again at once
    /// instead of sleeping its poll interval.
    fn waits_for_messages(&self) -> bool {
        false
    }
    /// Gives back what this member holds of its group (partition leases),
    /// so another member takes over at once instead of after the lease; a
    /// consumer calls it when it stops. Kafka's group does this itself.
    fn release(&mut self) -> impl Future<Output = Result<(), ConsumeError>> + Send {
        async { Ok(()) }
    }
}
