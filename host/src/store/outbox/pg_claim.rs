//! The Postgres store: the claim query takes the oldest due, pending event
//! of each aggregate with `FOR UPDATE SKIP LOCKED`, so any number of relays
//! can share one database.

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgRow};
use sqlx::{Postgres, Row, Transaction};

use crate::event::{EventId, OutboxEvent, parse_headers};
use crate::store::{BatchOutcome, ClaimedBatch, OutboxStats, OutboxStore, StoreError};

#[derive(Clone, Debug)]
pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Runs a claim statement in a new transaction, which the batch holds
    /// until it is completed (or dropped: rolled back, claimable again).
    async fn claim_with(
        &self,
        query: sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<PgBatch, StoreError> {
        let mut tx = self.pool.begin().await?;
        let rows = query.fetch_all(&mut *tx).await?;
        let events = rows.iter().map(decode_row).collect::<Result<Vec<_>, _>>()?;
        if events.is_empty() {
            tx.rollback().await?;
            return Ok(PgBatch { tx: None, events });
        }
        Ok(PgBatch {
            tx: Some(tx),
            events,
        })
    }

    /// [`OutboxStore::claim`] over the given aggregates only (the WAL
    /// relay's hand-off to polling).
    pub async fn claim_among(
        &self,
        limit: usize,
        now: DateTime<Utc>,
        aggregates: &[String],
    ) -> Result<PgBatch, StoreError> {
        if aggregates.is_empty() {
            return Ok(PgBatch {
                tx: None,
                events: Vec::new(),
            });
        }
        self.claim_with(
            sqlx::query(CLAIM_AMONG)
                .bind(limit as i64)
                .bind(now)
                .bind(aggregates),
        )
        .await
    }
}

/// The claim's statement, with `$extra` conditions on the claimed row.
macro_rules! claim_sql {
    ($extra:literal) => {
        concat!(
            "
SELECT o.seq, o.id, o.aggregate_id, o.event_type, o.payload::text, o.headers::text,
       o.created_at, o.attempts, o.redrive_with
  FROM outbox o
 WHERE o.published_at IS NULL
   AND o.dead_at IS NULL
   AND o.next_attempt_at <= $2",
            $extra,
            "
   AND NOT EXISTS (
     SELECT 1 FROM outbox earlier
      WHERE earlier.aggregate_id = o.aggregate_id
        AND earlier.published_at IS NULL
        AND earlier.seq < o.seq
     OFFSET 0)
 ORDER BY o.seq
 LIMIT $1
 FOR UPDATE OF o SKIP LOCKED"
        )
    };
}

/// The oldest due, pending event of each aggregate. NOT EXISTS keeps
/// per-aggregate order (a dead event also holds its successors back), and
/// SKIP LOCKED lets relays run side by side without double claims.
///
/// The plan must not depend on fresh statistics: after a burst (a broker
/// outage, a backlog written while the relay was down) autoanalyze has not
/// seen the new pending rows yet, and with the plain anti-join the planner
/// then rescanned every pending row for each claimed one (12 s per claim at
/// 64,000 pending). `OFFSET 0` keeps the NOT EXISTS a per-row probe (it
/// stops Postgres from turning it into a join), and since migration 0015
/// the only partial index the probe can use is `outbox_pending_by_aggregate`
/// (`outbox_claimable` leaves dead rows out, which the probe must see).
/// Public for tests that look at its plan (`$1` limit, `$2` now).
pub const CLAIM: &str = claim_sql!("");

/// [`CLAIM`] over a given set of aggregates.
const CLAIM_AMONG: &str = claim_sql!("\n   AND o.aggregate_id = ANY($3)");

const MARK_PUBLISHED: &str = "UPDATE outbox SET published_at = $2, outcome = 'published' WHERE seq = ANY($1) AND published_at IS NULL";

const MARK_FILTERED: &str = "UPDATE outbox SET published_at = $2, outcome = 'filtered' WHERE seq = ANY($1) AND published_at IS NULL";

/// Published and filtered events of a batch that went through plugins,
/// with each one's chain label, in one statement.
const MARK_DONE: &str = "
UPDATE outbox o SET published_at = $4, outcome = d.outcome, transformed_by = d.label
  FROM unnest($1::bigint[], $2::text[], $3::text[]) AS d(seq, outcome, label)
 WHERE o.seq = d.seq AND o.published_at IS NULL";

const MARK_FAILED: &str = "
UPDATE outbox o
   SET attempts = o.attempts + CASE WHEN f.counts THEN 1 ELSE 0 END,
       last_error = f.error,
       next_attempt_at = f.retry_at,
       dead_at = CASE WHEN f.dead THEN $5 ELSE NULL END,
       dead_reason = CASE WHEN f.dead THEN f.error ELSE NULL END
  FROM unnest($1::bigint[], $2::text[], $3::timestamptz[], $4::bool[], $6::bool[])
       AS f(seq, error, retry_at, dead, counts)
 WHERE o.seq = f.seq";

