//! The outboxd guest SDK for consumer plugins: a message in, effects
//! through the host's transaction.
//!
//! It is a crate of its own so that only consumers carry the consumer
//! world's bindings: a transformer built with `outboxd-guest` alone never
//! imports `outbox:plugin/transaction`, which the host refuses to link for
//! transformers.
//!
//! ```ignore
//! use outboxd_guest_consumer::{Consumer, Delivery, Result, Transaction};
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
//! outboxd_guest_consumer::export_consumer!(Audit);
//! ```

use crate::wit::consumer::outbox::plugin::transaction as txn;

pub mod http;

pub use outboxd_guest::{Delivery, Error, Result, config};
pub use txn::{DbError, Rows, Value};

/// The generated bindings. Not a stable API: use the crate's own types.
#[doc(hidden)]
#[allow(unsafe_code)] // The generated ABI glue needs it.
pub mod wit {
    pub mod consumer {
        wit_bindgen::generate!({
            world: "consumer",
            path: "../../wit",
            pub_export_macro: true,
            export_macro_name: "__export_consumer_world",
            default_bindings_module: "outboxd_guest_consumer::wit::consumer",
            with: {
                "outbox:plugin/types@0.1.0": outboxd_guest::wit::transformer::outbox::plugin::types,
                "outbox:plugin/config@0.1.0": outboxd_guest::wit::transformer::outbox::plugin::config,
            },
        });
    }

    /// `consumer-http`: only its `wasi:http` (and `wasi:io`, `wasi:clocks`)
    /// imports are new; the `outbox:plugin` interfaces are the ones above.
    /// Its import functions are linked only into a plugin that calls
    /// [`crate::http`], so other consumers import no `wasi:http`.
    pub mod consumer_http {
        wit_bindgen::generate!({
            world: "consumer-http",
            path: "../../wit",
            default_bindings_module: "outboxd_guest_consumer::wit::consumer_http",
            generate_all,
            with: {
                "outbox:plugin/types@0.1.0": outboxd_guest::wit::transformer::outbox::plugin::types,
                "outbox:plugin/config@0.1.0": outboxd_guest::wit::transformer::outbox::plugin::config,
                "outbox:plugin/transaction@0.1.0": crate::wit::consumer::outbox::plugin::transaction,
            },
        });
    }
}

/// A consumer: applies one message's effect through `tx`. The host commits
/// only if this returns `Ok` and no statement failed; otherwise every
/// effect (and the inbox mark) is rolled back.
pub trait Consumer {
    fn handle(tx: &Transaction<'_>, message: Delivery) -> Result<()>;
}

/// The host's transaction, borrowed for one `handle` call. There is no
/// commit or rollback: the host decides from the result.
pub struct Transaction<'a> {
    inner: &'a txn::Transaction,
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
    ) -> Result<Self> {
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
        self.inner.emit(&txn::NewEvent {
            aggregate_id: event.aggregate_id,
            event_type: event.event_type,
            payload: event.payload,
            headers: event.headers,
        })
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
pub mod __private {
    pub use outboxd_guest::wit::transformer::outbox::plugin::types::PluginError;

    use super::{Consumer, Delivery, Transaction, txn};

    /// The adapter the export macro calls: wraps the borrowed handle, runs,
    /// converts the error.
    pub fn run_consumer<C: Consumer>(
        tx: &txn::Transaction,
        message: Delivery,
    ) -> Result<(), PluginError> {
        C::handle(&Transaction { inner: tx }, message).map_err(Into::into)
    }
}

/// Exports a [`Consumer`] as the component's `handle` function.
#[macro_export]
macro_rules! export_consumer {
    ($ty:ty) => {
        #[doc(hidden)]
        struct __OutboxdConsumerExport;

        impl $crate::wit::consumer::Guest for __OutboxdConsumerExport {
            fn handle(
                tx: &$crate::wit::consumer::outbox::plugin::transaction::Transaction,
                message: $crate::Delivery,
            ) -> ::core::result::Result<(), $crate::__private::PluginError> {
                $crate::__private::run_consumer::<$ty>(tx, message)
            }
        }

        $crate::wit::consumer::__export_consumer_world!(
            __OutboxdConsumerExport with_types_in $crate::wit::consumer
        );
    };
}
