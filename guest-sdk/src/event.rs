//! The idiomatic event and message types, and their conversions to and
//! from the generated ones.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Error;
use crate::wit::transformer::outbox::plugin::types as wit;

/// An event from the outbox (or from the previous plugin of a chain).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The outbox id (a uuid): the message id consumers deduplicate on.
    pub id: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, String)>,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// The partition key so far (the aggregate id unless re-keyed).
    pub key: Vec<u8>,
    /// Earlier failed attempts.
    pub attempt: u32,
}

impl Event {
    /// The payload parsed as JSON into `T`; a mismatch is a permanent error.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.payload).map_err(|e| {
            Error::Permanent(format!(
                "event {} ({}): payload does not match the expected JSON shape: {e}",
                self.id, self.event_type
            ))
        })
    }

    /// The payload as UTF-8 text.
    pub fn payload_str(&self) -> Result<&str, Error> {
        Ok(core::str::from_utf8(&self.payload)?)
    }

    /// The first header with this name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A message that publishes this event unchanged: same key, payload and
    /// headers, on the route's topic.
    pub fn forward(&self) -> Message {
        Message {
            topic: None,
            key: self.key.clone(),
            payload: self.payload.clone(),
            headers: self.headers.clone(),
        }
    }
}

/// A message for the broker.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    /// `None` keeps the route's topic.
    pub topic: Option<String>,
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, String)>,
}

impl Message {
    /// A message with this JSON payload and no key, headers or topic.
    pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<Message, Error> {
        Ok(Message {
            payload: serde_json::to_vec(value)?,
            ..Message::default()
        })
    }

    pub fn with_payload(mut self, payload: impl Into<Vec<u8>>) -> Self {
        self.payload = payload.into();
        self
    }

    pub fn with_json<T: Serialize + ?Sized>(mut self, value: &T) -> Result<Self, Error> {
        self.payload = serde_json::to_vec(value)?;
        Ok(self)
    }

    pub fn with_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.key = key.into();
        self
    }

    pub fn with_topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// Sets a header, replacing any header of the same name.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        let name = name.into();
        self.headers.retain(|(k, _)| *k != name);
        self.headers.push((name, value.into()));
        self
    }
}

impl From<wit::Event> for Event {
    fn from(e: wit::Event) -> Self {
        Event {
            id: e.id,
            aggregate_id: e.aggregate_id,
            event_type: e.event_type,
            payload: e.payload,
            headers: e.headers,
            created_at: e.created_at,
            key: e.key,
            attempt: e.attempt,
        }
    }
}

impl From<Message> for wit::OutgoingMessage {
    fn from(m: Message) -> Self {
        wit::OutgoingMessage {
            topic: m.topic,
            key: m.key,
            payload: m.payload,
            headers: m.headers,
        }
    }
}
