//! What was given up on, as stored: dead events (outbox rows the relay
//! stopped retrying, listed, redriven and discarded by `ops/dead.rs`) and
//! consumer dead letters (`consumer_dead_letters`, a message a consumer
//! failed permanently or too often, written by the consumer's runner).
//! Each statement is one text for both databases, with the casts in the
//! SQL, except where SQLite lacks Postgres's column types.

use chrono::{DateTime, Utc};
use outboxd_core::event::{EventId, OutboxEvent, parse_headers};
use serde::Serialize;
use sqlx::Row;

use crate::store::backend::stored_time::StoredTime;
use crate::store::{Db, on_pool};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadEvent {
    pub seq: i64,
    pub id: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub payload: serde_json::Value,
    pub headers: serde_json::Value,
    pub attempts: i32,
    pub created_at: DateTime<Utc>,
    pub dead_at: DateTime<Utc>,
    pub dead_reason: String,
    /// Later events of the same aggregate waiting behind this one.
    pub blocking: i64,
}

/// Which dead events a statement applies to; `None` matches any.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeadSelection<'a> {
    pub seq: Option<i64>,
    /// A LIKE pattern with `\` as its escape.
    pub type_like: Option<&'a str>,
    pub aggregate_id: Option<&'a str>,
}

/// The selection's conditions on `outbox` (aliased `o`), over `$1` to `$3`.
const SELECTED: &str = "o.dead_at IS NOT NULL AND o.published_at IS NULL
   AND (CAST($1 AS bigint) IS NULL OR o.seq = $1)
   AND (CAST($2 AS text) IS NULL OR o.event_type LIKE $2 ESCAPE '\\')
   AND (CAST($3 AS text) IS NULL OR o.aggregate_id = $3)";

/// Lists the selected dead events, oldest first, at most `limit`.
pub async fn list_dead_events(
    db: &Db,
    selection: DeadSelection<'_>,
    limit: i64,
) -> Result<Vec<DeadEvent>, sqlx::Error> {
    // One decoding for both databases: the attempts as a bigint and the
    // times as SQLite stores them (microseconds since the epoch).
    let sql = format!(
        "SELECT o.seq, CAST(o.id AS text), o.aggregate_id, o.event_type, CAST(o.payload AS text), CAST(o.headers AS text),
                CAST(o.attempts AS bigint), {created}, {dead}, coalesce(o.dead_reason, ''),
                (SELECT count(*) FROM outbox b WHERE b.aggregate_id = o.aggregate_id AND b.published_at IS NULL AND b.seq > o.seq)
           FROM outbox o
          WHERE {SELECTED}
          ORDER BY o.seq
          LIMIT $4",
        created = db.epoch_micros("o.created_at"),
        dead = db.epoch_micros("o.dead_at"),
    );
    on_pool!(db, |p| {
        let rows = sqlx::query(&sql)
            .bind(selection.seq)
            .bind(selection.type_like)
            .bind(selection.aggregate_id)
            .bind(limit)
            .fetch_all(p)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(DeadEvent {
                    seq: r.try_get(0)?,
                    id: r.try_get(1)?,
                    aggregate_id: r.try_get(2)?,
                    event_type: r.try_get(3)?,
                    payload: json(r.try_get::<String, _>(4)?),
                    headers: json(r.try_get::<String, _>(5)?),
                    attempts: r.try_get::<i64, _>(6)? as i32,
                    created_at: crate::store::outbox::sqlite_claim::from_micros(r.try_get(7)?),
                    dead_at: crate::store::outbox::sqlite_claim::from_micros(r.try_get(8)?),
                    dead_reason: r.try_get(9)?,
                    blocking: r.try_get(10)?,
                })
            })
            .collect()
    })
}

fn json(text: String) -> serde_json::Value {
    serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))
}

