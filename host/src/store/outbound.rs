//! The audit of consumer plugins' outbound HTTP requests, `outbound_calls`
//! (migration 0014): the intent, committed on its own before a request is
//! sent, and the outcome, written in the message's inbox transaction.
//!
//! On SQLite the table lives in a sidecar file attached to every host
//! connection as schema `outbound` (see migrations/sqlite/0014): the inbox
//! transaction holds the main file's write lock while the plugin runs, and
//! the intent must commit before that transaction ends.

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};

use super::{Db, InboxTx};

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
    crate::store::db::on_pool!(db, |pool| {
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

/// The sidecar file of a SQLite database: `<file>-outbound`, or an
/// in-memory database for an in-memory main database.
pub(crate) fn sqlite_sidecar(opts: &SqliteConnectOptions) -> String {
    let main = opts.get_filename().to_string_lossy().into_owned();
    if main.is_empty() || main == ":memory:" || main.starts_with("file::memory:") {
        ":memory:".into()
    } else {
        format!("{main}-outbound")
    }
}

/// Attaches the sidecar as schema `outbound` on a new host connection.
pub(crate) async fn attach(conn: &mut SqliteConnection, sidecar: &str) -> Result<(), sqlx::Error> {
    sqlx::query("ATTACH DATABASE ? AS outbound")
        .bind(sidecar)
        .execute(conn)
        .await?;
    Ok(())
}
