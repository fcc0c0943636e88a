//! Retention's statements: each deletes (or purges) one small batch of what
//! is older than a cutoff, so no statement holds locks for long;
//! `ops/retention.rs` runs them until nothing is left. None of them touches
//! a dead row.

use chrono::{DateTime, Utc};

use crate::store::backend::stored_time::StoredTime;
use crate::store::{Db, on_pool};

/// What one retention statement removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    /// The payloads of events published before the cutoff (the row stays).
    Payloads,
    /// Events published (or discarded) before the cutoff. Dead rows have
    /// `published_at` NULL, so they never match.
    PublishedEvents,
    /// Inbox marks processed before the cutoff.
    InboxMarks,
    /// Embedded-transport messages published before the cutoff that every
    /// consumer group's cursor has passed, so a slow consumer never loses
    /// a message to retention.
    TransportMessages,
}

const PURGE_PAYLOADS: &str = "UPDATE outbox SET payload = 'null', payload_purged_at = $3
 WHERE seq IN (SELECT seq FROM outbox WHERE published_at < $1 AND payload_purged_at IS NULL ORDER BY seq LIMIT $2)";

const DELETE_OUTBOX: &str = "DELETE FROM outbox
 WHERE seq IN (SELECT seq FROM outbox WHERE published_at < $1 ORDER BY seq LIMIT $2)";

// Postgres has no rowid; SQLite finds a row fastest by it.
const DELETE_INBOX_PG: &str = "DELETE FROM inbox
 WHERE (consumer, message_id) IN (SELECT consumer, message_id FROM inbox WHERE processed_at < $1 LIMIT $2)";
const DELETE_INBOX_SQLITE: &str = "DELETE FROM inbox
 WHERE rowid IN (SELECT rowid FROM inbox WHERE processed_at < $1 LIMIT $2)";

const DELETE_TRANSPORT: &str = "DELETE FROM transport_messages
 WHERE \"offset\" IN (
   SELECT m.\"offset\" FROM transport_messages m
    WHERE m.published_at < $1
      AND m.\"offset\" <= (SELECT coalesce(min(c.last_offset), 0) FROM transport_cursors c
                            WHERE c.topic = m.topic AND c.partition = m.partition)
    ORDER BY m.\"offset\" LIMIT $2)";

/// Runs `sweep` once over at most `batch` rows older than `cutoff` (a purge
/// stamps them with `now`); returns how many rows it changed, 0 when none
/// was left.
pub async fn sweep_batch(
    db: &Db,
    sweep: Sweep,
    cutoff: DateTime<Utc>,
    now: DateTime<Utc>,
    batch: i64,
) -> Result<u64, sqlx::Error> {
    let sql = match (sweep, db) {
        (Sweep::Payloads, _) => PURGE_PAYLOADS,
        (Sweep::PublishedEvents, _) => DELETE_OUTBOX,
        (Sweep::InboxMarks, Db::Postgres(_)) => DELETE_INBOX_PG,
        (Sweep::InboxMarks, Db::Sqlite(_)) => DELETE_INBOX_SQLITE,
        (Sweep::TransportMessages, _) => DELETE_TRANSPORT,
    };
    Ok(on_pool!(db, |p| {
        let query = sqlx::query(sql).bind(StoredTime(cutoff)).bind(batch);
        let query = match sweep {
            Sweep::Payloads => query.bind(StoredTime(now)),
            _ => query,
        };
        query.execute(p).await?.rows_affected()
    }))
}
