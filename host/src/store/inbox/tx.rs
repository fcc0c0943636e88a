//! The transaction the inbox and its handlers run in: begun and ended by
//! the host, borrowed by a handler for one call. Everything that differs
//! between the databases stays here: the host's statements on it (the
//! inbox marks, savepoints, enqueue, the commit), and whether a consumer
//! plugin's role is set on it (Postgres). The host's own one-event writes
//! (the CLI's `enqueue`, a reconcile rule) use it too.

use std::collections::HashSet;

use sqlx::{Postgres, Sqlite, Transaction};

use outboxd_core::sql_values::{SqlValue, SqlValueError, bind_pg, bind_sqlite, pg_row, sqlite_row};

use crate::store::Db;

/// Why a handler's own statement failed: a parameter or a cell that is not
/// what its value says, or the database.
#[derive(Debug, thiserror::Error)]
pub enum StatementError {
    #[error(transparent)]
    Value(#[from] SqlValueError),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// The transaction a handler runs in. It is borrowed for the call only; the
/// host alone commits or rolls it back.
pub enum InboxTx {
    Postgres(PgInboxTx),
    Sqlite(Transaction<'static, Sqlite>),
}

impl InboxTx {
    /// Gives the host its own role back if a consumer plugin's role is set
    /// on the transaction (Postgres). The host's statements on the
    /// transaction (the inbox marks, savepoints, the commit) do this
    /// themselves; a library caller that runs its own statements after a
    /// plugin call does it first.
    pub async fn as_host(&mut self) -> Result<(), sqlx::Error> {
        match self {
            InboxTx::Postgres(t) => t.as_host().await,
            InboxTx::Sqlite(_) => Ok(()),
        }
    }
}

/// A Postgres transaction of the inbox, and whether a consumer plugin's role
/// is set on it. Within one transaction the role stays set from a plugin's
/// first statement until the host's next statement of its own, so the
/// messages of a batch, which run back to back after their inbox marks,
/// switch roles once, not twice per message. Derefs to the connection, as a
/// `Transaction` does.
pub struct PgInboxTx {
    tx: Transaction<'static, Postgres>,
    /// Set while the plugin's role is (`SET LOCAL ROLE`): the backend's pid,
    /// for a cancel from another connection.
    pub(crate) plugin_role: Option<i32>,
}

impl From<Transaction<'static, Postgres>> for PgInboxTx {
    fn from(tx: Transaction<'static, Postgres>) -> Self {
        Self {
            tx,
            plugin_role: None,
        }
    }
}

impl std::ops::Deref for PgInboxTx {
    type Target = sqlx::PgConnection;
    fn deref(&self) -> &sqlx::PgConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for PgInboxTx {
    fn deref_mut(&mut self) -> &mut sqlx::PgConnection {
        &mut self.tx
    }
}

impl PgInboxTx {
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }

    pub async fn rollback(self) -> Result<(), sqlx::Error> {
        self.tx.rollback().await
    }

    /// The transaction itself, for [`crate::enqueue`].
    pub fn transaction(&mut self) -> &mut Transaction<'static, Postgres> {
        &mut self.tx
    }

    /// `RESET ROLE` when a plugin's role is set.
    pub async fn as_host(&mut self) -> Result<(), sqlx::Error> {
        if self.plugin_role.take().is_some() {
            sqlx::query("RESET ROLE").execute(&mut *self.tx).await?;
        }
        Ok(())
    }
}

impl InboxTx {
    /// Begins a transaction on `db`.
    pub async fn begin(db: &Db) -> Result<Self, sqlx::Error> {
        Ok(match db {
            Db::Postgres(p) => InboxTx::Postgres(p.begin().await?.into()),
            Db::Sqlite(p) => InboxTx::Sqlite(p.begin().await?),
        })
    }

    pub async fn commit(self) -> Result<(), sqlx::Error> {
        match self {
            InboxTx::Postgres(t) => t.commit().await,
            InboxTx::Sqlite(t) => t.commit().await,
        }
    }

    pub async fn rollback(self) -> Result<(), sqlx::Error> {
        match self {
            InboxTx::Postgres(t) => t.rollback().await,
            InboxTx::Sqlite(t) => t.rollback().await,
        }
    }

    /// `SAVEPOINT name`, always taken as the host: so a rollback to it gives
    /// the host its role back by itself.
    pub async fn savepoint(&mut self, name: &'static str) -> Result<(), sqlx::Error> {
        self.as_host().await?;
        self.simple(&format!("SAVEPOINT {name}")).await
    }

    /// `ROLLBACK TO SAVEPOINT name`. It must work in an aborted
    /// transaction, where `RESET ROLE` would fail, and needs none: the role
    /// returns to the host's, which it was at the savepoint.
    pub async fn rollback_to(&mut self, name: &'static str) -> Result<(), sqlx::Error> {
        if let InboxTx::Postgres(t) = self {
            t.plugin_role = None;
        }
        self.simple(&format!("ROLLBACK TO SAVEPOINT {name}")).await
    }

    /// `RELEASE SAVEPOINT name`, as the host.
    pub async fn release(&mut self, name: &'static str) -> Result<(), sqlx::Error> {
        self.as_host().await?;
        self.simple(&format!("RELEASE SAVEPOINT {name}")).await
    }

    /// Writes `event` to the outbox in this transaction, as the host (a
    /// plugin's `emit`, the CLI's `enqueue`, a reconcile rule).
    pub async fn enqueue(
        &mut self,
        event: crate::event::NewEvent,
    ) -> Result<crate::event::Enqueued, crate::store::EnqueueError> {
        self.as_host().await?;
        match self {
            InboxTx::Postgres(t) => crate::store::enqueue(t.transaction(), event).await,
            InboxTx::Sqlite(t) => crate::store::enqueue(t, event).await,
        }
    }

