//! A forward-only migration runner over the SQL files in `migrations/`.
//!
//! The files are embedded at build time, so the binary needs nothing beside
//! it. Each migration runs in its own transaction together with its row in
//! `outboxd_migrations`; a concurrent runner waits on a lock (Postgres) or on
//! the write lock (SQLite) and then finds the work done.

use sqlx::{Executor, Row};

use crate::store::{Db, StoreError};

struct Migration {
    version: i64,
    name: &'static str,
    sql: &'static str,
}

/// Both databases' migrations, embedded at build time: one version, name
/// and file per step, the same list in each folder (the files of a step may
/// differ, or do nothing on one database, but the versions stay in step).
macro_rules! migrations {
    ($($version:literal, $name:literal, $file:literal;)*) => {
        const POSTGRES: &[Migration] = &[$(Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("../../../../migrations/postgres/", $file)),
        }),*];
        const SQLITE: &[Migration] = &[$(Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("../../../../migrations/sqlite/", $file)),
        }),*];
    };
}

migrations! {
    1, "outbox", "0001_outbox.sql";
    2, "embedded_transport", "0002_embedded_transport.sql";
    3, "operations", "0003_operations.sql";
    4, "consumer_dead_letters", "0004_consumer_dead_letters.sql";
    5, "plugins", "0005_plugins.sql";
    6, "plugin_registry", "0006_plugin_registry.sql";
    7, "inbox_handled_by", "0007_inbox_handled_by.sql";
    8, "consumer_offsets", "0008_consumer_offsets.sql";
    9, "plugin_sql", "0009_plugin_sql.sql";
    10, "advisory_keyspaces", "0010_advisory_keyspaces.sql";
    11, "host_schema", "0011_host_schema.sql";
    12, "consumer_parking", "0012_consumer_parking.sql";
    13, "redrive_with", "0013_redrive_with.sql";
    14, "outbound_calls", "0014_outbound_calls.sql";
    15, "claim_plan", "0015_claim_plan.sql";
    16, "transport_members", "0016_transport_members.sql";
    17, "route_pauses", "0017_route_pauses.sql";
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    pub applied: Vec<String>,
    pub current: i64,
}

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS outboxd_migrations (
    version bigint PRIMARY KEY,
    name text NOT NULL,
    applied_at text NOT NULL)";

/// Applies every migration the database does not have yet.
pub async fn migrate(db: &Db) -> Result<MigrationReport, StoreError> {
    migrate_to(db, i64::MAX).await
}

/// Applies the migrations the database does not have yet, up to and
/// including `target`: an earlier release's schema, for upgrade tests.
pub async fn migrate_to(db: &Db, target: i64) -> Result<MigrationReport, StoreError> {
    let mut applied = Vec::new();
    match db {
        Db::Postgres(pool) => {
            let mut conn = pool.acquire().await?;
            // One runner at a time across every host sharing the database.
            sqlx::query("SELECT pg_advisory_lock($1)")
                .bind(crate::store::backend::locks::MIGRATION_LOCK_KEY)
                .execute(&mut *conn)
                .await?;
            let result = async {
                conn.execute(CREATE_TABLE).await?;
                let current = current_version(&mut *conn).await?;
                check_not_newer(current, POSTGRES)?;
                for m in POSTGRES
                    .iter()
                    .filter(|m| m.version > current && m.version <= target)
                {
                    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                    run_one(&mut tx, m).await?;
                    tx.commit().await?;
                    applied.push(format!("{:04}_{}", m.version, m.name));
                }
                Ok::<_, StoreError>(())
            }
            .await;
            sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(crate::store::backend::locks::MIGRATION_LOCK_KEY)
                .execute(&mut *conn)
                .await?;
            result?;
        }
        Db::Sqlite(pool) => {
            let mut conn = pool.acquire().await?;
            conn.execute(CREATE_TABLE).await?;
            let current = current_version(&mut *conn).await?;
            check_not_newer(current, SQLITE)?;
            for m in SQLITE
                .iter()
                .filter(|m| m.version > current && m.version <= target)
            {
                let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                // Re-check inside the write transaction: another process may
                // have applied it meanwhile.
                let row = sqlx::query("SELECT count(*) FROM outboxd_migrations WHERE version = ?")
                    .bind(m.version)
                    .fetch_one(&mut *tx)
                    .await?;
                if row.get::<i64, _>(0) > 0 {
                    continue;
                }
                run_one(&mut tx, m).await?;
                tx.commit().await?;
                applied.push(format!("{:04}_{}", m.version, m.name));
            }
        }
    }
    let current = match db {
        Db::Postgres(pool) => current_version(&mut *pool.acquire().await?).await?,
        Db::Sqlite(pool) => current_version(&mut *pool.acquire().await?).await?,
    };
    Ok(MigrationReport { applied, current })
}

fn check_not_newer(current: i64, known: &[Migration]) -> Result<(), StoreError> {
    let latest = known.last().map(|m| m.version).unwrap_or(0);
    if current > latest {
        return Err(StoreError::SchemaTooNew {
            found: current,
            known: latest,
        });
    }
    Ok(())
}

async fn current_version<'c, E>(conn: E) -> Result<i64, StoreError>
where
    E: Executor<'c>,
    for<'r> i64: sqlx::Decode<'r, E::Database> + sqlx::Type<E::Database>,
    for<'r> &'r str: sqlx::ColumnIndex<<E::Database as sqlx::Database>::Row>,
    usize: sqlx::ColumnIndex<<E::Database as sqlx::Database>::Row>,
    for<'q> <E::Database as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, E::Database>,
{
    let row = sqlx::query("SELECT coalesce(max(version), 0) FROM outboxd_migrations")
        .fetch_one(conn)
        .await?;
    Ok(row.try_get::<i64, _>(0)?)
}

async fn run_one<'c, DB>(
    tx: &mut sqlx::Transaction<'c, DB>,
    m: &Migration,
) -> Result<(), StoreError>
where
    DB: sqlx::Database,
    for<'e> &'e mut DB::Connection: Executor<'e, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    i64: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    String: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let wrap = |source| StoreError::Migration {
        version: m.version,
        name: m.name.to_string(),
        source,
    };
    sqlx::raw_sql(m.sql)
        .execute(&mut **tx)
        .await
        .map_err(wrap)?;
    sqlx::query("INSERT INTO outboxd_migrations (version, name, applied_at) VALUES ($1, $2, $3)")
        .bind(m.version)
        .bind(m.name)
        .bind(chrono::Utc::now().to_rfc3339())
        .execute(&mut **tx)
        .await
        .map_err(wrap)?;
    Ok(())
}
