//! A store chosen at runtime: dispatches to the Postgres or SQLite store, for
//! callers (the CLI, tests) that hold a [`Db`] rather than a concrete store.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::event::OutboxEvent;
use crate::store::outbox::pg_claim::{PgBatch, PgStore};
use crate::store::outbox::sqlite_claim::{SqliteBatch, SqliteStore};
use crate::store::{BatchOutcome, ClaimedBatch, Db, OutboxStats, OutboxStore, StoreError};

#[derive(Clone, Debug)]
pub enum AnyStore {
    Postgres(PgStore),
    Sqlite(SqliteStore),
}

impl AnyStore {
    /// `lease` applies to SQLite only (see [`SqliteStore::new`]).
    pub fn new(db: &Db, lease: Duration) -> Self {
        match db {
            Db::Postgres(p) => AnyStore::Postgres(PgStore::new(p.clone())),
            Db::Sqlite(p) => AnyStore::Sqlite(SqliteStore::new(p.clone(), lease)),
        }
    }
}

pub enum AnyBatch {
    Postgres(PgBatch),
    Sqlite(SqliteBatch),
}

impl ClaimedBatch for AnyBatch {
    fn events(&self) -> &[OutboxEvent] {
        match self {
            AnyBatch::Postgres(b) => b.events(),
            AnyBatch::Sqlite(b) => b.events(),
        }
    }

    async fn complete(self, outcome: BatchOutcome, now: DateTime<Utc>) -> Result<(), StoreError> {
        match self {
            AnyBatch::Postgres(b) => b.complete(outcome, now).await,
            AnyBatch::Sqlite(b) => b.complete(outcome, now).await,
        }
    }
}

impl OutboxStore for AnyStore {
    type Batch = AnyBatch;

    async fn claim(&self, limit: usize, now: DateTime<Utc>) -> Result<AnyBatch, StoreError> {
        Ok(match self {
            AnyStore::Postgres(s) => AnyBatch::Postgres(s.claim(limit, now).await?),
            AnyStore::Sqlite(s) => AnyBatch::Sqlite(s.claim(limit, now).await?),
        })
    }

    async fn stats(&self, now: DateTime<Utc>) -> Result<OutboxStats, StoreError> {
        match self {
            AnyStore::Postgres(s) => s.stats(now).await,
            AnyStore::Sqlite(s) => s.stats(now).await,
        }
    }
}
