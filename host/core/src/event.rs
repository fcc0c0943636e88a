//! The event types that cross the outbox: what a producer writes, what the
//! relay claims, and what an enqueue returns.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The id of an outbox row. It travels with every message as its message id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EventId(pub Uuid);

impl std::fmt::Display for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// An optional operation key (a client retry must not create a second event): repeating the key with the same
/// payload returns the first event instead of writing a second one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationKey {
    /// Keys are unique per tenant; use "" when there is one tenant.
    pub tenant: String,
    pub key: String,
}

/// An event a producer writes inside its own transaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewEvent {
    pub aggregate_id: String,
    pub event_type: String,
    pub payload: serde_json::Value,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub operation_key: Option<OperationKey>,
}

impl NewEvent {
    pub fn new(
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: serde_json::Value,
    ) -> Self {
        Self {
            aggregate_id: aggregate_id.into(),
            event_type: event_type.into(),
            payload,
            headers: BTreeMap::new(),
            operation_key: None,
        }
    }

    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    pub fn with_operation_key(mut self, tenant: impl Into<String>, key: impl Into<String>) -> Self {
        self.operation_key = Some(OperationKey {
            tenant: tenant.into(),
            key: key.into(),
        });
        self
    }
}

/// What `enqueue` did with a [`NewEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// A new outbox row was written; it exists if and only if the caller commits.
    Created(EventId),
    /// The operation key was already used with the same payload: no new row.
    Repeat(EventId),
}

impl Enqueued {
    pub fn id(self) -> EventId {
        match self {
            Enqueued::Created(id) | Enqueued::Repeat(id) => id,
        }
    }

    pub fn is_repeat(self) -> bool {
        matches!(self, Enqueued::Repeat(_))
    }
}

/// A pending event as the relay claims it. The payload stays JSON text, so
/// the relay never re-serialises it.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEvent {
    pub seq: i64,
    pub id: EventId,
    pub aggregate_id: String,
    pub event_type: String,
    pub payload: String,
    pub headers: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    /// Failed attempts so far.
    pub attempts: i32,
    /// `NAME@VERSION` when an operator redrove this event through that
    /// registry version of one of its route's plugins (fix-forward);
    /// `None` runs the active versions.
    pub redrive_with: Option<String>,
}

/// Parses the stored header object. Values that are not strings (only
/// possible through hand-written SQL) are kept as their JSON text rather
/// than failing the event.
pub fn parse_headers(seq: i64, text: &str) -> Result<BTreeMap<String, String>, String> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| format!("outbox row {seq}: headers are not valid JSON ({e})"))?;
    let serde_json::Value::Object(map) = value else {
        return Err(format!(
            "outbox row {seq}: headers must be a JSON object of strings"
        ));
    };
    Ok(map
        .into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => (k, s),
            other => (k, other.to_string()),
        })
        .collect())
}
