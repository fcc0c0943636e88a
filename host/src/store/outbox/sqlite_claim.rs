//! The SQLite store, the embedded default. SQLite has no row locks, so a
//! relay task leases the rows it claims in one atomic UPDATE and renews the
//! lease while the batch is in flight; a crashed relay stops renewing, its
//! lease expires and the rows are claimed again (at least once).

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::{SqlitePool, SqliteRow};
use uuid::Uuid;

use crate::event::{EventId, OutboxEvent, parse_headers};
use crate::store::{BatchOutcome, ClaimedBatch, OutboxStats, OutboxStore, StoreError};

#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    lease: chrono::Duration,
}

impl SqliteStore {
    /// `lease` is how long a claim outlives the relay that took it: a batch
    /// renews its lease every third of it for as long as it is held (see
    /// [`SqliteBatch`]), so a batch may be in flight for longer than `lease`
    /// (plugin chains plus the publish), while the rows of a relay that
    /// crashed are claimable again `lease` after its last renewal.
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
RETURNING seq, id, aggregate_id, event_type, payload, headers, created_at, attempts, redrive_with";

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
   SET attempts = attempts + f.counts,
       last_error = f.error,
       next_attempt_at = f.retry_at,
       dead_at = CASE WHEN f.dead THEN $2 ELSE NULL END,
       dead_reason = CASE WHEN f.dead THEN f.error ELSE NULL END,
       lease_owner = NULL,
       lease_until = NULL
  FROM (SELECT json_extract(value, '$.seq') AS seq,
               json_extract(value, '$.error') AS error,
               json_extract(value, '$.retry_at') AS retry_at,
               json_extract(value, '$.dead') AS dead,
               json_extract(value, '$.counts') AS counts
          FROM json_each($1)) AS f
 WHERE outbox.seq = f.seq
   -- Only the current lease holder records a failure: a holder whose lease
   -- expired (and whose rows another relay claimed, or published) must not
   -- count an attempt, or kill an event, that is no longer its own.
   AND outbox.published_at IS NULL
   AND outbox.lease_owner = $3";

/// Pushes the lease of the rows this owner still holds out to `$1`.
/// Rows another relay claimed after an expiry (their `lease_owner` changed),
/// and rows already marked, are left alone.
const RENEW: &str = "
UPDATE outbox SET lease_until = $1
 WHERE seq IN (SELECT value FROM json_each($2))
   AND lease_owner = $3
   AND published_at IS NULL";

/// A claimed batch. While it lives, a task renews its lease every third of
/// the lease, so a batch whose plugin chains and publish take longer than
/// the lease is not claimed (and published) a second time by another relay;
/// the task stops when the batch is completed or dropped, so a relay that
/// crashed or gave the batch up loses the rows one lease later.
pub struct SqliteBatch {
    pool: SqlitePool,
    events: Vec<OutboxEvent>,
    /// The lease this claim took.
    owner: String,
    /// Aborts the renewal task when the batch goes away.
    _renewal: Option<Renewal>,
}

/// The renewal task of one batch, aborted on drop.
struct Renewal(tokio::task::JoinHandle<()>);

impl Drop for Renewal {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Renewal {
    /// Renews the lease of `seqs`, claimed by `owner` at `claimed_at`, every
    /// third of `lease`, until it is dropped or the rows are no longer held.
    /// The new expiry is the claim time plus the time since (the relay's
    /// clock decided the first one), plus `lease`.
    fn start(
        pool: SqlitePool,
        owner: String,
        seqs: Vec<i64>,
        claimed_at: DateTime<Utc>,
        lease: chrono::Duration,
    ) -> Self {
        let started = std::time::Instant::now();
        let every = (lease / 3)
            .to_std()
            .unwrap_or(std::time::Duration::from_secs(10))
            .max(std::time::Duration::from_millis(10));
        let seqs = serde_json::to_string(&seqs).unwrap_or_default();
        Self(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let elapsed = chrono::Duration::from_std(started.elapsed()).unwrap_or(lease);
                let until = micros(claimed_at + elapsed + lease);
                match sqlx::query(RENEW)
                    .bind(until)
                    .bind(&seqs)
                    .bind(&owner)
                    .execute(&pool)
                    .await
                {
                    Ok(r) if r.rows_affected() == 0 => return,
                    Ok(_) => {}
                    // The next tick tries again; the lease still has two
                    // thirds to run.
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot renew a relay lease; retrying")
                    }
                }
            }
        }))
    }
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
                        "counts": i64::from(f.counts_attempt),
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
        let renewal = (!events.is_empty()).then(|| {
            Renewal::start(
                self.pool.clone(),
                owner.clone(),
                events.iter().map(|e| e.seq).collect(),
                now,
                self.lease,
            )
        });
        Ok(SqliteBatch {
            pool: self.pool.clone(),
            events,
            owner,
            _renewal: renewal,
        })
    }

    async fn stats(&self, now: DateTime<Utc>) -> Result<OutboxStats, StoreError> {
        let row = sqlx::query(STATS)
            .bind(micros(now))
            .fetch_one(&self.pool)
            .await?;
        Ok(OutboxStats::from_row(&row)?)
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
        redrive_with: row.try_get(8)?,
    })
}
