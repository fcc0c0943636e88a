//! Dead letters: events the relay gave up on. They stay in the outbox,
//! hold back later events of their aggregate, and wait for a person to
//! redrive them (try again from zero attempts) or discard them with a reason.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Row;

use super::like_pattern;
use crate::store::sqlite::{from_micros, micros};
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

/// Which dead events an operation applies to.
#[derive(Debug, Clone, Default)]
pub struct DeadFilter {
    pub seq: Option<i64>,
    /// `order.*`, `*` or an exact type.
    pub event_type: Option<String>,
    pub aggregate_id: Option<String>,
}

const SELECT: &str = "
SELECT o.seq, CAST(o.id AS text), o.aggregate_id, o.event_type, CAST(o.payload AS text), CAST(o.headers AS text),
       o.attempts, o.created_at, o.dead_at, coalesce(o.dead_reason, ''),
       (SELECT count(*) FROM outbox b WHERE b.aggregate_id = o.aggregate_id AND b.published_at IS NULL AND b.seq > o.seq)
  FROM outbox o
 WHERE o.dead_at IS NOT NULL AND o.published_at IS NULL
   AND ($1 IS NULL OR o.seq = $1)
   AND ($2 IS NULL OR o.event_type LIKE $2 ESCAPE '\\')
   AND ($3 IS NULL OR o.aggregate_id = $3)
 ORDER BY o.seq
 LIMIT $4";

/// Lists dead events, oldest first.
pub async fn list(db: &Db, filter: &DeadFilter, limit: i64) -> Result<Vec<DeadEvent>, sqlx::Error> {
    let ty = filter.event_type.as_deref().map(like_pattern);
    // One decoding for both databases: Postgres reads its attempts and
    // times as SQLite stores them (a bigint, microseconds since the epoch).
    let sql = match db {
        Db::Postgres(_) => SELECT
            .replace("$1 IS NULL", "$1::bigint IS NULL")
            .replace("$2 IS NULL", "$2::text IS NULL")
            .replace("$3 IS NULL", "$3::text IS NULL")
            .replace("o.attempts,", "CAST(o.attempts AS bigint),")
            .replace(
                "o.created_at, o.dead_at,",
                "CAST(extract(epoch FROM o.created_at) * 1000000 AS bigint), CAST(extract(epoch FROM o.dead_at) * 1000000 AS bigint),",
            ),
        Db::Sqlite(_) => SELECT.to_string(),
    };
    on_pool!(db, |p| {
        let rows = sqlx::query(&sql)
            .bind(filter.seq)
            .bind(&ty)
            .bind(&filter.aggregate_id)
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
                    created_at: from_micros(r.try_get(7)?),
                    dead_at: from_micros(r.try_get(8)?),
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

/// One dead event, if `seq` is dead.
pub async fn get(db: &Db, seq: i64) -> Result<Option<DeadEvent>, sqlx::Error> {
    let filter = DeadFilter {
        seq: Some(seq),
        ..DeadFilter::default()
    };
    Ok(list(db, &filter, 1).await?.into_iter().next())
}

const REDRIVE: &str = "
UPDATE outbox
   SET dead_at = NULL, dead_reason = NULL, attempts = 0, next_attempt_at = $4,
       last_error = 'redriven after: ' || coalesce(dead_reason, '')
 WHERE dead_at IS NOT NULL AND published_at IS NULL
   AND ($1 IS NULL OR seq = $1)
   AND ($2 IS NULL OR event_type LIKE $2 ESCAPE '\\')
   AND ($3 IS NULL OR aggregate_id = $3)";

/// Makes matching dead events pending again, due now, with zero attempts.
/// An empty filter redrives every dead event. Returns how many.
pub async fn redrive(db: &Db, filter: &DeadFilter, now: DateTime<Utc>) -> Result<u64, sqlx::Error> {
    let ty = filter.event_type.as_deref().map(like_pattern);
    Ok(match db {
        Db::Postgres(p) => {
            let sql = REDRIVE
                .replace("$1 IS NULL", "$1::bigint IS NULL")
                .replace("$2 IS NULL", "$2::text IS NULL")
                .replace("$3 IS NULL", "$3::text IS NULL");
            sqlx::query(&sql)
                .bind(filter.seq)
                .bind(ty)
                .bind(&filter.aggregate_id)
                .bind(now)
                .execute(p)
                .await?
        }
        .rows_affected(),
        Db::Sqlite(p) => sqlx::query(REDRIVE)
            .bind(filter.seq)
            .bind(ty)
            .bind(&filter.aggregate_id)
            .bind(micros(now))
            .execute(p)
            .await?
            .rows_affected(),
    })
}

#[derive(Debug, thiserror::Error)]
pub enum DiscardError {
    #[error("a discard needs a reason, for the audit trail")]
    NoReason,
    #[error("outbox row {0} is not a dead event; only dead events can be discarded")]
    NotDead(i64),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// Finishes a dead event without publishing it, recording why. Its
/// aggregate's later events then flow again.
pub async fn discard(
    db: &Db,
    seq: i64,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<(), DiscardError> {
    if reason.trim().is_empty() {
        return Err(DiscardError::NoReason);
    }
    let sql = "UPDATE outbox SET published_at = $3, discarded_at = $3, discard_reason = $2
                WHERE seq = $1 AND dead_at IS NOT NULL AND published_at IS NULL";
    let n = match db {
        Db::Postgres(p) => sqlx::query(sql)
            .bind(seq)
            .bind(reason)
            .bind(now)
            .execute(p)
            .await?
            .rows_affected(),
        Db::Sqlite(p) => sqlx::query(sql)
            .bind(seq)
            .bind(reason)
            .bind(micros(now))
            .execute(p)
            .await?
            .rows_affected(),
    };
    if n == 0 {
        return Err(DiscardError::NotDead(seq));
    }
    Ok(())
}
