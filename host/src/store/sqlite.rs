//! The SQLite store, the embedded default. SQLite has no row locks, so a
//! relay task leases the rows it claims in one atomic UPDATE; a crashed
//! relay's lease expires and the rows are claimed again (at least once).

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::{SqlitePool, SqliteRow};
use uuid::Uuid;

use super::{BatchOutcome, ClaimedBatch, OutboxStats, OutboxStore, StoreError};
use crate::event::{EventId, OutboxEvent, parse_headers};

#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    lease: chrono::Duration,
}

impl SqliteStore {
    /// `lease` must exceed the relay's publish timeout, or a slow batch could
    /// be claimed twice (still at least once, never reordered).
    pub fn new(pool: SqlitePool, lease: std::time::Duration) -> Self {
        Self {
            pool,
            lease: chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::seconds(30)),
        }
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

pub fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

pub fn from_micros(v: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(v).unwrap_or_default()
}

const CLAIM: &str = "
UPDATE outbox
   SET lease_owner = $3, lease_until = $4
 WHERE seq IN (
   SELECT o.seq FROM outbox o
    WHERE o.published_at IS NULL
      AND o.dead_at IS NULL
      AND o.next_attempt_at <= $2
      AND (o.lease_until IS NULL OR o.lease_until <= $2)
      AND NOT EXISTS (
        SELECT 1 FROM outbox earlier
         WHERE earlier.aggregate_id = o.aggregate_id
           AND earlier.published_at IS NULL
           AND earlier.seq < o.seq)
    ORDER BY o.seq
    LIMIT $1)
RETURNING seq, id, aggregate_id, event_type, payload, headers, created_at, attempts";

const MARK_PUBLISHED: &str = "
UPDATE outbox SET published_at = $2, outcome = 'published', lease_owner = NULL, lease_until = NULL
 WHERE seq IN (SELECT value FROM json_each($1)) AND published_at IS NULL";

const MARK_FILTERED: &str = "
UPDATE outbox SET published_at = $2, outcome = 'filtered', lease_owner = NULL, lease_until = NULL
 WHERE seq IN (SELECT value FROM json_each($1)) AND published_at IS NULL";

/// Published and filtered events of a batch that went through plugins,
/// with each one's chain label (`[seq, outcome, label]`), in one statement.
const MARK_DONE: &str = "
UPDATE outbox SET published_at = $2,
       outcome = json_extract(d.value, '$[1]'),
       transformed_by = json_extract(d.value, '$[2]'),
       lease_owner = NULL, lease_until = NULL
  FROM json_each($1) AS d
 WHERE outbox.seq = json_extract(d.value, '$[0]') AND published_at IS NULL";

const MARK_FAILED: &str = "
UPDATE outbox
   SET attempts = attempts + 1,
       last_error = f.error,
       next_attempt_at = f.retry_at,
       dead_at = CASE WHEN f.dead THEN $2 ELSE NULL END,
       dead_reason = CASE WHEN f.dead THEN f.error ELSE NULL END,
       lease_owner = NULL,
       lease_until = NULL
  FROM (SELECT json_extract(value, '$.seq') AS seq,
               json_extract(value, '$.error') AS error,
               json_extract(value, '$.retry_at') AS retry_at,
               json_extract(value, '$.dead') AS dead
          FROM json_each($1)) AS f
 WHERE outbox.seq = f.seq
   -- Only the current lease holder records a failure: a holder whose lease
   -- expired (and whose rows another relay claimed, or published) must not
   -- count an attempt, or kill an event, that is no longer its own.
   AND outbox.published_at IS NULL
   AND outbox.lease_owner = $3";

pub struct SqliteBatch {
    pool: SqlitePool,
    events: Vec<OutboxEvent>,
    /// The lease this claim took.
    owner: String,
}

impl ClaimedBatch for SqliteBatch {
    fn events(&self) -> &[OutboxEvent] {
        &self.events
    }