pub struct PgBatch {
    tx: Option<Transaction<'static, Postgres>>,
    events: Vec<OutboxEvent>,
}

impl ClaimedBatch for PgBatch {
    fn events(&self) -> &[OutboxEvent] {
        &self.events
    }

    async fn complete(
        mut self,
        outcome: BatchOutcome,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let Some(mut tx) = self.tx.take() else {
            return Ok(());
        };
        mark_outcome(&mut tx, &outcome, now).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Writes a batch's outcome in `tx`: published and filtered events (with
/// their chain labels when plugins ran), then failures (attempts, backoff,
/// dead). The polling claim's transaction and the WAL relay's marks share it.
pub(in crate::store) async fn mark_outcome(
    tx: &mut Transaction<'static, Postgres>,
    outcome: &BatchOutcome,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    if !outcome.transformed.is_empty() {
        let rows = outcome.done_rows();
        let seqs: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let outcomes: Vec<&str> = rows.iter().map(|r| r.1).collect();
        let labels: Vec<Option<&str>> = rows.iter().map(|r| r.2).collect();
        sqlx::query(MARK_DONE)
            .bind(&seqs)
            .bind(&outcomes)
            .bind(&labels)
            .bind(now)
            .execute(&mut **tx)
            .await?;
    } else {
        if !outcome.published.is_empty() {
            sqlx::query(MARK_PUBLISHED)
                .bind(&outcome.published)
                .bind(now)
                .execute(&mut **tx)
                .await?;
        }
        if !outcome.filtered.is_empty() {
            sqlx::query(MARK_FILTERED)
                .bind(&outcome.filtered)
                .bind(now)
                .execute(&mut **tx)
                .await?;
        }
    }
    if !outcome.failed.is_empty() {
        let seqs: Vec<i64> = outcome.failed.iter().map(|f| f.seq).collect();
        let errors: Vec<&str> = outcome.failed.iter().map(|f| f.error.as_str()).collect();
        let retry: Vec<DateTime<Utc>> = outcome.failed.iter().map(|f| f.retry_at).collect();
        let dead: Vec<bool> = outcome.failed.iter().map(|f| f.dead).collect();
        let counts: Vec<bool> = outcome.failed.iter().map(|f| f.counts_attempt).collect();
        sqlx::query(MARK_FAILED)
            .bind(&seqs)
            .bind(&errors)
            .bind(&retry)
            .bind(&dead)
            .bind(now)
            .bind(&counts)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

impl OutboxStore for PgStore {
    type Batch = PgBatch;

    async fn claim(&self, limit: usize, now: DateTime<Utc>) -> Result<PgBatch, StoreError> {
        self.claim_with(sqlx::query(CLAIM).bind(limit as i64).bind(now))
            .await
    }

    async fn stats(&self, now: DateTime<Utc>) -> Result<OutboxStats, StoreError> {
        let row = sqlx::query(STATS).bind(now).fetch_one(&self.pool).await?;
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
  (SELECT coalesce(extract(epoch FROM $1 - min(created_at)), 0)::float8 FROM unpublished WHERE dead_at IS NULL),
  (SELECT count(*) FROM unpublished WHERE dead_at IS NULL AND attempts >= 5),
  (SELECT count(*) FROM unpublished WHERE dead_at IS NOT NULL),
  (SELECT count(*) FROM dead_heads),
  (SELECT count(*) FROM unpublished u JOIN dead_heads d
      ON d.aggregate_id = u.aggregate_id AND u.seq > d.seq AND u.dead_at IS NULL),
  (SELECT count(*) FROM outbox WHERE published_at IS NOT NULL AND discarded_at IS NULL)";

fn decode_row(row: &PgRow) -> Result<OutboxEvent, StoreError> {
    let seq: i64 = row.try_get(0)?;
    let headers_text: String = row.try_get(5)?;
    // Corrupt headers (only possible through hand-written SQL) must not stop
    // the relay; they travel as one diagnostic header instead.
    let headers = parse_headers(seq, &headers_text).unwrap_or_else(|problem| {
        std::iter::once(("outboxd-header-error".to_string(), problem)).collect()
    });
    Ok(OutboxEvent {
        seq,
        id: EventId(row.try_get(1)?),
        aggregate_id: row.try_get(2)?,
        event_type: row.try_get(3)?,
        payload: row.try_get(4)?,
        headers,
        created_at: row.try_get(6)?,
        attempts: row.try_get(7)?,
        redrive_with: row.try_get(8)?,
    })
}

/// The channel the `outbox_notify` trigger signals on.
pub const NOTIFY_CHANNEL: &str = crate::store::backend::notify::OUTBOX_CHANNEL;

/// Listens for new-event notifications and ticks the returned receiver on
/// each one (and after every reconnect, since notifications may have been
/// missed meanwhile). The relay still polls, so a lost tick costs latency,
/// never an event.
pub async fn listen_for_events(
    pool: &PgPool,
) -> Result<tokio::sync::watch::Receiver<u64>, sqlx::Error> {
    crate::store::backend::notify::listen(pool, NOTIFY_CHANNEL).await
}
