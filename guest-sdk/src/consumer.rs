//! Consumer plugins: a message in, effects through the host's transaction.
//!
//! ```ignore
//! use outboxd_guest::{Consumer, Delivery, Result, Transaction};
//!
//! struct Audit;
//!
//! impl Consumer for Audit {
//!     fn handle(tx: &Transaction, message: Delivery) -> Result<()> {
//!         tx.execute(
//!             "INSERT INTO audit (message_id, topic) VALUES ($1, $2)",
//!             &[message.id.as_str().into(), message.topic.as_str().into()],
//!         )?;
//!         Ok(())
//!     }
//! }
//!
//! outboxd_guest::export_consumer!(Audit);
//! ```

use serde::de::DeserializeOwned;

use crate::Error;
use crate::wit::consumer::outbox::plugin::transaction as wit;
use crate::wit::transformer::outbox::plugin::types;

pub use wit::{DbError, Rows, Value};

/// A message as the consumer receives it. `id` is the message id the inbox
/// deduplicates on: pass it as the idempotency key of any external call.
pub type Delivery = types::Message;

/// A consumer: applies one message's effect through `tx`. The host commits
/// only if this returns `Ok` and no statement failed; otherwise every
/// effect (and the inbox mark) is rolled back.
pub trait Consumer {
    fn handle(tx: &Transaction<'_>, message: Delivery) -> crate::Result<()>;
}

/// The host's transaction, borrowed for one `handle` call. There is no
/// commit or rollback: the host decides from the result.
pub struct Transaction<'a> {
    inner: &'a wit::Transaction,
}

/// A new outbox event, enqueued atomically with the handler's effects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    pub aggregate_id: String,
    pub event_type: String,
    /// JSON text.
    pub payload: Vec<u8>,
    pub headers: Vec<(String, String)>,
}

impl NewEvent {
    /// An event with a JSON payload.
    pub fn json<T: serde::Serialize>(
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: &T,
    ) -> crate::Result<Self> {
        Ok(Self {
            aggregate_id: aggregate_id.into(),
            event_type: event_type.into(),
            payload: serde_json::to_vec(payload)?,
            headers: Vec::new(),
        })
    }

    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

impl Transaction<'_> {
    /// Runs one INSERT, UPDATE or DELETE; returns the rows it affected.
    pub fn execute(&self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        self.inner.execute(sql, params)
    }

    /// Runs one SELECT (or a statement with RETURNING).
    pub fn query(&self, sql: &str, params: &[Value]) -> Result<Rows, DbError> {
        self.inner.query(sql, params)
    }

    /// Enqueues an outbox event in the same transaction; returns its id.
    pub fn emit(&self, event: NewEvent) -> Result<String, DbError> {
        self.inner.emit(&wit::NewEvent {
            aggregate_id: event.aggregate_id,
            event_type: event.event_type,
            payload: event.payload,
            headers: event.headers,
        })
    }
}

impl Delivery {
    /// The payload parsed as JSON into `T`; a mismatch is permanent.
    pub fn json<T: DeserializeOwned>(&self) -> crate::Result<T> {
        serde_json::from_slice(&self.payload).map_err(|e| {
            Error::Permanent(format!(
                "message {} on {}: payload does not match the expected JSON shape: {e}",
                self.id, self.topic
            ))
        })
    }

    /// The first header with this name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A database error is retryable by default: the host rolls back anyway,
/// and a lock timeout or a serialization failure may pass next time.
impl From<DbError> for Error {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Refused(m) => Error::Permanent(format!("statement refused: {m}")),
            DbError::BudgetExceeded(m) => Error::Retryable(format!("budget exceeded: {m}")),
            DbError::Database((Some(code), m)) => {
                Error::Retryable(format!("database error {code}: {m}"))
            }
            DbError::Database((None, m)) => Error::Retryable(format!("database error: {m}")),
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Text(s.to_string())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Text(s)
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Value::Int(n)
    }
}

impl From<i32> for Value {
    fn from(n: i32) -> Self {
        Value::Int(n.into())
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Boolean(b)
    }
}

impl From<f64> for Value {
    fn from(f: f64) -> Self {
        Value::Float(f)
    }
}

impl From<Vec<u8>> for Value {
    fn from(b: Vec<u8>) -> Self {
        Value::Bytes(b)
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

#[doc(hidden)]
pub fn run_consumer<C: Consumer>(
    tx: &wit::Transaction,
    message: Delivery,
) -> Result<(), types::PluginError> {
    C::handle(&Transaction { inner: tx }, message).map_err(Into::into)
}
