//! Group commit for the embedded transport: the messages that relay workers
//! publish at the same moment (a batch is published concurrently) are
//! written in one transaction, instead of one transaction, one lock and one
//! WAL flush each. On SQLite, where every write queues for the one write
//! lock, this is also what keeps a batch from queueing behind itself.
//!
//! Callers queue their message and wait for its result. Whoever finds no
//! writer running starts one, as a task of its own, so a caller that gives
//! up (the relay's publish timeout) never leaves the queue without a writer.
//! The writer takes everything queued, writes it, answers each caller, and
//! stops when the queue is empty; the queue and the "writer running" flag
//! share one lock, so a message is never queued behind a writer that has
//! already decided to stop.
//!
//! A group that the database refuses for a message-specific reason (a
//! permanent error) is written again one message at a time, so one bad
//! message fails alone.

use std::sync::{Arc, Mutex};

use sqlx::{PgPool, SqlitePool};
use tokio::sync::oneshot;

use super::{OutgoingMessage, PublishError};
use crate::store::Db;

type Reply = oneshot::Sender<Result<(), PublishError>>;

/// One message as it will be stored.
pub(super) struct GroupRow {
    pub topic: String,
    pub partition: i32,
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
    pub headers: String,
    pub message_id: uuid::Uuid,
}

impl GroupRow {
    pub(super) fn new(msg: OutgoingMessage, partition: i32) -> Self {
        let headers = super::embedded::headers_json(&msg.headers);
        Self {
            topic: msg.topic,
            partition,
            key: msg.key,
            payload: msg.payload,
            headers,
            message_id: msg.message_id,
        }
    }
}

#[derive(Default)]
struct Queue {
    rows: Vec<(GroupRow, Reply)>,
    writing: bool,
}

/// The shared queue of one publisher (cheap to clone).
#[derive(Clone, Default)]
pub(super) struct GroupCommit {
    queue: Arc<Mutex<Queue>>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").finish_non_exhaustive()
    }
}

fn unavailable() -> PublishError {
    PublishError::Retryable("embedded transport: the group writer stopped".into())
}

impl GroupCommit {
    /// Writes `row` together with whatever else is being published now, and
    /// resolves once it is committed (or failed).
    pub(super) async fn publish(&self, db: &Db, row: GroupRow) -> Result<(), PublishError> {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut q = self.queue.lock().map_err(|_| unavailable())?;
            q.rows.push((row, reply));
            !std::mem::replace(&mut q.writing, true)
        };
        if start {
            let (queue, db) = (self.queue.clone(), db.clone());
            tokio::spawn(async move { write_until_empty(&queue, &db).await });
        }
        answer.await.unwrap_or_else(|_| Err(unavailable()))
    }
}

async fn write_until_empty(queue: &Mutex<Queue>, db: &Db) {
    // Let the rest of a concurrently published batch join the first group.
    tokio::task::yield_now().await;
    loop {
        let group = match queue.lock() {
            Ok(mut q) if q.rows.is_empty() => {
                q.writing = false;
                return;
            }
            Ok(mut q) => std::mem::take(&mut q.rows),
            Err(_) => return,
        };
        let (rows, replies): (Vec<GroupRow>, Vec<Reply>) = group.into_iter().unzip();
        match write(db, &rows).await {
            Err(e) if e.is_permanent() && rows.len() > 1 => {
                for (row, reply) in rows.iter().zip(replies) {
                    let _ = reply.send(write(db, std::slice::from_ref(row)).await);
                }
            }
            result => {
                for reply in replies {
                    let _ = reply.send(result.clone());
                }
            }
        }
    }
}

async fn write(db: &Db, rows: &[GroupRow]) -> Result<(), PublishError> {
    match db {
        Db::Postgres(pool) => write_pg(pool, rows).await,
        Db::Sqlite(pool) => write_sqlite(pool, rows).await,
    }
}

/// One transaction of plain INSERTs: SQLite has one writer at a time, so
/// the `offset` (an AUTOINCREMENT key) follows commit order by itself.
async fn write_sqlite(pool: &SqlitePool, rows: &[GroupRow]) -> Result<(), PublishError> {
    let mut tx = pool.begin().await.map_err(super::embedded::db_error)?;
    for r in rows {
        sqlx::query(
            "INSERT INTO transport_messages (topic, partition, message_key, payload, headers, message_id)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&r.topic)
        .bind(r.partition)
        .bind(&r.key)
        .bind(&r.payload)
        .bind(&r.headers)
        .bind(r.message_id.to_string())
        .execute(&mut *tx)
        .await
        .map_err(super::embedded::db_error)?;
    }
    tx.commit().await.map_err(super::embedded::db_error)
}

/// One transaction: the partitions' advisory locks in a fixed order (so two
/// writers cannot deadlock), then every row in one INSERT. Offsets are
/// identity values drawn at insert time; holding each partition's lock
/// until commit makes offset order commit order within a partition, so a
/// consumer's cursor never skips a late commit.
async fn write_pg(pool: &PgPool, rows: &[GroupRow]) -> Result<(), PublishError> {
    let mut tx = pool.begin().await.map_err(super::embedded::db_error)?;
    let mut partitions: Vec<(&str, i32)> = rows
        .iter()
        .map(|r| (r.topic.as_str(), r.partition))
        .collect();
    partitions.sort_unstable();
    partitions.dedup();
    for (topic, partition) in partitions {
        sqlx::query(crate::store::locks::PARTITION_LOCK)
            .bind(topic)
            .bind(i64::from(partition))
            .execute(&mut *tx)
            .await
            .map_err(super::embedded::db_error)?;
    }
    // The insert and the wake-up of waiting consumers (delivered at commit)
    // in one statement.
    sqlx::query(
        "WITH stored AS (
           INSERT INTO transport_messages (topic, partition, message_key, payload, headers, message_id)
           SELECT t, p, k, v, h::jsonb, m
             FROM unnest($1::text[], $2::int[], $3::bytea[], $4::bytea[], $5::text[], $6::uuid[])
               AS x(t, p, k, v, h, m)
           RETURNING 1)
         SELECT pg_notify($7, '') WHERE EXISTS (SELECT 1 FROM stored)",
    )
    .bind(rows.iter().map(|r| r.topic.as_str()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.partition).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.key.as_slice()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.payload.as_slice()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.headers.as_str()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.message_id).collect::<Vec<_>>())
    .bind(super::embedded::NOTIFY_CHANNEL)
    .execute(&mut *tx)
    .await
    .map_err(super::embedded::db_error)?;
    tx.commit().await.map_err(super::embedded::db_error)
}
