//! One message through the inbox: begin, mark, handle, commit.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use sqlx::{Postgres, Sqlite, Transaction};

use super::plugin_handler::ConsumerVersions;
use crate::broker::Delivery;
use crate::store::Db;

/// The transaction a handler runs in. It is borrowed for the call only; the
/// host alone commits or rolls it back.
pub enum InboxTx {
    Postgres(Transaction<'static, Postgres>),
    Sqlite(Transaction<'static, Sqlite>),
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
        Db::Postgres(p) => p.begin().await.map(InboxTx::Postgres),
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

const INSERT_MARK: &str = "INSERT INTO inbox (consumer, message_id, handled_by) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";

/// Inside `tx`: pick the version, write the inbox mark naming it, run the
/// handler on it. A duplicate is `Ok(Duplicate)`, and the caller rolls back
/// anything that is not `Ok(Handled)`.
async fn mark_and_handle<H: Handler>(
    tx: &mut InboxTx,
    consumer: &str,
    message_id: uuid::Uuid,
    delivery: &Delivery,
    handler: &H,
) -> (Option<String>, Result<Processed, HandlerError>) {
    let pinned = handler.pin();
    let sql = INSERT_MARK;
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

async fn rollback(tx: InboxTx) -> Result<(), sqlx::Error> {
    match tx {
        InboxTx::Postgres(t) => t.rollback().await,
        InboxTx::Sqlite(t) => t.rollback().await,
    }
}

pub(crate) async fn exec(tx: &mut InboxTx, sql: &str) -> Result<(), sqlx::Error> {
    match tx {
        InboxTx::Postgres(t) => sqlx::query(sql).execute(&mut **t).await.map(|_| ()),
        InboxTx::Sqlite(t) => sqlx::query(sql).execute(&mut **t).await.map(|_| ()),
    }
}

/// Handles several messages of one partition in one transaction, so commit
/// latency is paid once per batch.
///
/// Messages are handled in order until the first failure: the failed
/// message's inbox mark and writes vanish, the messages after it are not
/// attempted (they must wait, in order), and everything before it commits.
/// The result has one entry per attempted message; the offset may advance
/// past the successful prefix only.
///
/// The common case, where every message succeeds, runs without savepoints,
/// and on Postgres writes every inbox mark of the batch in one statement:
/// one round trip per message for the handler's own write, instead of two
/// (four with savepoints). When a message fails, that
/// transaction is rolled back whole, the messages before it run again with
/// a savepoint each and commit, and the failed message's result is the one
/// it already had: its handler runs once per attempt, while the handlers of
/// the prefix run twice, inside transactions of which only one commits.
pub async fn process_batch<H: Handler>(
    db: &Db,
    consumer: &str,
    deliveries: &[Delivery],
    handler: &H,
) -> Result<Vec<Result<Processed, HandlerError>>, sqlx::Error> {
    let attempts = attempt_batch(db, consumer, deliveries, handler).await?;
    Ok(attempts.into_iter().map(|a| a.result).collect())
}

/// [`process_batch`], also naming the handler version of each message.
pub async fn attempt_batch<H: Handler>(
    db: &Db,
    consumer: &str,
    deliveries: &[Delivery],
    handler: &H,
) -> Result<Vec<Attempt>, sqlx::Error> {
    if deliveries.len() <= 1 {
        return attempt_with_savepoints(db, consumer, deliveries, handler).await;
    }
    match attempt_all(db, consumer, deliveries, handler).await? {
        AllOrFailure::All(attempts) => Ok(attempts),
        AllOrFailure::Failed { index, failure } => {
            let mut attempts = if index == 0 {
                Vec::new()
            } else {
                attempt_with_savepoints(db, consumer, &deliveries[..index], handler).await?
            };
            // The prefix ran again; if it all succeeded, the batch stops at
            // the failure it already met, without running that handler again.
            if attempts.len() == index && attempts.iter().all(|a| a.result.is_ok()) {
                attempts.push(failure);
            }
            Ok(attempts)
        }
    }
}

/// The outcome of [`attempt_all`].
enum AllOrFailure {
    /// Committed: one entry per attempted message.
    All(Vec<Attempt>),
    /// Message `index` failed after it may have written; the transaction
    /// was rolled back and nothing of the batch took effect.
    Failed { index: usize, failure: Attempt },
}

async fn begin_batch<H: Handler>(db: &Db, handler: &H) -> Result<InboxTx, sqlx::Error> {
    let mut tx = match db {
        Db::Postgres(p) => InboxTx::Postgres(p.begin().await?),
        Db::Sqlite(p) => InboxTx::Sqlite(p.begin().await?),
    };
    handler.begin(&mut tx).await?;
    Ok(tx)
}

async fn commit(tx: InboxTx) -> Result<(), sqlx::Error> {
    match tx {
        InboxTx::Postgres(t) => t.commit().await,
        InboxTx::Sqlite(t) => t.commit().await,
    }
}

/// The message id of `d`, or the permanent failure of a message without one.
fn usable_id(d: &Delivery) -> Result<uuid::Uuid, Attempt> {
    d.message_id().map_err(|reason| Attempt {
        result: Err(HandlerError::Permanent(reason)),
        handled_by: None,
    })
}

/// The whole batch in one transaction without savepoints: the inbox marks
/// of every message first (one statement on Postgres), then the handlers in
/// order, skipping the duplicates.
async fn attempt_all<H: Handler>(
    db: &Db,
    consumer: &str,
    deliveries: &[Delivery],
    handler: &H,
) -> Result<AllOrFailure, sqlx::Error> {
    // A message without a usable id is refused before anything of it is
    // written: the prefix before it can commit as it is.
    let mut ids = Vec::with_capacity(deliveries.len());
    let mut refused = None;
    for d in deliveries {
        match usable_id(d) {
            Ok(id) => ids.push(id),
            Err(r) => {
                refused = Some(r);
                break;
            }
        }
    }
    // Each message pins its version before its mark, as in `mark_and_handle`.
    let pins: Vec<Pinned> = ids.iter().map(|_| handler.pin()).collect();
    let labels: Vec<Option<String>> = pins.iter().map(|p| p.label.clone()).collect();
    let mut tx = begin_batch(db, handler).await?;
    let mut fresh = mark_all(&mut tx, consumer, &ids, &labels).await?;
    let mut results = Vec::with_capacity(deliveries.len());
    for ((d, id), pinned) in deliveries.iter().zip(&ids).zip(&pins) {
        // The first of several deliveries of one id in the batch is the one
        // that was marked; the others are duplicates.
        if !fresh.remove(id) {
            results.push(Attempt {
                result: Ok(Processed::Duplicate),
                handled_by: None,
            });
            continue;
        }
        let result = handler
            .handle_pinned(pinned, &mut tx, d)
            .await
            .map(|()| Processed::Handled);
        let handled_by = pinned.label.clone();
        if result.is_err() {
            rollback(tx).await?;
            return Ok(AllOrFailure::Failed {
                index: results.len(),
                failure: Attempt { result, handled_by },
            });
        }
        results.push(Attempt { result, handled_by });
    }
    results.extend(refused);
    commit(tx).await?;
    Ok(AllOrFailure::All(results))
}

/// Writes the inbox marks of `ids` (with each one's handler label) and
/// returns the ids that were new, so not duplicates. Postgres takes them in
/// one statement; SQLite, which is in-process, one at a time.
async fn mark_all(
    tx: &mut InboxTx,
    consumer: &str,
    ids: &[uuid::Uuid],
    labels: &[Option<String>],
) -> Result<HashSet<uuid::Uuid>, sqlx::Error> {
    let mut fresh = HashSet::with_capacity(ids.len());
    match tx {
        InboxTx::Postgres(t) => {
            let inserted: Vec<uuid::Uuid> = sqlx::query_scalar(
                "INSERT INTO inbox (consumer, message_id, handled_by)
                 SELECT $1, m.id, m.label FROM unnest($2::uuid[], $3::text[]) AS m(id, label)
                 ON CONFLICT DO NOTHING
                 RETURNING message_id",
            )
            .bind(consumer)
            .bind(ids)
            .bind(labels)
            .fetch_all(&mut **t)
            .await?;
            fresh.extend(inserted);
        }
        InboxTx::Sqlite(t) => {
            for (id, label) in ids.iter().zip(labels) {
                let n = sqlx::query(INSERT_MARK)
                    .bind(consumer)
                    .bind(id.to_string())
                    .bind(label)
                    .execute(&mut **t)
                    .await?
                    .rows_affected();
                if n > 0 {
                    fresh.insert(*id);
                }
            }
        }
    }
    Ok(fresh)
}

/// The batch with a savepoint around each message, so a failed message
/// rolls back alone and the prefix before it commits.
async fn attempt_with_savepoints<H: Handler>(
    db: &Db,
    consumer: &str,
    deliveries: &[Delivery],
    handler: &H,
) -> Result<Vec<Attempt>, sqlx::Error> {
    let mut tx = begin_batch(db, handler).await?;
    let mut results = Vec::with_capacity(deliveries.len());
    for d in deliveries {
        let message_id = match usable_id(d) {
            Ok(id) => id,
            Err(refused) => {
                results.push(refused);
                break;
            }
        };
        exec(&mut tx, "SAVEPOINT outboxd_msg").await?;
        let (handled_by, result) = mark_and_handle(&mut tx, consumer, message_id, d, handler).await;
        let failed = result.is_err();
        if failed {
            exec(&mut tx, "ROLLBACK TO SAVEPOINT outboxd_msg").await?;
        }
        exec(&mut tx, "RELEASE SAVEPOINT outboxd_msg").await?;
        results.push(Attempt { result, handled_by });
        if failed {
            break;
        }
    }
    commit(tx).await?;
    Ok(results)
}
