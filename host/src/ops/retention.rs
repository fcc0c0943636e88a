//! Retention: both tables grow without bound otherwise. Deletes run in
//! small batches in a loop, so no statement holds locks for long.
//! Dead rows are never deleted automatically.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::store::Db;
use crate::store::sqlite::micros;

/// `[retention]`, a config section, in `outboxd-core`.
pub use outboxd_core::config::RetentionConfig;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CleanupReport {
    pub outbox_deleted: u64,
    pub payloads_purged: u64,
    pub inbox_deleted: u64,
    pub transport_deleted: u64,
    pub statements: u64,
}

fn days_before(now: DateTime<Utc>, days: f64) -> DateTime<Utc> {
    now - chrono::Duration::milliseconds((days * 86_400_000.0) as i64)
}

/// Runs every retention rule to completion, batch by batch.
pub async fn cleanup(
    db: &Db,
    cfg: &RetentionConfig,
    now: DateTime<Utc>,
) -> Result<CleanupReport, sqlx::Error> {
    let mut report = CleanupReport::default();
    let published_cutoff = days_before(now, cfg.published_days);
    let inbox_cutoff = days_before(now, cfg.inbox_days);
    if let Some(days) = cfg.purge_payload_days {
        let cutoff = days_before(now, days);
        report.payloads_purged = batched(
            db,
            &mut report.statements,
            PURGE_PG,
            PURGE_SQLITE,
            cutoff,
            now,
            cfg.batch_size,
        )
        .await?;
    }
    report.outbox_deleted = batched(
        db,
        &mut report.statements,
        DELETE_OUTBOX_PG,
        DELETE_OUTBOX_SQLITE,
        published_cutoff,
        now,
        cfg.batch_size,
    )
    .await?;
    report.inbox_deleted = batched(
        db,
        &mut report.statements,
        DELETE_INBOX_PG,
        DELETE_INBOX_SQLITE,
        inbox_cutoff,
        now,
        cfg.batch_size,
    )
    .await?;
    report.transport_deleted = batched(
        db,
        &mut report.statements,
        DELETE_TRANSPORT_PG,
        DELETE_TRANSPORT_SQLITE,
        published_cutoff,
        now,
        cfg.batch_size,
    )
    .await?;
    Ok(report)
}

async fn batched(
    db: &Db,
    statements: &mut u64,
    pg: &str,
    sqlite: &str,
    cutoff: DateTime<Utc>,
    now: DateTime<Utc>,
    batch: i64,
) -> Result<u64, sqlx::Error> {
    let mut total = 0;
    loop {
        let n = match db {
            Db::Postgres(p) => sqlx::query(pg)
                .bind(cutoff)
                .bind(batch)
                .bind(now)
                .execute(p)
                .await?
                .rows_affected(),
            Db::Sqlite(p) => sqlx::query(sqlite)
                .bind(micros(cutoff))
                .bind(batch)
                .bind(micros(now))
                .execute(p)
                .await?
                .rows_affected(),
        };
        *statements += 1;
        total += n;
        if n == 0 {
            return Ok(total);
        }
    }
}

const PURGE_PG: &str = "UPDATE outbox SET payload = 'null'::jsonb, payload_purged_at = $3
 WHERE seq IN (SELECT seq FROM outbox WHERE published_at < $1 AND payload_purged_at IS NULL ORDER BY seq LIMIT $2)";
const PURGE_SQLITE: &str = "UPDATE outbox SET payload = 'null', payload_purged_at = $3
 WHERE seq IN (SELECT seq FROM outbox WHERE published_at < $1 AND payload_purged_at IS NULL ORDER BY seq LIMIT $2)";

// Published (or discarded) rows only: dead rows have published_at NULL.
const DELETE_OUTBOX_PG: &str = "DELETE FROM outbox
 WHERE seq IN (SELECT seq FROM outbox WHERE published_at < $1 ORDER BY seq LIMIT $2) AND $3::timestamptz IS NOT NULL";
const DELETE_OUTBOX_SQLITE: &str = "DELETE FROM outbox
 WHERE seq IN (SELECT seq FROM outbox WHERE published_at < $1 ORDER BY seq LIMIT $2) AND $3 IS NOT NULL";

const DELETE_INBOX_PG: &str = "DELETE FROM inbox
 WHERE (consumer, message_id) IN (SELECT consumer, message_id FROM inbox WHERE processed_at < $1 LIMIT $2) AND $3::timestamptz IS NOT NULL";
const DELETE_INBOX_SQLITE: &str = "DELETE FROM inbox
 WHERE rowid IN (SELECT rowid FROM inbox WHERE processed_at < $1 LIMIT $2) AND $3 IS NOT NULL";

// Embedded transport: only messages every group has consumed, so a slow
// consumer never loses a message to retention.
const DELETE_TRANSPORT_PG: &str = "DELETE FROM transport_messages
 WHERE \"offset\" IN (
   SELECT m.\"offset\" FROM transport_messages m
    WHERE m.published_at < $1
      AND m.\"offset\" <= (SELECT coalesce(min(c.last_offset), 0) FROM transport_cursors c
                            WHERE c.topic = m.topic AND c.partition = m.partition)
    ORDER BY m.\"offset\" LIMIT $2) AND $3::timestamptz IS NOT NULL";
const DELETE_TRANSPORT_SQLITE: &str = "DELETE FROM transport_messages
 WHERE \"offset\" IN (
   SELECT m.\"offset\" FROM transport_messages m
    WHERE m.published_at < $1
      AND m.\"offset\" <= (SELECT coalesce(min(c.last_offset), 0) FROM transport_cursors c
                            WHERE c.topic = m.topic AND c.partition = m.partition)
    ORDER BY m.\"offset\" LIMIT $2) AND $3 IS NOT NULL";
