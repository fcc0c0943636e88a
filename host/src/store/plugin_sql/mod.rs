//! A consumer plugin's statements on the inbox transaction: the part of
//! the SQL boundary that differs between the databases. The plugin host
//! (`plugin/host/transaction/`) admits a statement (guard and gate) and keeps
//! the message's budgets; here it runs behind the database's own wall:
//!
//! - Postgres: under the consumer's role (`SET LOCAL ROLE`, once for a
//!   batch, see [`PgInboxTx`](crate::store::PgInboxTx)), with a row-returning
//!   statement wrapped so the server refuses a row over the byte cap;
//! - SQLite: prepared fresh, with the authorizer, the deadline and the
//!   value-length limit active for that statement only
//!   ([`crate::store::backend::sqlite_plugin_guard`]).

pub mod roles;

use std::borrow::Cow;
use std::time::Duration;

use futures_util::TryStreamExt;
use outboxd_core::config::TxnPolicy;
use outboxd_core::db_url::DbKind;
use outboxd_core::sql_gate::Admitted;
use outboxd_core::sql_values::{self as values, SqlValue, SqlValueError};
use sqlx::{Column, Row};

use crate::store::backend::sqlite_plugin_guard::{self as guard, PluginPolicy};
use crate::store::{Db, InboxTx};

/// Why a plugin statement did not run to its end.
#[derive(Debug)]
pub enum PluginSqlError {
    /// The database's own error.
    Database(sqlx::Error),
    /// SQLite's authorizer or deadline stopped it, with the reason (SQLite
    /// itself only says `not authorized` or `interrupted`).
    Refused(String),
    /// A parameter or a result cell the plugin types cannot carry.
    Value(SqlValueError),
    /// More rows than the message has left (`consumers[].max_rows`).
    OverRows,
    /// More bytes than the message has left (`consumers[].max_result_bytes`).
    OverBytes,
}

impl From<sqlx::Error> for PluginSqlError {
    fn from(e: sqlx::Error) -> Self {
        PluginSqlError::Database(e)
    }
}

impl From<SqlValueError> for PluginSqlError {
    fn from(e: SqlValueError) -> Self {
        PluginSqlError::Value(e)
    }
}

/// What one statement may still return of the message's budgets.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub rows_left: u64,
    pub bytes_left: u64,
}

/// A query's answer, and what it weighs against the byte budget.
#[derive(Debug, Default)]
pub struct PluginRows {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<SqlValue>>,
    pub bytes: u64,
}

impl InboxTx {
    pub fn kind(&self) -> DbKind {
        match self {
            InboxTx::Postgres(_) => DbKind::Postgres,
            InboxTx::Sqlite(_) => DbKind::Sqlite,
        }
    }

    /// The Postgres backend running the plugin's statements, while its role
    /// is set: what a cancel from another connection needs.
    pub fn plugin_pid(&self) -> Option<i32> {
        match self {
            InboxTx::Postgres(t) => t.plugin_role,
            InboxTx::Sqlite(_) => None,
        }
    }

    /// Sets the consumer's `statement_timeout` for the rest of the
    /// transaction (Postgres only), once per transaction rather than once
    /// per message: it is set before any message's savepoint, so rolling a
    /// message back keeps it. The host's own inbox and outbox statements run
    /// under it too, which only bounds them.
    pub async fn bound_statements(&mut self, timeout: Duration) -> Result<(), sqlx::Error> {
        if let InboxTx::Postgres(t) = self {
            let sql = format!("SET LOCAL statement_timeout = {}", timeout.as_millis());
            sqlx::Executor::execute(&mut **t, sql.as_str()).await?;
        }
        Ok(())
    }

