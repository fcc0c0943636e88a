//! One message through the inbox: begin, mark, handle, commit.
//!
//! Also the inbox's types ([`InboxTx`], [`Handler`], [`Pinned`],
//! [`Attempt`], [`Processed`]); several messages in one transaction are in
//! `consumer/batch.rs`, re-exported here as [`process_batch`] and
//! [`attempt_batch`].

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use sqlx::{Postgres, Sqlite, Transaction};

use super::plugin_handler::ConsumerVersions;
use crate::broker::Delivery;
use crate::store::Db;

pub use super::batch::{attempt_batch, process_batch};

/// The transaction a handler runs in. It is borrowed for the call only; the
/// host alone commits or rolls it back.
pub enum InboxTx {
    Postgres(PgInboxTx),
    Sqlite(Transaction<'static, Sqlite>),
}

impl InboxTx {
    /// Gives the host its own role back if a consumer plugin's role is set
    /// on the transaction (Postgres). The host's statements on the
    /// transaction (the inbox marks, savepoints, the commit) do this
    /// themselves; a library caller that runs its own statements after a
    /// plugin call does it first.
    pub async fn as_host(&mut self) -> Result<(), sqlx::Error> {
        match self {
            InboxTx::Postgres(t) => t.as_host().await,
            InboxTx::Sqlite(_) => Ok(()),
        }
    }
}

/// A Postgres transaction of the inbox, and whether a consumer plugin's role
/// is set on it. Within one transaction the role stays set from a plugin's
/// first statement until the host's next statement of its own, so the
/// messages of a batch, which run back to back after their inbox marks,
/// switch roles once, not twice per message. Derefs to the connection, as a
/// `Transaction` does.
pub struct PgInboxTx {
    tx: Transaction<'static, Postgres>,
    /// Set while the plugin's role is (`SET LOCAL ROLE`): the backend's pid,
    /// for a cancel from another connection.
    pub(crate) plugin_role: Option<i32>,
}

impl From<Transaction<'static, Postgres>> for PgInboxTx {
    fn from(tx: Transaction<'static, Postgres>) -> Self {
        Self {
            tx,
            plugin_role: None,
        }
    }
}

impl std::ops::Deref for PgInboxTx {
    type Target = sqlx::PgConnection;
    fn deref(&self) -> &sqlx::PgConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for PgInboxTx {
    fn deref_mut(&mut self) -> &mut sqlx::PgConnection {
        &mut self.tx
    }
}

impl PgInboxTx {
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }

    pub async fn rollback(self) -> Result<(), sqlx::Error> {
        self.tx.rollback().await
    }

