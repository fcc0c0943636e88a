//! The WAL relay's statements (Postgres only): creating and checking the
//! publication and the logical replication slot, the reads a reader makes
//! when it starts and when it takes an aggregate back from polling, and the
//! marks of what it published ([`WalFeed`]).
//!
//! The replication stream itself is not a SQL connection; `relay/wal` reads
//! it. Everything here runs on the host's pool.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use outboxd_core::config::WalSection;
use sqlx::postgres::PgPool;
use sqlx::{Postgres, Row, Transaction};

use crate::event::OutboxEvent;
use crate::store::outbox::pg_claim::{PgBatch, PgStore, mark_outcome};
use crate::store::{BatchOutcome, ClaimedBatch, Db, OutboxStats, OutboxStore, StoreError};

/// What can stop the WAL relay from starting, each naming the setting to
/// change.
#[derive(Debug, thiserror::Error)]
pub enum WalSetupError {
    #[error(
        "relay.source = \"wal\" reads Postgres's write-ahead log; database.url is not a Postgres database. Use relay.source = \"poll\""
    )]
    NotPostgres,
    #[error(
        "relay.source = \"wal\" needs the server setting wal_level = logical, but it is `{0}`: run ALTER SYSTEM SET wal_level = logical and restart Postgres (or use relay.source = \"poll\")"
    )]
    WalLevel(String),
    #[error(
        "relay.source = \"wal\": the role `{0}` of database.url may not read a replication stream: run ALTER ROLE \"{0}\" REPLICATION (or connect as a superuser)"
    )]
    NoReplication(String),
    #[error(
        "relay.wal.slot: the replication slot `{slot}` cannot be created because all {max} slots of the server are taken (max_replication_slots); raise max_replication_slots and restart Postgres, or drop a slot nobody reads (SELECT pg_drop_replication_slot('NAME'))"
    )]
    NoFreeSlot { slot: String, max: String },
    #[error(
        "relay.wal.slot: the replication slot `{slot}` already exists for {what}; slots are shared by every database of the server, so give this database its own relay.wal.slot"
    )]
    SlotMismatch { slot: String, what: String },
    #[error(
        "relay.wal.publication: the publication `{publication}` exists but {what}; outboxd needs it to publish inserts only, of outboxd.outbox: DROP PUBLICATION {publication} (outboxd migrate creates it again) or set another relay.wal.publication"
    )]
    PublicationMismatch { publication: String, what: String },
    #[error("relay.source = \"wal\": database error while checking the slot and publication: {0}")]
    Database(#[from] sqlx::Error),
}

/// What [`ensure`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalSetupReport {
    pub created_publication: bool,
    pub created_slot: bool,
}

fn pool(db: &Db) -> Result<&PgPool, WalSetupError> {
    match db {
        Db::Postgres(p) => Ok(p),
        Db::Sqlite(_) => Err(WalSetupError::NotPostgres),
    }
}