    /// Runs one statement of a native handler's own effect in this
    /// transaction, as the host, with `params` bound in order ($1, $2, …
    /// on both databases); the number of rows it changed. A library
    /// handler needs no match on the database for its SQL.
    pub async fn execute(
        &mut self,
        sql: &str,
        params: Vec<SqlValue>,
    ) -> Result<u64, StatementError> {
        self.as_host().await?;
        let done = match self {
            InboxTx::Postgres(t) => bind_pg(sqlx::query(sql), params)?
                .execute(&mut **t)
                .await?
                .rows_affected(),
            InboxTx::Sqlite(t) => bind_sqlite(sqlx::query(sql), params)?
                .execute(&mut **t)
                .await?
                .rows_affected(),
        };
        Ok(done)
    }

    /// Runs one row-returning statement in this transaction, as the host,
    /// with `params` bound in order; each row as plain values.
    pub async fn query(
        &mut self,
        sql: &str,
        params: Vec<SqlValue>,
    ) -> Result<Vec<Vec<SqlValue>>, StatementError> {
        self.as_host().await?;
        match self {
            InboxTx::Postgres(t) => {
                let rows = bind_pg(sqlx::query(sql), params)?
                    .fetch_all(&mut **t)
                    .await?;
                Ok(rows.iter().map(pg_row).collect::<Result<_, _>>()?)
            }
            InboxTx::Sqlite(t) => {
                let rows = bind_sqlite(sqlx::query(sql), params)?
                    .fetch_all(&mut **t)
                    .await?;
                Ok(rows.iter().map(sqlite_row).collect::<Result<_, _>>()?)
            }
        }
    }

    /// Runs `sql`, any number of statements, as the host in this
    /// transaction (`outboxd plugin test --setup`). On Postgres the
    /// application's schema comes first on the search path while it runs,
    /// as in [`execute_in_app_schema`](crate::store::execute_in_app_schema), so
    /// the tables it creates are where plugin roles are granted them; the
    /// host's search path is back afterwards.
    pub async fn run_script(&mut self, sql: &str) -> Result<(), sqlx::Error> {
        self.as_host().await?;
        match self {
            InboxTx::Postgres(t) => {
                let (path,): (String,) = sqlx::query_as("SELECT current_setting('search_path')")
                    .fetch_one(&mut **t)
                    .await?;
                sqlx::query(crate::store::backend::db::APP_SEARCH_PATH)
                    .execute(&mut **t)
                    .await?;
                sqlx::raw_sql(sql).execute(&mut **t).await?;
                sqlx::query("SELECT set_config('search_path', $1, true)")
                    .bind(path)
                    .execute(&mut **t)
                    .await
                    .map(|_| ())
            }
            InboxTx::Sqlite(t) => sqlx::raw_sql(sql).execute(&mut **t).await.map(|_| ()),
        }
    }

    async fn simple(&mut self, sql: &str) -> Result<(), sqlx::Error> {
        match self {
            InboxTx::Postgres(t) => sqlx::query(sql).execute(&mut **t).await.map(|_| ()),
            InboxTx::Sqlite(t) => sqlx::query(sql).execute(&mut **t).await.map(|_| ()),
        }
    }

    /// Writes `consumer`'s inbox mark for `message_id`, naming the handler
    /// version; false when the mark was there already (a duplicate).
    pub async fn mark(
        &mut self,
        consumer: &str,
        message_id: uuid::Uuid,
        handled_by: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        self.as_host().await?;
        let inserted = match self {
            InboxTx::Postgres(t) => sqlx::query(INSERT_MARK)
                .bind(consumer)
                .bind(message_id)
                .bind(handled_by)
                .execute(&mut **t)
                .await?
                .rows_affected(),
            InboxTx::Sqlite(t) => sqlx::query(INSERT_MARK)
                .bind(consumer)
                .bind(message_id.to_string())
                .bind(handled_by)
                .execute(&mut **t)
                .await?
                .rows_affected(),
        };
        Ok(inserted > 0)
    }

    /// Writes the inbox marks of `ids` (with each one's handler label) and
    /// returns the ids that were new, so not duplicates. Postgres takes them
    /// in one statement; SQLite, which is in-process, one at a time.
    pub async fn mark_all(
        &mut self,
        consumer: &str,
        ids: &[uuid::Uuid],
        labels: &[Option<String>],
    ) -> Result<HashSet<uuid::Uuid>, sqlx::Error> {
        self.as_host().await?;
        let mut fresh = HashSet::with_capacity(ids.len());
        match self {
            InboxTx::Postgres(t) => {
                let inserted: Vec<uuid::Uuid> = sqlx::query_scalar(
                    "INSERT INTO inbox (consumer, message_id, handled_by)
                     SELECT $1, m.id, m.label FROM unnest($2::uuid[], $3::text[]) AS m(id, label)
                     ON CONFLICT DO NOTHING
                     RETURNING message_id",
                )
                .bind(consumer)
                .bind(ids)
                .bind(labels)
                .fetch_all(&mut **t)
                .await?;
                fresh.extend(inserted);
            }
            InboxTx::Sqlite(_) => {
                for (id, label) in ids.iter().zip(labels) {
                    if self.mark(consumer, *id, label.as_deref()).await? {
                        fresh.insert(*id);
                    }
                }
            }
        }
        Ok(fresh)
    }
}

const INSERT_MARK: &str = "INSERT INTO inbox (consumer, message_id, handled_by) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";
