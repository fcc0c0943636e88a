//! A connected database of either kind, chosen from the URL at runtime.

use std::str::FromStr;
use std::time::Duration;

use sqlx::Executor;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};

use crate::db_url::DbKind;
use crate::store::StoreError;

/// Runs `$body` once with `$pool` bound to whichever pool `$db` holds: one
/// query text for both databases, where the Rust types differ.
macro_rules! on_pool {
    ($db:expr, |$pool:ident| $body:expr) => {
        match $db {
            $crate::store::Db::Postgres($pool) => $body,
            $crate::store::Db::Sqlite($pool) => $body,
        }
    };
}
pub(crate) use on_pool;

impl From<outboxd_core::db_url::UnsupportedUrl> for StoreError {
    fn from(e: outboxd_core::db_url::UnsupportedUrl) -> Self {
        StoreError::UnsupportedUrl(e.0)
    }
}

/// sqlx logs a statement slower than a second at WARN with its whole SQL
/// text, which floods a terminal; SQL text belongs in DEBUG events only.
fn quiet_statements<O: sqlx::ConnectOptions>(opts: O) -> O {
    opts.log_statements(log::LevelFilter::Trace)
        .log_slow_statements(log::LevelFilter::Debug, Duration::from_secs(1))
}

#[derive(Clone, Debug)]
pub enum Db {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

impl Db {
    /// Connects with pool settings suited to a relay host. A SQLite file is
    /// created when missing and put in WAL mode with a generous busy timeout,
    /// so several relay tasks and writers in one process wait instead of
    /// failing.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        Self::connect_with(
            url,
            max_connections,
            outboxd_core::config::SqliteSynchronous::Full,
        )
        .await
    }

    /// [`Db::connect`] with SQLite's commit durability chosen
    /// (`database.sqlite_synchronous`); Postgres ignores it.
    pub async fn connect_with(
        url: &str,
        max_connections: u32,
        sqlite_synchronous: outboxd_core::config::SqliteSynchronous,
    ) -> Result<Self, StoreError> {
        match DbKind::from_url(url)? {
            DbKind::Postgres => {
                let opts = host_pg_options(url)?;
                let pool = PgPoolOptions::new()
                    .max_connections(max_connections)
                    .acquire_timeout(Duration::from_secs(10))
                    // No reaper task: connections are checked on acquire
                    // instead, and no background timer fires under paused
                    // tokio time in tests.
                    .idle_timeout(None)
                    .max_lifetime(None)
                    .test_before_acquire(true)
                    .connect_with(opts.clone())
                    .await;
                let e = match pool {
                    Ok(pool) => return Ok(Db::Postgres(pool)),
                    Err(sqlx::Error::PoolTimedOut) => why_no_answer(&opts).await,
                    Err(e) => e,
                };
                // A certificate that fails verification or a server that
                // refuses TLS will not change by retrying: it is named
                // with its fix, and start-up does not wait it out.
                Err(match crate::store::backend::pg_tls::explain(url, &e) {
                    Some(problem) => problem.into(),
                    None => e.into(),
                })
            }
            DbKind::Sqlite => {
                let opts = quiet_statements(SqliteConnectOptions::from_str(url)?)
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(match sqlite_synchronous {
                        outboxd_core::config::SqliteSynchronous::Full => SqliteSynchronous::Full,
                        outboxd_core::config::SqliteSynchronous::Normal => {
                            SqliteSynchronous::Normal
                        }
                    })
                    .busy_timeout(Duration::from_secs(30))
                    .foreign_keys(true);
                let sidecar = sqlite_sidecar(&opts);
                let signal = crate::store::backend::sqlite_watch::signal_for(&opts);
                let background_checkpoints = signal.as_ref().is_some_and(|s| {
                    crate::store::backend::sqlite_watch::start_checkpointer(s, &opts)
                });
                let pool = SqlitePoolOptions::new()
                    .max_connections(max_connections)
                    .acquire_timeout(Duration::from_secs(30))
                    .idle_timeout(None)
                    .max_lifetime(None)
                    // Commits in this process wake relays and consumers at
                    // once (store/backend/sqlite_watch.rs).
                    // A connection whose plugin statement was abandoned
                    // mid-run is reset before anyone else gets it
                    // (store/backend/sqlite_plugin_guard.rs).
                    .before_acquire(|conn, _meta| {
                        Box::pin(async move {
                            if crate::store::backend::sqlite_plugin_guard::any_draining() {
                                crate::store::backend::sqlite_plugin_guard::reset(conn).await?;
                            }
                            Ok(true)
                        })
                    })
                    .after_connect(move |conn, _meta| {
                        let signal = signal.clone();
                        let sidecar = sidecar.clone();
                        Box::pin(async move {
                            attach_sidecar(conn, &sidecar).await?;
                            crate::store::backend::sqlite_busy::install(conn).await?;
                            crate::store::backend::sqlite_plugin_guard::install(conn).await?;
                            if background_checkpoints {
                                sqlx::query("PRAGMA wal_autocheckpoint = 0")
                                    .execute(&mut *conn)
                                    .await?;
                            }
                            match signal {
                                Some(s) => {
                                    crate::store::backend::sqlite_watch::install_hooks(conn, s)
                                        .await
                                }
                                None => Ok(()),
                            }
                        })
                    })
                    .connect_with(opts)
                    .await?;
                Ok(Db::Sqlite(pool))
            }
        }
    }

    /// Whether write transactions run side by side (Postgres) or one at a
    /// time (SQLite's single writer lock).
    pub fn writes_in_parallel(&self) -> bool {
        matches!(self, Db::Postgres(_))
    }

    pub fn kind(&self) -> DbKind {
        match self {
            Db::Postgres(_) => DbKind::Postgres,
            Db::Sqlite(_) => DbKind::Sqlite,
        }
    }

    /// One round trip to the database: whether it answers.
    pub async fn ping(&self) -> Result<(), sqlx::Error> {
        on_pool!(self, |p| sqlx::query("SELECT 1")
            .execute(p)
            .await
            .map(|_| ()))
    }

    /// An SQL expression for `column`, a time column, as microseconds since
    /// the epoch (a bigint): SQLite stores times so, Postgres converts its
    /// `timestamptz`. Lets one row decoding serve both databases.
    pub fn epoch_micros(&self, column: &str) -> String {
        match self {
            Db::Postgres(_) => {
                format!("CAST(EXTRACT(EPOCH FROM {column}) * 1000000 AS BIGINT)")
            }
            Db::Sqlite(_) => column.to_string(),
        }
    }

    pub async fn close(&self) {
        match self {
            Db::Postgres(p) => p.close().await,
            Db::Sqlite(p) => p.close().await,
        }
    }
}

