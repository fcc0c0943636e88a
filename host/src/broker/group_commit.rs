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

use tokio::sync::oneshot;

use super::PublishError;
use crate::store::Db;
use crate::store::transport::{TransportMessage, store_messages};

type Reply = oneshot::Sender<Result<(), PublishError>>;

#[derive(Default)]
struct Queue {
    rows: Vec<(TransportMessage, Reply)>,
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
    pub(super) async fn publish(&self, db: &Db, row: TransportMessage) -> Result<(), PublishError> {
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
        let (rows, replies): (Vec<TransportMessage>, Vec<Reply>) = group.into_iter().unzip();
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

async fn write(db: &Db, rows: &[TransportMessage]) -> Result<(), PublishError> {
    store_messages(db, rows).await.map_err(db_error)
}

fn db_error(e: sqlx::Error) -> PublishError {
    // A database that is down is worth retrying; a constraint violation is not.
    match &e {
        sqlx::Error::Database(d) if d.is_check_violation() || d.is_foreign_key_violation() => {
            PublishError::Permanent(format!("embedded transport rejected the message: {e}"))
        }
        _ => PublishError::Retryable(format!("embedded transport: {e}")),
    }
}