    /// The transaction itself, for [`crate::enqueue`].
    pub fn transaction(&mut self) -> &mut Transaction<'static, Postgres> {
        &mut self.tx
    }

    /// `RESET ROLE` when a plugin's role is set.
    pub async fn as_host(&mut self) -> Result<(), sqlx::Error> {
        if self.plugin_role.take().is_some() {
            sqlx::query("RESET ROLE").execute(&mut *self.tx).await?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum HandlerError {
    /// Roll back and deliver again later.
    #[error("retryable: {0}")]
    Retryable(String),
    /// Roll back; another attempt cannot succeed.
    #[error("permanent: {0}")]
    Permanent(String),
    /// Roll back and wait: no handler version can run yet (a registry
    /// consumer plugin with no active version). Not counted as an attempt,
    /// so it never dead-letters a message.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

impl From<sqlx::Error> for HandlerError {
    fn from(e: sqlx::Error) -> Self {
        HandlerError::Retryable(format!(
            "database error in handler: {e}{}",
            crate::store::problem::hint(&e)
        ))
    }
}

pub trait Handler: Send + Sync + 'static {
    /// Runs once at the start of each transaction, before the first inbox
    /// mark: session settings that hold for the whole transaction (a
    /// consumer plugin's statement timeout). Nothing by default.
    fn begin(&self, _tx: &mut InboxTx) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        async { Ok(()) }
    }

    /// Runs right before each commit: a consumer plugin's handler resets
    /// the session there, so the pooled connection goes back clean.
    fn before_commit(
        &self,
        _tx: &mut InboxTx,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        async { Ok(()) }
    }

    fn handle(
        &self,
        tx: &mut InboxTx,
        delivery: &Delivery,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// Picks the version that will handle the next message, before its
    /// inbox mark (which records the label). A handler whose version can be
    /// swapped reads it once here, so the whole message runs on it.
    fn pin(&self) -> Pinned {
        Pinned::unversioned()
    }

    /// Handles one message on the version [`pin`](Self::pin) picked.
    fn handle_pinned(
        &self,
        pinned: &Pinned,
        tx: &mut InboxTx,
        delivery: &Delivery,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        let _ = pinned;
        self.handle(tx, delivery)
    }
}

/// The handler version picked for one message.
#[derive(Debug, Clone)]
pub struct Pinned {
    /// `name@version`, recorded in the inbox row's `handled_by` and in a
    /// dead letter; `None` for a built-in handler (or no active version).
    pub label: Option<String>,
    /// A swappable plugin's versions as they were when picked.
    pub versions: Option<Arc<ConsumerVersions>>,
    /// When it was picked: the version was current at this instant.
    pub picked_at: Instant,
}

impl Pinned {
    /// A handler without versions.
    pub fn unversioned() -> Self {
        Self {
            label: None,
            versions: None,
            picked_at: Instant::now(),
        }
    }
}

/// One message's outcome and the handler version that produced it (`None`
/// for a duplicate, a built-in handler, or a message with no usable id).
#[derive(Debug)]
pub struct Attempt {
    pub result: Result<Processed, HandlerError>,
    pub handled_by: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Processed {
    /// The effect committed together with the inbox mark.
    Handled,
    /// The inbox already had this message for this consumer: no effect.
    Duplicate,
}

/// Handles one delivery exactly once per consumer name: the inbox mark and
/// the handler's writes commit together or not at all.
pub async fn process<H: Handler>(
    db: &Db,
    consumer: &str,
    delivery: &Delivery,
    handler: &H,
) -> Result<Processed, HandlerError> {
    attempt(db, consumer, delivery, handler).await.result
}

/// [`process`], also naming the handler version that ran.
pub async fn attempt<H: Handler>(
    db: &Db,
    consumer: &str,
    delivery: &Delivery,
    handler: &H,
) -> Attempt {
    let failed = |e: HandlerError| Attempt {
        result: Err(e),
        handled_by: None,
    };
    let message_id = match delivery.message_id() {
        Ok(id) => id,
        Err(e) => return failed(HandlerError::Permanent(e)),
    };
    let begun = match db {
        Db::Postgres(p) => p.begin().await.map(|t| InboxTx::Postgres(t.into())),
        Db::Sqlite(p) => p.begin().await.map(InboxTx::Sqlite),
    };
    let mut tx = match begun {
        Ok(tx) => tx,
        Err(e) => return failed(e.into()),
    };
    if let Err(e) = handler.begin(&mut tx).await {
        let _ = rollback(tx).await;
        return failed(e.into());
    }
    match mark_and_handle(&mut tx, consumer, message_id, delivery, handler).await {
        (handled_by, Ok(Processed::Handled)) => {
            if let Err(e) = handler.before_commit(&mut tx).await {
                let _ = rollback(tx).await;
                return failed(e.into());
            }
            let committed = match tx {
                InboxTx::Postgres(t) => t.commit().await,
                InboxTx::Sqlite(t) => t.commit().await,
            };
            Attempt {
                result: committed
                    .map(|()| Processed::Handled)
                    .map_err(HandlerError::from),
                handled_by,
            }
        }
        (handled_by, result) => {
            if let Err(e) = rollback(tx).await {
                return failed(e.into());
            }
            Attempt { result, handled_by }
        }
    }
}

pub(super) const INSERT_MARK: &str = "INSERT INTO inbox (consumer, message_id, handled_by) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";

/// Inside `tx`: pick the version, write the inbox mark naming it, run the
/// handler on it. A duplicate is `Ok(Duplicate)`, and the caller rolls back
/// anything that is not `Ok(Handled)`.
pub(super) async fn mark_and_handle<H: Handler>(
    tx: &mut InboxTx,
    consumer: &str,
    message_id: uuid::Uuid,
    delivery: &Delivery,
    handler: &H,
) -> (Option<String>, Result<Processed, HandlerError>) {
    let pinned = handler.pin();
    let sql = INSERT_MARK;
    if let Err(e) = tx.as_host().await {
        return (None, Err(e.into()));
    }
    let inserted = match tx {
        InboxTx::Postgres(t) => sqlx::query(sql)
            .bind(consumer)
            .bind(message_id)
            .bind(&pinned.label)
            .execute(&mut **t)
            .await
            .map(|r| r.rows_affected()),
        InboxTx::Sqlite(t) => sqlx::query(sql)
            .bind(consumer)
            .bind(message_id.to_string())
            .bind(&pinned.label)
            .execute(&mut **t)
            .await
            .map(|r| r.rows_affected()),
    };
    match inserted {
        Ok(0) => return (None, Ok(Processed::Duplicate)),
        Ok(_) => {}
        Err(e) => return (None, Err(e.into())),
    }
    let result = handler.handle_pinned(&pinned, tx, delivery).await;
    (pinned.label, result.map(|()| Processed::Handled))
}

pub(super) async fn rollback(tx: InboxTx) -> Result<(), sqlx::Error> {
    match tx {
        InboxTx::Postgres(t) => t.rollback().await,
        InboxTx::Sqlite(t) => t.rollback().await,
    }
}

/// Runs one of the host's statements on `tx` (a savepoint, say), as the
/// host. A savepoint is always taken as the host, so a rollback to one
/// (which must also work in an aborted transaction, where `RESET ROLE`
/// would fail) gives the host its role back by itself.
pub(crate) async fn exec(tx: &mut InboxTx, sql: &str) -> Result<(), sqlx::Error> {
    if sql.starts_with("ROLLBACK TO") {
        if let InboxTx::Postgres(t) = tx {
            t.plugin_role = None;
        }
    } else {
        tx.as_host().await?;
    }
    match tx {
        InboxTx::Postgres(t) => sqlx::query(sql).execute(&mut **t).await.map(|_| ()),
        InboxTx::Sqlite(t) => sqlx::query(sql).execute(&mut **t).await.map(|_| ()),
    }
}
