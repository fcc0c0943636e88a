//! Brokers: where the relay publishes and where consumers read.
//!
//! The relay only knows [`Publisher`]; an acknowledged `publish` is what lets
//! it mark a row. The embedded transport and Kafka ([`kafka`], the only
//! module that links rdkafka) both implement it.

pub mod embedded;
mod group_commit;
pub mod kafka;

use std::future::Future;

use chrono::{DateTime, Utc};

/// Header names the relay sets on every message.
pub mod headers {
    pub const MESSAGE_ID: &str = "message-id";
    pub const EVENT_TYPE: &str = "event-type";
    pub const AGGREGATE_ID: &str = "aggregate-id";
    pub const CREATED_AT: &str = "created-at";
    /// The names above: set by the host only, never copied from an event
    /// or a plugin.
    pub const HOST_SET: [&str; 4] = [MESSAGE_ID, EVENT_TYPE, AGGREGATE_ID, CREATED_AT];
}

/// A message ready for the broker.
#[derive(Debug, Clone, PartialEq)]
pub struct OutgoingMessage {
    pub topic: String,
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
    /// The outbox id (or a deterministic id derived from it).
    pub message_id: uuid::Uuid,
    pub created_at: DateTime<Utc>,
}

impl OutgoingMessage {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// Why a publish failed; the relay branches on it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PublishError {
    /// Worth another attempt with backoff: the broker is down, slow, or busy.
    #[error("retryable broker error: {0}")]
    Retryable(String),
    /// Another attempt cannot succeed, for example a message that is too
    /// large or a topic that does not exist; the event goes to the dead state.
    #[error("permanent broker error: {0}")]
    Permanent(String),
}

impl PublishError {
    pub fn is_permanent(&self) -> bool {
        matches!(self, PublishError::Permanent(_))
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

/// A message as a consumer receives it.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
    /// Failed attempts at this message so far in this consumer (0 on the
    /// first delivery). The runner sets it; sources leave it 0.
    pub attempt: u32,
}

impl Delivery {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The message id the inbox deduplicates on.
    pub fn message_id(&self) -> Result<uuid::Uuid, String> {
        let raw = self.header(headers::MESSAGE_ID).ok_or_else(|| {
            format!(
                "{}/{}@{}: no `{}` header; only messages published by outboxd (or carrying that header) can be deduplicated",
                self.topic, self.partition, self.offset, headers::MESSAGE_ID
            )
        })?;
        let text = std::str::from_utf8(raw).map_err(|_| {
            format!(
                "{}/{}@{}: `{}` header is not UTF-8",
                self.topic,
                self.partition,
                self.offset,
                headers::MESSAGE_ID
            )
        })?;
        uuid::Uuid::parse_str(text).map_err(|e| {
            format!(
                "{}/{}@{}: `{}` header `{text}` is not a uuid ({e})",
                self.topic,
                self.partition,
                self.offset,
                headers::MESSAGE_ID
            )
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConsumeError {
    #[error("transport error: {0}")]
    Transport(String),
    #[error("database error in the transport: {0}")]
    Database(#[from] sqlx::Error),
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
    /// True when an empty [`fetch`](Self::fetch) has already waited for new
    /// messages (a bounded long poll), so the consumer fetches again at once
    /// instead of sleeping its poll interval.
    fn waits_for_messages(&self) -> bool {
        false
    }
}