/// Makes the selected dead events pending again, due at `now`, with zero
/// attempts; the reason they died is kept in `last_error`. `with`
/// (`NAME@VERSION`) is the plugin version the relay runs them through
/// instead of the active one; `None` clears an earlier choice. Returns how
/// many.
pub async fn redrive_dead_events(
    db: &Db,
    selection: DeadSelection<'_>,
    with: Option<&str>,
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let sql = format!(
        "UPDATE outbox AS o
            SET dead_at = NULL, dead_reason = NULL, attempts = 0, next_attempt_at = $4,
                last_error = 'redriven after: ' || coalesce(o.dead_reason, ''),
                redrive_with = $5
          WHERE {SELECTED}"
    );
    Ok(on_pool!(db, |p| sqlx::query(&sql)
        .bind(selection.seq)
        .bind(selection.type_like)
        .bind(selection.aggregate_id)
        .bind(StoredTime(now))
        .bind(with)
        .execute(p)
        .await?
        .rows_affected()))
}

/// The event types among the selected dead events, each with its oldest
/// dead event's seq, by that seq.
pub async fn dead_event_types(
    db: &Db,
    selection: DeadSelection<'_>,
) -> Result<Vec<(i64, String)>, sqlx::Error> {
    let sql = format!(
        "SELECT min(o.seq), o.event_type FROM outbox o WHERE {SELECTED}
          GROUP BY o.event_type ORDER BY min(o.seq)"
    );
    on_pool!(db, |p| {
        let rows = sqlx::query(&sql)
            .bind(selection.seq)
            .bind(selection.type_like)
            .bind(selection.aggregate_id)
            .fetch_all(p)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    })
}

/// The selected dead events, oldest first and at most `limit`, as the relay
/// would claim them once redriven (the payload as stored, zero attempts,
/// no version chosen): what a dry run of a redrive feeds the plugins.
pub async fn dead_events_as_claimed(
    db: &Db,
    selection: DeadSelection<'_>,
    limit: i64,
) -> Result<Vec<OutboxEvent>, sqlx::Error> {
    let sql = format!(
        "SELECT o.seq, CAST(o.id AS text), o.aggregate_id, o.event_type, CAST(o.payload AS text),
                CAST(o.headers AS text), {created}
           FROM outbox o
          WHERE {SELECTED}
          ORDER BY o.seq
          LIMIT $4",
        created = db.epoch_micros("o.created_at"),
    );
    on_pool!(db, |p| {
        let rows = sqlx::query(&sql)
            .bind(selection.seq)
            .bind(selection.type_like)
            .bind(selection.aggregate_id)
            .bind(limit)
            .fetch_all(p)
            .await?;
        rows.iter()
            .map(|r| {
                let seq: i64 = r.try_get(0)?;
                let id: String = r.try_get(1)?;
                let id = uuid::Uuid::parse_str(&id).map_err(|e| {
                    sqlx::Error::Decode(
                        format!("outbox row {seq}: id `{id}` is not a uuid ({e})").into(),
                    )
                })?;
                let headers =
                    parse_headers(seq, &r.try_get::<String, _>(5)?).unwrap_or_else(|problem| {
                        std::iter::once(("outboxd-header-error".to_string(), problem)).collect()
                    });
                Ok(OutboxEvent {
                    seq,
                    id: EventId(id),
                    aggregate_id: r.try_get(2)?,
                    event_type: r.try_get(3)?,
                    payload: r.try_get(4)?,
                    headers,
                    created_at: crate::store::outbox::sqlite_claim::from_micros(r.try_get(6)?),
                    attempts: 0,
                    redrive_with: None,
                })
            })
            .collect()
    })
}

/// Finishes dead event `seq` without publishing it, recording `reason`;
/// false when `seq` is not a dead event.
pub async fn discard_dead_event(
    db: &Db,
    seq: i64,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let sql = "UPDATE outbox SET published_at = $3, discarded_at = $3, discard_reason = $2
                WHERE seq = $1 AND dead_at IS NOT NULL AND published_at IS NULL";
    let n = on_pool!(db, |p| sqlx::query(sql)
        .bind(seq)
        .bind(reason)
        .bind(StoredTime(now))
        .execute(p)
        .await?
        .rows_affected());
    Ok(n > 0)
}
