//! The outbox store: the durable half of the outbox, behind one trait with a
//! Postgres and a SQLite implementation.
//!
//! Producers call [`enqueue`] inside their own transaction. The relay calls
//! [`OutboxStore::claim`] and then [`ClaimedBatch::complete`] with what the
//! broker acknowledged.

pub mod backend;
pub mod inbox;
pub mod outbox;
pub mod plugin_sql;
pub mod registry;
pub mod transport;

use std::future::Future;

use chrono::{DateTime, Utc};
use serde::Serialize;

pub(crate) use backend::db::on_pool;
pub use backend::db::{Db, HOST_SCHEMA, execute_in_app_schema, host_pg_options};
pub use backend::migrate::{MigrationReport, migrate, migrate_to};
pub use backend::notify::Channel;
pub(crate) use backend::notify::in_announced_tx;
pub use inbox::tx::{InboxTx, PgInboxTx, StatementError};
pub use outbox::any::AnyStore;
pub use outbox::enqueue::{OutboxDatabase, enqueue, lookup_operation};
pub use outbox::fingerprint::fingerprint;

use crate::event::OutboxEvent;

/// Errors of the store as a whole. Enqueue has its own error type because
/// its callers branch on idempotency conflicts.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {source}{hint}", source = .0, hint = backend::problem::hint(.0))]
    Database(#[from] sqlx::Error),
    #[error(
        "unsupported database URL `{0}`: use postgres://USER@HOST/DB or sqlite://PATH (sqlite::memory: for a throwaway store)"
    )]
    UnsupportedUrl(String),
    #[error("migration {version} ({name}) failed: {source}")]
    Migration {
        version: i64,
        name: String,
        source: sqlx::Error,
    },
    /// TLS to Postgres cannot work as configured (store/backend/pg_tls.rs).
    #[error(transparent)]
    Tls(#[from] backend::pg_tls::TlsProblem),
    #[error(
        "the database has migration {found} applied, but this outboxd only knows up to {known}; upgrade outboxd instead of running an older binary against a newer schema"
    )]
    SchemaTooNew { found: i64, known: i64 },
}

#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    #[error("invalid event: {0}")]
    Invalid(String),
    #[error(
        "operation key `{key}` (tenant `{tenant}`) was already used for a different payload (event {existing}); send a new key for a different operation"
    )]
    IdempotencyConflict {
        tenant: String,
        key: String,
        existing: uuid::Uuid,
    },
    #[error("database error while enqueueing: {source}{hint}", source = .0, hint = backend::problem::hint(.0))]
    Database(#[from] sqlx::Error),
}

/// One event's failed publish, as the relay decided it.
#[derive(Debug, Clone)]
pub struct FailedEvent {
    pub seq: i64,
    /// Already truncated to 500 characters.
    pub error: String,
    /// When to try again (ignored when `dead`).
    pub retry_at: DateTime<Utc>,
    /// Move the event to the terminal dead state.
    pub dead: bool,
    /// Whether this counts as an attempt: false when the event was not
    /// tried (its webhook route is paused), so waiting costs no attempt.
    pub counts_attempt: bool,
}

/// What happened to a claimed batch.
#[derive(Debug, Clone, Default)]
pub struct BatchOutcome {
    pub published: Vec<i64>,
    pub failed: Vec<FailedEvent>,
    /// Done without a message: a transformer returned no output.
    pub filtered: Vec<i64>,
    /// Published or filtered events that went through plugins, with the
    /// chain's `name@version,...` label.
    pub transformed: Vec<(i64, String)>,
}

impl BatchOutcome {
    /// Every published and filtered event as `(seq, outcome, label)`, for
    /// the one statement that marks a batch that went through plugins (the
    /// label is `None` for an event whose route has no transformers). Each
    /// row is then written once rather than once to mark it and once more
    /// to record its label.
    pub fn done_rows(&self) -> Vec<(i64, &'static str, Option<&str>)> {
        let labels: std::collections::HashMap<i64, &str> = self
            .transformed
            .iter()
            .map(|(seq, label)| (*seq, label.as_str()))
            .collect();
        let published = self.published.iter().map(|s| (*s, "published"));
        let filtered = self.filtered.iter().map(|s| (*s, "filtered"));
        published
            .chain(filtered)
            .map(|(seq, outcome)| (seq, outcome, labels.get(&seq).copied()))
            .collect()
    }
}

/// A batch of claimed events. Dropping it without `complete` releases the
/// claim (Postgres rolls back; SQLite leases expire), so a crash between
/// publish and mark republishes: at least once, never lost.
pub trait ClaimedBatch: Send {
    fn events(&self) -> &[OutboxEvent];
    fn complete(
        self,
        outcome: BatchOutcome,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The relay's view of the store.
pub trait OutboxStore: Clone + Send + Sync + 'static {
    type Batch: ClaimedBatch;

    /// Claims up to `limit` due events, at most one per aggregate and each
    /// the oldest unpublished event of its aggregate.
    fn claim(
        &self,
        limit: usize,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<Self::Batch, StoreError>> + Send;

    fn stats(
        &self,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<OutboxStats, StoreError>> + Send;
}

/// What an operator watches: the pending backlog and the age of its oldest
/// event, plus dead and blocked counts.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OutboxStats {
    pub pending: i64,
    /// Age of the oldest pending (not dead) event: the alert that matters.
    pub oldest_pending_age_seconds: f64,
    /// Pending events that failed 5 or more times.
    pub failing: i64,
    pub dead: i64,
    /// Aggregates whose oldest unpublished event is dead, so later events wait.
    pub blocked_aggregates: i64,
    /// Pending events waiting behind a dead event of their aggregate.
    pub blocked_events: i64,
    pub published: i64,
}

impl OutboxStats {
    /// From the one row of either database's stats query, whose columns
    /// come in the order of the fields.
    pub(crate) fn from_row<R>(row: &R) -> Result<Self, sqlx::Error>
    where
        R: sqlx::Row,
        usize: sqlx::ColumnIndex<R>,
        i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        f64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        Ok(OutboxStats {
            pending: row.try_get(0)?,
            oldest_pending_age_seconds: row.try_get(1)?,
            failing: row.try_get(2)?,
            dead: row.try_get(3)?,
            blocked_aggregates: row.try_get(4)?,
            blocked_events: row.try_get(5)?,
            published: row.try_get(6)?,
        })
    }
}

/// Cuts `s` to at most `max` characters, on a character boundary: error
/// texts stored in a row (`last_error`, a dead letter's reason) must not
/// bloat it.
pub fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((idx, _)) => s[..idx].to_string(),
        None => s.to_string(),
    }
}
