//! The WAL relay's replication slot as an operator sees it: which process
//! reads it, how much WAL it keeps on the server's disk, and how far its
//! reader has confirmed. The admin sampler exports the retained bytes
//! (`outboxd_relay_wal_retained_bytes`) and `outboxd stats` prints all of it.

use serde::Serialize;

use crate::store::{Db, StoreError};

/// One row of `pg_replication_slots`, as far as the runbook needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlotStatus {
    pub slot: String,
    /// The database the slot decodes.
    pub database: Option<String>,
    /// The walsender that reads the slot now; `None` while nobody does.
    pub active_pid: Option<i32>,
    /// `pg_current_wal_lsn() - restart_lsn`: the WAL the slot keeps from
    /// being recycled. 0 when the slot has no `restart_lsn` (invalidated).
    pub retained_bytes: i64,
    /// How far the reader has confirmed; the next reader starts here.
    pub confirmed_flush_lsn: Option<String>,
    /// `reserved`, `extended`, `unreserved` or `lost` (invalidated past
    /// `max_slot_wal_keep_size`).
    pub wal_status: Option<String>,
}

/// database, active_pid, retained bytes, confirmed_flush_lsn, wal_status.
type SlotRow = (
    Option<String>,
    Option<i32>,
    Option<i64>,
    Option<String>,
    Option<String>,
);

/// The slot named `slot`: `None` when it does not exist, or on SQLite
/// (which has no WAL relay).
pub async fn slot_status(db: &Db, slot: &str) -> Result<Option<SlotStatus>, StoreError> {
    let Db::Postgres(pool) = db else {
        return Ok(None);
    };
    let row: Option<SlotRow> = sqlx::query_as(
        "SELECT database::text, active_pid,
                pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8,
                confirmed_flush_lsn::text, wal_status
           FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(
        |(database, active_pid, retained, confirmed_flush_lsn, wal_status)| SlotStatus {
            slot: slot.to_string(),
            database,
            active_pid,
            retained_bytes: retained.unwrap_or(0).max(0),
            confirmed_flush_lsn,
            wal_status,
        },
    ))
}
