//! Several messages of one partition in one transaction: the inbox marks
//! of the whole batch written up front (one statement on Postgres) and the
//! handlers run without savepoints; on a failure, that transaction is rolled
//! back and the prefix before the failed message reruns with a savepoint
//! each. [`process_batch`] and [`attempt_batch`] are re-exported from
//! [`super::inbox`], where one message at a time lives.

use super::inbox::Attempt;
use super::inbox::Handler;
use super::inbox::HandlerError;
use super::inbox::Pinned;
use super::inbox::Processed;
use super::inbox::handle_traced;
use super::inbox::mark_and_handle;
use crate::message::Delivery;
use crate::store::Db;
use crate::store::InboxTx;

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
    let mut tx = InboxTx::begin(db).await?;
    handler.begin(&mut tx).await?;
    Ok(tx)
}

async fn commit<H: Handler>(mut tx: InboxTx, handler: &H) -> Result<(), sqlx::Error> {
    handler.before_commit(&mut tx).await?;
    tx.commit().await
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
    let marks = spans(&deliveries[..ids.len()], "inbox.mark", consumer);
    let mut fresh = tx.mark_all(consumer, &ids, &labels).await?;
    drop(marks);
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
        let result = handle_traced(handler, pinned, &mut tx, d, consumer)
            .await
            .map(|()| Processed::Handled);
        let handled_by = pinned.label.clone();
        if result.is_err() {
            tx.rollback().await?;
            return Ok(AllOrFailure::Failed {
                index: results.len(),
                failure: Attempt { result, handled_by },
            });
        }
        results.push(Attempt { result, handled_by });
    }
    results.extend(refused);
    let commits = spans(&deliveries[..ids.len()], "commit", consumer);
    commit(tx, handler).await?;
    drop(commits);
    Ok(AllOrFailure::All(results))
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
        tx.savepoint("outboxd_msg").await?;
        let (handled_by, result) = mark_and_handle(&mut tx, consumer, message_id, d, handler).await;
        let failed = result.is_err();
        if failed {
            tx.rollback_to("outboxd_msg").await?;
        }
        tx.release("outboxd_msg").await?;
        results.push(Attempt { result, handled_by });
        if failed {
            break;
        }
    }
    let commits = spans(&deliveries[..results.len()], "commit", consumer);
    commit(tx, handler).await?;
    drop(commits);
    Ok(results)
}

/// One span per message for a step the batch takes for all of them at once.
fn spans(
    deliveries: &[Delivery],
    name: &'static str,
    consumer: &str,
) -> Vec<crate::telemetry::Span> {
    if !crate::telemetry::enabled() {
        return Vec::new();
    }
    deliveries
        .iter()
        .map(|d| crate::telemetry::for_delivery(d, name, consumer))
        .collect()
}
