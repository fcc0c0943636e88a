//! The rows of a reconcile rule's query (`[[reconcile]]`), an operator's
//! SQL over the business tables that names the events which should exist
//! but do not; `ops/reconcile.rs` reports and enqueues them.

use sqlx::Row;

use crate::store::{Db, on_pool};

/// One missing event as the query returns it: aggregate id, event type and
/// payload (JSON text), its first three columns.
pub type MissingEvent = (String, String, String);

/// Runs `query` and reads its rows as [`MissingEvent`]s.
pub async fn missing_events(db: &Db, query: &str) -> Result<Vec<MissingEvent>, sqlx::Error> {
    on_pool!(db, |p| sqlx::query(query)
        .fetch_all(p)
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
        .collect())
}