    /// Runs before a transaction in which plugin SQL ran commits: whatever
    /// the plugin managed to leave on the session goes, so the pooled
    /// connection the relay or another consumer gets next is the host's:
    /// the role, temporary objects, settings, and session advisory locks
    /// (the one session state a rollback would not undo either). `DISCARD
    /// TEMP` and `RESET ALL` keep the driver's prepared statements
    /// (`DISCARD ALL` would drop them behind sqlx's back).
    pub async fn reset_plugin_session(&mut self) -> Result<(), sqlx::Error> {
        match self {
            InboxTx::Postgres(t) => {
                // RESET ALL leaves the role alone: it is reset first, and
                // the rest runs as the host.
                t.plugin_role = None;
                sqlx::Executor::execute(
                    &mut **t,
                    sqlx::raw_sql(
                        "RESET ROLE; DISCARD TEMP; RESET ALL; SELECT pg_advisory_unlock_all()",
                    ),
                )
                .await?;
            }
            InboxTx::Sqlite(t) => guard::reset(t).await?,
        }
        Ok(())
    }

    /// On Postgres, switches to the plugin's `role` (`SET LOCAL ROLE`) in
    /// the same round trip as reading the backend's pid, unless it is set
    /// already; it stays set until the host's next statement of its own.
    /// Without a role (a library caller's policy; `outboxd run` refuses a
    /// consumer plugin on Postgres without one) nothing is set and no pid
    /// is read: the wall deadline then abandons a statement without
    /// cancelling it on the server.
    pub async fn run_as_plugin(&mut self, role: Option<&str>) -> Result<(), sqlx::Error> {
        let (InboxTx::Postgres(t), Some(role)) = (self, role) else {
            return Ok(());
        };
        if t.plugin_role.is_some() {
            return Ok(());
        }
        let pid: i32 =
            sqlx::query_scalar("SELECT pg_backend_pid() FROM set_config('role', $1, true)")
                .bind(role)
                .fetch_one(&mut **t)
                .await?;
        t.plugin_role = Some(pid);
        Ok(())
    }

    /// Runs an admitted statement that the plugin sent with `execute`.
    pub async fn plugin_execute(
        &mut self,
        sql: &str,
        admitted: &Admitted,
        params: Vec<SqlValue>,
        policy: &TxnPolicy,
        budget: Budget,
    ) -> Result<u64, PluginSqlError> {
        match self {
            InboxTx::Postgres(t) => {
                let text = pg_text(sql, admitted, policy.max_result_bytes, budget.rows_left);
                let q = values::bind_pg(sqlx::query(&text), params)?;
                Ok(q.execute(&mut **t).await?.rows_affected())
            }
            InboxTx::Sqlite(t) => {
                let q = values::bind_sqlite(sqlx::query(sql).persistent(false), params)?;
                let active = guard::begin(t, sqlite_policy(policy)).await?;
                let result = q.execute(&mut **t).await.map(|r| r.rows_affected());
                let refused = active.end(t).await?;
                result.map_err(|e| sqlite_error(e, refused))
            }
        }
    }

    /// Runs an admitted statement that the plugin sent with `query`,
    /// stopping as soon as the rows or bytes go past what the message has
    /// left, before the next row is read.
    pub async fn plugin_query(
        &mut self,
        sql: &str,
        admitted: &Admitted,
        params: Vec<SqlValue>,
        policy: &TxnPolicy,
        budget: Budget,
    ) -> Result<PluginRows, PluginSqlError> {
        let mut out = PluginRows::default();
        match self {
            InboxTx::Postgres(t) => {
                let text = pg_text(sql, admitted, policy.max_result_bytes, budget.rows_left);
                let q = values::bind_pg(sqlx::query(&text), params)?;
                let mut stream = q.fetch(&mut **t);
                while let Some(row) = stream.try_next().await? {
                    out.take(&row, values::pg_row(&row)?, budget)?;
                }
            }
            InboxTx::Sqlite(t) => {
                let q = values::bind_sqlite(sqlx::query(sql).persistent(false), params)?;
                let active = guard::begin(t, sqlite_policy(policy)).await?;
                let result: Result<(), PluginSqlError> = async {
                    let mut stream = q.fetch(&mut **t);
                    while let Some(row) = stream.try_next().await? {
                        out.take(&row, values::sqlite_row(&row)?, budget)?;
                    }
                    Ok(())
                }
                .await;
                let refused = active.end(t).await?;
                match result {
                    Err(PluginSqlError::Database(e)) => return Err(sqlite_error(e, refused)),
                    other => other?,
                }
            }
        }
        Ok(out)
    }