/// Creates the publication and the slot when missing, and checks that the
/// server can stream them: `wal_level`, the role's REPLICATION attribute,
/// what an existing publication publishes and which database an existing
/// slot belongs to.
pub async fn ensure(db: &Db, wal: &WalSection) -> Result<WalSetupReport, WalSetupError> {
    let pool = pool(db)?;
    let mut report = WalSetupReport::default();
    let level: String = sqlx::query_scalar("SELECT current_setting('wal_level')")
        .fetch_one(pool)
        .await?;
    check_wal_level(&level)?;
    let (role, may): (String, bool) = sqlx::query_as(
        "SELECT rolname::text, rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user",
    )
    .fetch_one(pool)
    .await?;
    if !may {
        return Err(WalSetupError::NoReplication(role));
    }

    let publication = sqlx::query(
        "SELECT pubinsert, pubupdate, pubdelete, pubtruncate, puballtables,
                EXISTS (SELECT 1 FROM pg_publication_tables t
                         WHERE t.pubname = p.pubname AND t.schemaname = $2 AND t.tablename = 'outbox')
           FROM pg_publication p WHERE pubname = $1",
    )
    .bind(&wal.publication)
    .bind(crate::store::HOST_SCHEMA)
    .fetch_optional(pool)
    .await?;
    match publication {
        None => {
            // Config validation allows only plain identifiers; quoted here
            // as well, for a caller that built its own section.
            let created = sqlx::query(&format!(
                "CREATE PUBLICATION \"{}\" FOR TABLE {}.outbox WITH (publish = 'insert')",
                wal.publication.replace('"', "\"\""),
                crate::store::HOST_SCHEMA
            ))
            .execute(pool)
            .await;
            match created {
                Ok(_) => report.created_publication = true,
                // Another process created it first.
                Err(e) if code(&e).as_deref() == Some("42710") => {}
                Err(e) => return Err(e.into()),
            }
        }
        Some(row) => {
            let (ins, upd, del, trunc, all, has): (bool, bool, bool, bool, bool, bool) = (
                row.try_get(0)?,
                row.try_get(1)?,
                row.try_get(2)?,
                row.try_get(3)?,
                row.try_get(4)?,
                row.try_get(5)?,
            );
            let what = if !has {
                Some("does not include outboxd.outbox".to_string())
            } else if all {
                Some("publishes every table (FOR ALL TABLES)".to_string())
            } else if !ins || upd || del || trunc {
                Some(format!(
                    "publishes insert={ins}, update={upd}, delete={del}, truncate={trunc}; the relay's own marks and retention's deletes would stream back"
                ))
            } else {
                None
            };
            if let Some(what) = what {
                return Err(WalSetupError::PublicationMismatch {
                    publication: wal.publication.clone(),
                    what,
                });
            }
        }
    }

    let slot = sqlx::query(
        "SELECT plugin::text, database::text, slot_type, database = current_database()
           FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(&wal.slot)
    .fetch_optional(pool)
    .await?;
    match slot {
        Some(row) => {
            let plugin: Option<String> = row.try_get(0)?;
            let database: Option<String> = row.try_get(1)?;
            let kind: String = row.try_get(2)?;
            let same_db: Option<bool> = row.try_get(3)?;
            if kind != "logical" || plugin.as_deref() != Some("pgoutput") || same_db != Some(true) {
                return Err(WalSetupError::SlotMismatch {
                    slot: wal.slot.clone(),
                    what: format!(
                        "{kind} replication with plugin {} on database {}",
                        plugin.as_deref().unwrap_or("none"),
                        database.as_deref().unwrap_or("none")
                    ),
                });
            }
        }
        None => {
            let created = sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
                .bind(&wal.slot)
                .execute(pool)
                .await;
            match created {
                Ok(_) => report.created_slot = true,
                Err(e) if code(&e).as_deref() == Some("42710") => {}
                Err(e) if code(&e).as_deref() == Some("53400") => {
                    let max: String =
                        sqlx::query_scalar("SELECT current_setting('max_replication_slots')")
                            .fetch_one(pool)
                            .await?;
                    return Err(WalSetupError::NoFreeSlot {
                        slot: wal.slot.clone(),
                        max,
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(report)
}

/// Logical decoding needs `wal_level = logical`; `replica` and `minimal`
/// write too little to decode rows from.
fn check_wal_level(level: &str) -> Result<(), WalSetupError> {
    if level == "logical" {
        Ok(())
    } else {
        Err(WalSetupError::WalLevel(level.to_string()))
    }
}

fn code(e: &sqlx::Error) -> Option<String> {
    Some(e.as_database_error()?.code()?.into_owned())
}

/// Stops whoever reads `slot` and drops it (and nothing when there is no
/// such slot). A slot nobody reads keeps every WAL segment from its
/// position on, and blocks `DROP DATABASE`.
pub async fn drop_slot(db: &Db, slot: &str) -> Result<(), WalSetupError> {
    let pool = pool(db)?;
    for _ in 0..50 {
        sqlx::query(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
              WHERE slot_name = $1 AND active_pid IS NOT NULL",
        )
        .bind(slot)
        .execute(pool)
        .await?;
        let dropped = sqlx::query(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(slot)
        .execute(pool)
        .await;
        match dropped {
            Ok(_) => return Ok(()),
            // Still active: its walsender has not exited yet.
            Err(e) if code(&e).as_deref() == Some("55006") => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(WalSetupError::Database(sqlx::Error::Protocol(format!(
        "replication slot `{slot}` stayed active after its reader was terminated"
    ))))
}

/// The server's current WAL position, as a number.
pub async fn current_lsn(pool: &PgPool) -> Result<u64, StoreError> {
    let lsn: i64 = sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint")
        .fetch_one(pool)
        .await?;
    Ok(lsn as u64)
}

/// The slot's confirmed position (`confirmed_flush_lsn`), where a reader
/// that takes it starts: 0 for a slot that does not exist or has none.
pub async fn slot_confirmed_lsn(pool: &PgPool, slot: &str) -> Result<u64, StoreError> {
    let lsn: Option<i64> = sqlx::query_scalar(
        "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(pool)
    .await?
    .flatten();
    Ok(lsn.unwrap_or(0).max(0) as u64)
}

/// The unpublished rows when a reader starts: per aggregate, the seqs of
/// its rows in order, and the aggregates that are already in polling's
/// hands (a failed attempt or a dead row).
#[derive(Debug, Default)]
pub struct Unpublished {
    pub fresh: HashMap<String, Vec<i64>>,
    pub stuck: HashSet<String>,
}

/// Reads [`Unpublished`], or `None` when more than `limit` rows are
/// unpublished: the caller then hands every aggregate with such a row to
/// polling rather than holding them all in memory.
pub async fn unpublished(pool: &PgPool, limit: i64) -> Result<Option<Unpublished>, StoreError> {
    let rows = sqlx::query(
        "SELECT aggregate_id, seq, attempts > 0 OR dead_at IS NOT NULL
           FROM outbox WHERE published_at IS NULL ORDER BY aggregate_id, seq LIMIT $1",
    )
    .bind(limit + 1)
    .fetch_all(pool)
    .await?;
    if rows.len() as i64 > limit {
        return Ok(None);
    }
    let mut out = Unpublished::default();
    for row in rows {
        let aggregate: String = row.try_get(0)?;
        let seq: i64 = row.try_get(1)?;
        let stuck: bool = row.try_get(2)?;
        if stuck {
            out.fresh.remove(&aggregate);
            out.stuck.insert(aggregate);
        } else if !out.stuck.contains(&aggregate) {
            out.fresh.entry(aggregate).or_default().push(seq);
        }
    }
    Ok(Some(out))
}

/// The aggregates that have an unpublished row.
pub async fn aggregates_with_unpublished(pool: &PgPool) -> Result<HashSet<String>, StoreError> {
    let rows: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT aggregate_id FROM outbox WHERE published_at IS NULL")
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().collect())
}

/// Of `seqs`, those already published or filtered (done): a replayed event
/// that another reader, or polling, has settled.
pub async fn done_among(pool: &PgPool, seqs: &[i64]) -> Result<HashSet<i64>, StoreError> {
    if seqs.is_empty() {
        return Ok(HashSet::new());
    }
    let rows: Vec<i64> = sqlx::query_scalar(
        "SELECT seq FROM outbox WHERE seq = ANY($1) AND published_at IS NOT NULL",
    )
    .bind(seqs)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().collect())
}

/// Of `aggregates`, those that still have an unpublished row, and the WAL
/// position read after: any row of the others that commits later streams
/// in after that position.
pub async fn still_unpublished(
    pool: &PgPool,
    aggregates: &[String],
) -> Result<(HashSet<String>, u64), StoreError> {
    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT aggregate_id FROM outbox WHERE aggregate_id = ANY($1) AND published_at IS NULL",
    )
    .bind(aggregates)
    .fetch_all(pool)
    .await?;
    let lsn = current_lsn(pool).await?;
    Ok((rows.into_iter().collect(), lsn))
}

/// What the reader hands the relay next and what it learns back: the
/// [`OutboxStore`] the relay runs over in WAL mode, so
/// events from the stream take the same plugin chains, publish path and
/// marks as claimed ones.
#[derive(Clone, Debug)]
pub struct WalFeed {
    pool: PgPool,
    state: Arc<Mutex<FeedState>>,
}

#[derive(Debug, Default)]
struct FeedState {
    next: Vec<OutboxEvent>,
    failed: Vec<i64>,
}

impl WalFeed {
    pub fn new(db: &Db) -> Result<Self, WalSetupError> {
        Ok(Self {
            pool: pool(db)?.clone(),
            state: Arc::default(),
        })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The events the next `claim` returns. The reader offers a batch and
    /// claims it within one poll of its future, so batches published side
    /// by side each take their own.
    pub fn offer(&self, events: Vec<OutboxEvent>) {
        self.state.lock().expect("feed state").next = events;
    }

    /// Which of `seqs` (one batch's) its marks recorded as failed (retry
    /// or dead); failures of batches marked beside it stay for them.
    pub fn take_failed_among(&self, seqs: &[i64]) -> Vec<i64> {
        let mut state = self.state.lock().expect("feed state");
        let (mine, others): (Vec<i64>, Vec<i64>) =
            state.failed.iter().partition(|seq| seqs.contains(seq));
        state.failed = others;
        mine
    }
}

/// A batch from the stream: no claim transaction holds it (the stream
/// does), so its marks run in a transaction of their own.
pub struct WalBatch {
    pool: PgPool,
    events: Vec<OutboxEvent>,
    state: Arc<Mutex<FeedState>>,
}

impl ClaimedBatch for WalBatch {
    fn events(&self) -> &[OutboxEvent] {
        &self.events
    }

    async fn complete(self, outcome: BatchOutcome, now: DateTime<Utc>) -> Result<(), StoreError> {
        if self.events.is_empty() {
            return Ok(());
        }
        let mut tx: Transaction<'static, Postgres> = self.pool.begin().await?;
        mark_outcome(&mut tx, &outcome, now).await?;
        tx.commit().await?;
        self.state
            .lock()
            .expect("feed state")
            .failed
            .extend(outcome.failed.iter().map(|f| f.seq));
        Ok(())
    }
}

impl OutboxStore for WalFeed {
    type Batch = WalBatch;

    async fn claim(&self, _limit: usize, _now: DateTime<Utc>) -> Result<WalBatch, StoreError> {
        let events = std::mem::take(&mut self.state.lock().expect("feed state").next);
        Ok(WalBatch {
            pool: self.pool.clone(),
            events,
            state: self.state.clone(),
        })
    }

    async fn stats(&self, now: DateTime<Utc>) -> Result<OutboxStats, StoreError> {
        PgStore::new(self.pool.clone()).stats(now).await
    }
}

/// The polling claim restricted to the aggregates the WAL reader handed
/// over (a failed or dead event, or rows the slot will not replay): the
/// same ordering, backoff and dead rules as polling mode.
#[derive(Clone, Debug)]
pub struct HandedStore {
    pool: PgPool,
    aggregates: Arc<Mutex<Vec<String>>>,
}

impl HandedStore {
    pub fn new(feed: &WalFeed) -> Self {
        Self {
            pool: feed.pool.clone(),
            aggregates: Arc::default(),
        }
    }

    /// The aggregates the next claim may take from.
    pub fn set(&self, aggregates: Vec<String>) {
        *self.aggregates.lock().expect("handed aggregates") = aggregates;
    }
}

impl OutboxStore for HandedStore {
    type Batch = PgBatch;

    async fn claim(&self, limit: usize, now: DateTime<Utc>) -> Result<PgBatch, StoreError> {
        let aggregates = self.aggregates.lock().expect("handed aggregates").clone();
        PgStore::new(self.pool.clone())
            .claim_among(limit, now, &aggregates)
            .await
    }

    async fn stats(&self, now: DateTime<Utc>) -> Result<OutboxStats, StoreError> {
        PgStore::new(self.pool.clone()).stats(now).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_without_logical_wal_is_refused_with_the_setting_to_change() {
        assert!(check_wal_level("logical").is_ok());
        for level in ["replica", "minimal"] {
            let e = check_wal_level(level).expect_err("not logical").to_string();
            assert!(
                e.contains("wal_level = logical")
                    && e.contains(&format!("`{level}`"))
                    && e.contains("ALTER SYSTEM SET wal_level = logical")
                    && e.contains("restart"),
                "{e}"
            );
        }
    }
}
