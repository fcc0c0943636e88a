//! One message through the inbox: begin, mark, handle, commit.

use std::future::Future;

use sqlx::{Postgres, Sqlite, Transaction};

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
}

impl From<sqlx::Error> for HandlerError {
    fn from(e: sqlx::Error) -> Self {
        HandlerError::Retryable(format!("database error in handler: {e}"))
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
    let message_id = delivery.message_id().map_err(HandlerError::Permanent)?;
    let mut tx = match db {
        Db::Postgres(p) => InboxTx::Postgres(p.begin().await?),
        Db::Sqlite(p) => InboxTx::Sqlite(p.begin().await?),
    };
    handler.begin(&mut tx).await?;
    let sql = "INSERT INTO inbox (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING";
    let inserted = match &mut tx {
        InboxTx::Postgres(t) => sqlx::query(sql)
            .bind(consumer)
            .bind(message_id)
            .execute(&mut **t)
            .await?
            .rows_affected(),
        InboxTx::Sqlite(t) => sqlx::query(sql)
            .bind(consumer)
            .bind(message_id.to_string())
            .execute(&mut **t)
            .await?
            .rows_affected(),
    };
    if inserted == 0 {
        rollback(tx).await?;
        return Ok(Processed::Duplicate);
    }
    if let Err(e) = handler.handle(&mut tx, delivery).await {
        rollback(tx).await?;
        return Err(e);
    }
    match tx {
        InboxTx::Postgres(t) => t.commit().await?,
        InboxTx::Sqlite(t) => t.commit().await?,
    }
    Ok(Processed::Handled)
}

async fn rollback(tx: InboxTx) -> Result<(), sqlx::Error> {
    match tx {
        InboxTx::Postgres(t) => t.rollback().await,
        InboxTx::Sqlite(t) => t.rollback().await,
    }
}

async fn exec(tx: &mut InboxTx, sql: &str) -> Result<(), sqlx::Error> {
    match tx {
        InboxTx::Postgres(t) => sqlx::query(sql).execute(&mut **t).await.map(|_| ()),
        InboxTx::Sqlite(t) => sqlx::query(sql).execute(&mut **t).await.map(|_| ()),
    }
}

/// Handles several messages of one partition in one transaction, each in
/// its own savepoint, so commit latency is paid once per batch.
///
/// Messages are handled in order until the first failure: the failed
/// message rolls back to its savepoint (its inbox mark and writes vanish),
/// the messages after it are not attempted (they must wait, in order), and
/// everything before it commits. The result has one entry per attempted
/// message; the offset may advance past the successful prefix only.
pub async fn process_batch<H: Handler>(
    db: &Db,
    consumer: &str,
    deliveries: &[Delivery],
    handler: &H,
) -> Result<Vec<Result<Processed, HandlerError>>, sqlx::Error> {
    let mut tx = match db {
        Db::Postgres(p) => InboxTx::Postgres(p.begin().await?),
        Db::Sqlite(p) => InboxTx::Sqlite(p.begin().await?),
    };
    handler.begin(&mut tx).await?;
    let mut results = Vec::with_capacity(deliveries.len());
    for d in deliveries {
        let message_id = match d.message_id() {
            Ok(id) => id,
            Err(reason) => {
                results.push(Err(HandlerError::Permanent(reason)));
                break;
            }
        };
        exec(&mut tx, "SAVEPOINT outboxd_msg").await?;
        let sql = "INSERT INTO inbox (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING";
        let inserted = match &mut tx {
            InboxTx::Postgres(t) => sqlx::query(sql)
                .bind(consumer)
                .bind(message_id)
                .execute(&mut **t)
                .await?
                .rows_affected(),
            InboxTx::Sqlite(t) => sqlx::query(sql)
                .bind(consumer)
                .bind(message_id.to_string())
                .execute(&mut **t)
                .await?
                .rows_affected(),
        };
        if inserted == 0 {
            exec(&mut tx, "RELEASE SAVEPOINT outboxd_msg").await?;
            results.push(Ok(Processed::Duplicate));
            continue;
        }
        match handler.handle(&mut tx, d).await {
            Ok(()) => {
                exec(&mut tx, "RELEASE SAVEPOINT outboxd_msg").await?;
                results.push(Ok(Processed::Handled));
            }
            Err(e) => {
                exec(&mut tx, "ROLLBACK TO SAVEPOINT outboxd_msg").await?;
                exec(&mut tx, "RELEASE SAVEPOINT outboxd_msg").await?;
                results.push(Err(e));
                break;
            }
        }
    }
    match tx {
        InboxTx::Postgres(t) => t.commit().await?,
        InboxTx::Sqlite(t) => t.commit().await?,
    }
    Ok(results)
}