    /// After the wall deadline: on Postgres, `pg_cancel_backend` from
    /// another connection of `cancel`, the transaction's database (the caller rolls the
    /// transaction back, and the rollback would otherwise wait for the
    /// statement); on SQLite, the statement is interrupted by the guard's
    /// progress handler and the connection reset.
    pub async fn stop_abandoned_statement(&mut self, cancel: Option<&Db>) {
        let pid = self.plugin_pid();
        match self {
            InboxTx::Postgres(t) => {
                if let (Some(pid), Some(Db::Postgres(pool))) = (pid, cancel) {
                    let cancelled = sqlx::query("SELECT pg_cancel_backend($1)")
                        .bind(pid)
                        .execute(pool)
                        .await;
                    if let Err(e) = cancelled {
                        tracing::warn!(pid, error = %e, "cannot cancel a plugin statement past its deadline");
                    }
                    // The abandoned statement's answer (now `canceling
                    // statement due to user request`) is still on the wire:
                    // read it here, so the caller's rollback gets its own.
                    let _drained = sqlx::Executor::execute(&mut **t, "SELECT 1").await;
                }
            }
            InboxTx::Sqlite(t) => {
                if let Err(e) = guard::reset(t).await {
                    tracing::warn!(error = %e, "cannot reset a SQLite connection after a plugin deadline");
                }
            }
        }
    }
}

impl PluginRows {
    /// Adds one row, or refuses it when it is over the budget.
    fn take<R: Row>(
        &mut self,
        row: &R,
        values: Vec<SqlValue>,
        budget: Budget,
    ) -> Result<(), PluginSqlError> {
        if self.rows.len() as u64 >= budget.rows_left {
            return Err(PluginSqlError::OverRows);
        }
        if self.columns.is_empty() {
            self.columns = row.columns().iter().map(|c| c.name().into()).collect();
        }
        self.bytes += values_size(&values);
        if self.bytes > budget.bytes_left {
            return Err(PluginSqlError::OverBytes);
        }
        self.rows.push(values);
        Ok(())
    }
}

/// The Postgres text of a plugin statement. One that returns rows is
/// wrapped, so the server checks each row's size before sending it and the
/// host never buffers a value larger than `max_bytes` (the driver reads a
/// whole row at a time, and one value may be 1 GB); `outboxd_row_fits`
/// raises with a clear message (migration 0009). The LIMIT bounds the rows
/// the server sends to one more than the budget left. A statement that
/// returns no rows is sent as it is.
fn pg_text<'a>(sql: &'a str, admitted: &Admitted, max_bytes: u64, rows_left: u64) -> Cow<'a, str> {
    if !admitted.returns_rows {
        return sql.into();
    }
    let sql = sql.trim_end().trim_end_matches(';');
    format!(
        "WITH outboxd_rows AS ({sql}\n) SELECT outboxd_rows.* FROM outboxd_rows \
         WHERE outboxd_row_fits(octet_length(outboxd_rows::text), {max_bytes}) \
         LIMIT {}",
        rows_left.saturating_add(1)
    )
    .into()
}

/// The SQLite wall for one statement: the authorizer with the consumer's
/// grants, the deadline and the value-length limit.
fn sqlite_policy(policy: &TxnPolicy) -> PluginPolicy {
    PluginPolicy {
        consumer: policy.consumer.clone(),
        grants: policy.tables.clone(),
        deadline: std::time::Instant::now() + policy.statement_timeout,
        max_value_bytes: policy.max_result_bytes,
    }
}

/// A SQLite error, with the authorizer's or the deadline's reason when one
/// of them stopped the statement.
fn sqlite_error(e: sqlx::Error, refused: Option<String>) -> PluginSqlError {
    match refused {
        Some(why) => PluginSqlError::Refused(why),
        None => PluginSqlError::Database(e),
    }
}

/// Roughly what a row's values weigh in the host's memory.
fn values_size(values: &[SqlValue]) -> u64 {
    values
        .iter()
        .map(|v| match v {
            SqlValue::Text(s) | SqlValue::Json(s) | SqlValue::Timestamp(s) | SqlValue::Uuid(s) => {
                s.len() as u64
            }
            SqlValue::Bytes(b) => b.len() as u64,
            _ => 8,
        })
        .sum::<u64>()
        + 16
}