/// The schema holding outboxd's own tables (Postgres; migration 0011). A
/// consumer plugin's role has no USAGE on it.
pub const HOST_SCHEMA: &str = "outboxd";

/// The search path of the host's connections: outboxd's schema first, so
/// its unqualified statements always resolve to its own tables, then the
/// application's schemas (the URL's `search_path`, else Postgres's default
/// `"$user", public`), and the session's temporary schema last, where a
/// temporary table (which plugin SQL cannot create, see
/// store/plugin_sql/roles.rs) could never shadow `inbox` or `outbox`.
///
/// Under a plugin's role (`SET LOCAL ROLE`) Postgres skips the schemas the
/// role has no USAGE on, so the same path resolves plugin SQL to the
/// application's schema only.
fn host_search_path(opts: PgConnectOptions) -> PgConnectOptions {
    let app = opts
        .get_options()
        .and_then(|o| {
            let at = o.find("search_path=")? + "search_path=".len();
            let rest = &o[at..];
            Some(rest[..rest.find(' ').unwrap_or(rest.len())].to_string())
        })
        .unwrap_or_else(|| "\"$user\",public".to_string());
    opts.options([(
        "search_path",
        format!("{HOST_SCHEMA},{app},pg_temp").as_str(),
    )])
}

/// The connect options of the host's Postgres connections for `url`, for
/// a pool made outside [`Db::connect`]. The URL's TLS files are checked
/// here, before any connection uses them (store/backend/pg_tls.rs), and `require`
/// with an `sslrootcert` verifies the chain, as libpq does.
pub fn host_pg_options(url: &str) -> Result<PgConnectOptions, StoreError> {
    let tls = crate::store::backend::pg_tls::PgTls::from_url(url)?;
    tls.check_files(url)?;
    let mut opts = PgConnectOptions::from_str(url)?;
    if opts.get_application_name().is_none() {
        opts = opts.application_name(crate::store::backend::pg_tls::APPLICATION_NAME);
    }
    if tls.mode == crate::store::backend::pg_tls::SslMode::VerifyCa {
        opts = opts.ssl_mode(sqlx::postgres::PgSslMode::VerifyCa);
    }
    Ok(host_search_path(quiet_statements(opts)))
}

/// Runs `sql` (DDL of the application's own tables: the examples', the
/// benchmarks', the tests') so that what it creates lands in the
/// application's schema, not in outboxd's, which comes first on the host's
/// connections. On Postgres it runs in one transaction, after an advisory
/// lock that one such creator holds at a time: two concurrent `CREATE TABLE
/// IF NOT EXISTS` can both miss the table, and one then fails on the
/// catalog's unique index.
pub async fn execute_in_app_schema(db: &Db, sql: &str) -> Result<(), sqlx::Error> {
    match db {
        Db::Postgres(p) => {
            let mut tx = p.begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(crate::store::backend::locks::APP_SCHEMA_LOCK_KEY)
                .execute(&mut *tx)
                .await?;
            sqlx::query(APP_SEARCH_PATH).execute(&mut *tx).await?;
            tx.execute(sql).await?;
            tx.commit().await
        }
        Db::Sqlite(p) => p.execute(sql).await.map(|_| ()),
    }
}

/// Drops outboxd's schema from the front of the search path, for the rest
/// of the transaction.
pub(in crate::store) const APP_SEARCH_PATH: &str = "SELECT set_config('search_path', \
     regexp_replace(current_setting('search_path'), '^outboxd,\\s*', ''), true)";

/// The pool retries a refused connection until its acquire timeout, like
/// one that gets no answer. One direct attempt tells them apart: a refused
/// connection, an unknown host or a refusal by the server (wrong
/// credentials, still starting) comes back as that error, which names the
/// problem; a database that still does not answer stays
/// [`sqlx::Error::PoolTimedOut`], which `outboxd run` waits out.
async fn why_no_answer(opts: &PgConnectOptions) -> sqlx::Error {
    use sqlx::ConnectOptions;
    match tokio::time::timeout(Duration::from_secs(5), opts.connect()).await {
        Ok(Err(e)) => e,
        Ok(Ok(_)) | Err(_) => sqlx::Error::PoolTimedOut,
    }
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

/// Attaches the sidecar as schema `outbound` (plugins' outbound calls,
/// `store/inbox/outbound.rs`) on a new host connection.
pub(crate) async fn attach_sidecar(
    conn: &mut SqliteConnection,
    sidecar: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("ATTACH DATABASE ? AS outbound")
        .bind(sidecar)
        .execute(conn)
        .await?;
    Ok(())
}