    async fn complete(self, outcome: BatchOutcome, now: DateTime<Utc>) -> Result<(), StoreError> {
        if outcome.published.is_empty() && outcome.failed.is_empty() && outcome.filtered.is_empty()
        {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        if !outcome.transformed.is_empty() {
            sqlx::query(MARK_DONE)
                .bind(serde_json::to_string(&outcome.done_rows()).unwrap_or_default())
                .bind(micros(now))
                .execute(&mut *tx)
                .await?;
        } else {
            if !outcome.published.is_empty() {
                sqlx::query(MARK_PUBLISHED)
                    .bind(serde_json::to_string(&outcome.published).unwrap_or_default())
                    .bind(micros(now))
                    .execute(&mut *tx)
                    .await?;
            }
            if !outcome.filtered.is_empty() {
                sqlx::query(MARK_FILTERED)
                    .bind(serde_json::to_string(&outcome.filtered).unwrap_or_default())
                    .bind(micros(now))
                    .execute(&mut *tx)
                    .await?;
            }
        }
        if !outcome.failed.is_empty() {
            let failed: Vec<serde_json::Value> = outcome
                .failed
                .iter()
                .map(|f| {
                    serde_json::json!({
                        "seq": f.seq,
                        "error": f.error,
                        "retry_at": micros(f.retry_at),
                        "dead": f.dead,
                    })
                })
                .collect();
            sqlx::query(MARK_FAILED)
                .bind(serde_json::Value::Array(failed).to_string())
                .bind(micros(now))
                .bind(&self.owner)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

impl OutboxStore for SqliteStore {
    type Batch = SqliteBatch;

    async fn claim(&self, limit: usize, now: DateTime<Utc>) -> Result<SqliteBatch, StoreError> {
        let owner = Uuid::new_v4().to_string();
        let rows = sqlx::query(CLAIM)
            .bind(limit as i64)
            .bind(micros(now))
            .bind(&owner)
            .bind(micros(now + self.lease))
            .fetch_all(&self.pool)
            .await?;
        let mut events = rows.iter().map(decode_row).collect::<Result<Vec<_>, _>>()?;
        // RETURNING gives no order guarantee.
        events.sort_by_key(|e| e.seq);
        Ok(SqliteBatch {
            pool: self.pool.clone(),
            events,
            owner,
        })
    }

    async fn stats(&self, now: DateTime<Utc>) -> Result<OutboxStats, StoreError> {
        let row = sqlx::query(STATS)
            .bind(micros(now))
            .fetch_one(&self.pool)
            .await?;
        Ok(OutboxStats {
            pending: row.get(0),
            oldest_pending_age_seconds: row.get(1),
            failing: row.get(2),
            dead: row.get(3),
            blocked_aggregates: row.get(4),
            blocked_events: row.get(5),
            published: row.get(6),
        })
    }
}

const STATS: &str = "
WITH unpublished AS (
  SELECT seq, aggregate_id, created_at, attempts, dead_at FROM outbox WHERE published_at IS NULL
), dead_heads AS (
  SELECT aggregate_id, min(seq) AS seq FROM unpublished WHERE dead_at IS NOT NULL GROUP BY aggregate_id
)
SELECT
  (SELECT count(*) FROM unpublished WHERE dead_at IS NULL),
  (SELECT CAST(coalesce(($1 - min(created_at)) / 1000000.0, 0.0) AS REAL) FROM unpublished WHERE dead_at IS NULL),
  (SELECT count(*) FROM unpublished WHERE dead_at IS NULL AND attempts >= 5),
  (SELECT count(*) FROM unpublished WHERE dead_at IS NOT NULL),
  (SELECT count(*) FROM dead_heads),
  (SELECT count(*) FROM unpublished u JOIN dead_heads d
      ON d.aggregate_id = u.aggregate_id AND u.seq > d.seq AND u.dead_at IS NULL),
  (SELECT count(*) FROM outbox WHERE published_at IS NOT NULL AND discarded_at IS NULL)";

fn decode_row(row: &SqliteRow) -> Result<OutboxEvent, StoreError> {
    let seq: i64 = row.try_get(0)?;
    let id_text: String = row.try_get(1)?;
    let id = Uuid::parse_str(&id_text).map_err(|e| {
        sqlx::Error::Decode(format!("outbox row {seq}: id `{id_text}` is not a uuid ({e})").into())
    })?;
    let headers_text: String = row.try_get(5)?;
    let headers = parse_headers(seq, &headers_text).unwrap_or_else(|problem| {
        std::iter::once(("outboxd-header-error".to_string(), problem)).collect()
    });
    Ok(OutboxEvent {
        seq,
        id: EventId(id),
        aggregate_id: row.try_get(2)?,
        event_type: row.try_get(3)?,
        payload: row.try_get(4)?,
        headers,
        created_at: from_micros(row.try_get(6)?),
        attempts: row.try_get::<i64, _>(7)? as i32,
    })
}
