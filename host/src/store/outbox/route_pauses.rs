//! Webhook routes stopped by their endpoint (410 Gone): a row holds the
//! route's events pending until an operator resumes it. Shared by every
//! relay through the database, so a pause survives restarts.

use chrono::{DateTime, Utc};

use crate::store::Db;
use crate::store::on_pool;

/// One paused route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutePause {
    pub route: String,
    pub reason: String,
    pub paused_at: DateTime<Utc>,
}

/// Pauses `route` (keeps the first reason if it is paused already).
pub async fn pause(db: &Db, route: &str, reason: &str) -> Result<(), sqlx::Error> {
    let sql = "INSERT INTO route_pauses (route, reason, paused_at) VALUES ($1, $2, $3)
               ON CONFLICT (route) DO NOTHING";
    on_pool!(db, |pool| sqlx::query(sql)
        .bind(route)
        .bind(reason)
        .bind(Utc::now())
        .execute(pool)
        .await
        .map(|_| ())?);
    Ok(())
}

/// Resumes `route`; false when it was not paused.
pub async fn resume(db: &Db, route: &str) -> Result<bool, sqlx::Error> {
    let sql = "DELETE FROM route_pauses WHERE route = $1";
    let n = on_pool!(db, |pool| sqlx::query(sql)
        .bind(route)
        .execute(pool)
        .await?
        .rows_affected());
    Ok(n > 0)
}

/// Every paused route, by name.
pub async fn paused(db: &Db) -> Result<Vec<RoutePause>, sqlx::Error> {
    let sql = "SELECT route, reason, paused_at FROM route_pauses ORDER BY route";
    let rows: Vec<(String, String, DateTime<Utc>)> =
        on_pool!(db, |pool| sqlx::query_as(sql).fetch_all(pool).await?);
    Ok(rows
        .into_iter()
        .map(|(route, reason, paused_at)| RoutePause {
            route,
            reason,
            paused_at,
        })
        .collect())
}
