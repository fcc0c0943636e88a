//! The audit of consumer plugins' outbound HTTP requests, `outbound_calls`
//! (migration 0014): the intent, committed on its own before a request is
//! sent, and the outcome, written in the message's inbox transaction.
//!
//! On SQLite the table lives in a sidecar file attached to every host
//! connection as schema `outbound` (see migrations/sqlite/0014): the inbox
//! transaction holds the main file's write lock while the plugin runs, and
//! the intent must commit before that transaction ends.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Row;

use crate::store::{Db, InboxTx, on_pool};

/// How a request ended, for its intent row `id`.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub id: String,
    pub status: Option<u16>,
    pub error: Option<String>,
    pub duration: std::time::Duration,
}

/// What is known of a request before it is sent.
#[derive(Debug)]
pub struct Intent<'a> {
    pub message_id: &'a str,
    pub consumer: &'a str,
    pub plugin: &'a str,
    pub method: &'a str,
    pub scheme: &'a str,
    pub host: &'a str,
    pub port: u16,
    pub path: &'a str,
}

const INSERT_INTENT: &str = "INSERT INTO outbound_calls
    (id, message_id, consumer, plugin, idempotency_key, method, scheme, host, port, path, started_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";

const UPDATE_OUTCOME: &str = "UPDATE outbound_calls
    SET status = $2, error = $3, duration_ms = $4, completed_at = $5
    WHERE id = $1";

/// Commits the intent row in its own transaction (autocommit) and returns
/// its id.
pub async fn write_intent(db: &Db, i: &Intent<'_>) -> Result<String, sqlx::Error> {
    let id = uuid::Uuid::new_v4().to_string();
    let now = chrono::Utc::now();
    crate::store::on_pool!(db, |pool| {
        sqlx::query(INSERT_INTENT)
            .bind(&id)
            .bind(i.message_id)
            .bind(i.consumer)
            .bind(i.plugin)
            .bind(i.message_id)
            .bind(i.method)
            .bind(i.scheme)
            .bind(i.host)
            .bind(i32::from(i.port))
            .bind(i.path)
            .bind(now)
            .execute(pool)
            .await
            .map(|_| ())?
    });
    Ok(id)
}

/// Writes `outcomes` in `tx` (the inbox transaction), as the host.
pub async fn write_outcomes(tx: &mut InboxTx, outcomes: &[Outcome]) -> Result<(), sqlx::Error> {
    if outcomes.is_empty() {
        return Ok(());
    }
    tx.as_host().await?;
    for o in outcomes {
        let id = &o.id;
        let status = o.status.map(i32::from);
        let error = o.error.as_deref();
        let ms = o.duration.as_millis() as i64;
        let now = chrono::Utc::now();
        match tx {
            InboxTx::Postgres(t) => sqlx::query(UPDATE_OUTCOME)
                .bind(id)
                .bind(status)
                .bind(error)
                .bind(ms)
                .bind(now)
                .execute(&mut **t)
                .await
                .map(|_| ())?,
            InboxTx::Sqlite(t) => sqlx::query(UPDATE_OUTCOME)
                .bind(id)
                .bind(status)
                .bind(error)
                .bind(ms)
                .bind(now)
                .execute(&mut **t)
                .await
                .map(|_| ())?,
        }
    }
    Ok(())
}

/// The same outcomes in a short transaction of their own: for a message
/// whose inbox transaction was rolled back, so the evidence stays accurate.
pub async fn write_outcomes_alone(db: &Db, outcomes: &[Outcome]) -> Result<(), sqlx::Error> {
    if outcomes.is_empty() {
        return Ok(());
    }
    let mut tx = InboxTx::begin(db).await?;
    write_outcomes(&mut tx, outcomes).await?;
    tx.commit().await
}

/// One request the host sent for a plugin.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct OutboundCall {
    pub id: String,
    pub message_id: String,
    pub consumer: String,
    /// NAME@VERSION.
    pub plugin: String,
    pub method: String,
    /// `scheme://host:port/path` (no query string is stored).
    pub url: String,
    pub started_at: DateTime<Utc>,
    /// None with no error: no outcome recorded.
    pub status: Option<i64>,
    pub error: Option<String>,
    pub duration_ms: Option<i64>,
    pub completed_at: Option<DateTime<Utc>>,
}

impl OutboundCall {
    /// The request left and no committed transaction recorded its answer.
    pub fn without_outcome(&self) -> bool {
        self.status.is_none() && self.error.is_none()
    }
}

/// A call with no outcome, as SQL (both databases).
const NO_OUTCOME: &str = "status IS NULL AND error IS NULL";
/// One request's target, as SQL: what "the same request" means.
const TARGET: &str =
    "method || ' ' || scheme || '://' || host || ':' || CAST(port AS text) || path";

/// The calls of the keys selected (by `key`, `message_id`, only the
/// unresolved ones, at most `limit` keys, the oldest first), each with its
/// key, in key order. Times are a
/// `timestamptz` on Postgres and RFC 3339 text on SQLite (which sorts as
/// time does); sqlx decodes both.
pub async fn calls_by_key(
    db: &Db,
    key: Option<&str>,
    message_id: Option<&str>,
    unresolved: bool,
    limit: i64,
) -> Result<Vec<(String, OutboundCall)>, sqlx::Error> {
    let having = if unresolved {
        format!(
            "HAVING sum(CASE WHEN {NO_OUTCOME} THEN 1 ELSE 0 END) > 0
                 OR count(*) > count(DISTINCT {TARGET})"
        )
    } else {
        String::new()
    };
    let sql = format!(
        "SELECT id, message_id, consumer, plugin, method, scheme, host, CAST(port AS bigint), path,
                started_at, CAST(status AS bigint), error, CAST(duration_ms AS bigint), completed_at,
                idempotency_key
           FROM outbound_calls
          WHERE idempotency_key IN (
                SELECT idempotency_key FROM outbound_calls
                 WHERE ($1 IS NULL OR idempotency_key = $1)
                   AND ($2 IS NULL OR message_id = $2)
                 GROUP BY idempotency_key
                 {having}
                 ORDER BY min(started_at), idempotency_key
                 LIMIT $3)
          ORDER BY idempotency_key, started_at, id"
    );
    on_pool!(db, |p| {
        let rows = sqlx::query(&sql)
            .bind(key)
            .bind(message_id)
            .bind(limit)
            .fetch_all(p)
            .await?;
        rows.iter()
            .map(|r| -> Result<(String, OutboundCall), sqlx::Error> {
                let (scheme, host, port, path): (String, String, i64, String) =
                    (r.try_get(5)?, r.try_get(6)?, r.try_get(7)?, r.try_get(8)?);
                let call = OutboundCall {
                    id: r.try_get(0)?,
                    message_id: r.try_get(1)?,
                    consumer: r.try_get(2)?,
                    plugin: r.try_get(3)?,
                    method: r.try_get(4)?,
                    url: format!("{scheme}://{host}:{port}{path}"),
                    started_at: r.try_get(9)?,
                    status: r.try_get(10)?,
                    error: r.try_get(11)?,
                    duration_ms: r.try_get(12)?,
                    completed_at: r.try_get(13)?,
                };
                Ok((r.try_get(14)?, call))
            })
            .collect::<Result<Vec<_>, _>>()
    })
}
