//! A fresh database per test (Postgres or a SQLite file), dropped when the
//! test ends, passed or failed: [`TestDb`], and [`WalTestDb`] with its
//! replication slot. Also the small helpers that write or read a test's
//! database.

use std::sync::Arc;
use std::time::Duration;

use outboxd::broker::Publisher;
use outboxd::clock::{Clock, SystemClock};
use outboxd::event::NewEvent;
use outboxd::relay::Relay;
use outboxd::relay::RelayConfig;
use outboxd::route::Router;
use outboxd::store::{AnyStore, Db, EnqueueError, enqueue, migrate};
use serde_json::Value;
use sqlx::Row;

use super::eventually::eventually;
use super::wal::wal_config;

/// `$body` with `$p` bound to the pool of `$db` (a [`Db`]), whichever
/// database it is: the two arms sqlx's typed pools need, written once.
macro_rules! with_pool {
    ($db:expr, |$p:ident| $body:expr) => {
        match $db {
            outboxd::store::Db::Postgres($p) => $body,
            outboxd::store::Db::Sqlite($p) => $body,
        }
    };
}
pub(crate) use with_pool;

/// The server the tests create their databases on.
pub fn pg_admin_url() -> String {
    std::env::var("OUTBOXD_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
}

pub struct TestDb {
    pub db: Db,
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    /// Postgres: drops the database and the roles named after it.
    _drop: Option<DropDatabase>,
}

/// Drops a test's Postgres database (`WITH (FORCE)`, so a connection the
/// test left open does not keep it) and every role named after it
/// (`<database>_*`: roles belong to the cluster) when the test ends, passed
/// or panicked. It runs psql synchronously, as [`SlotGuard`] does: a Drop
/// cannot await, and the test's runtime may be shutting down. `tests/run.sh`
/// checks at its end that nothing named `outboxd_t_*` is left.
pub struct DropDatabase {
    pub name: String,
}

impl Drop for DropDatabase {
    fn drop(&mut self) {
        let name = &self.name;
        let roles = format!(
            r#"DO $$
DECLARE r text;
BEGIN
  FOR r IN SELECT rolname FROM pg_roles WHERE starts_with(rolname, '{name}_') LOOP
    EXECUTE format('DROP ROLE IF EXISTS %I', r);
  END LOOP;
END $$"#
        );
        // Each -c runs on its own: DROP DATABASE cannot run in a transaction.
        let failed = psql_as_admin(&[
            &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            &roles,
        ]);
        if let Some(why) = failed {
            // Panicking in a Drop during a panic would abort and hide the
            // test's own failure; tests/run.sh reports what is left.
            eprintln!("could not drop the test database {name} or its roles: {why}");
        }
    }
}

impl TestDb {
    /// A new, empty, migrated Postgres database named `outboxd_t_<uuid>`.
    pub async fn postgres() -> TestDb {
        let t = Self::postgres_unmigrated().await;
        migrate(&t.db).await.expect("migrate the test database");
        t
    }

    /// A new, empty Postgres database with no migration applied.
    pub async fn postgres_unmigrated() -> TestDb {
        let admin = pg_admin_url();
        let name = format!("outboxd_t_{}", uuid::Uuid::new_v4().simple());
        let admin_pool = sqlx::PgPool::connect(&admin).await.unwrap_or_else(|e| {
            panic!(
                "cannot reach Postgres at {admin} ({e}). Start it with `bash tests/run.sh` (which starts a throwaway cluster) \
                 or point OUTBOXD_TEST_DATABASE_URL at a server where this user can CREATE DATABASE"
            )
        });
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&admin_pool)
            .await
            .expect("CREATE DATABASE for the test");
        admin_pool.close().await;
        let url = match admin.rfind('/') {
            Some(i) => format!("{}/{name}", &admin[..i]),
            None => panic!("OUTBOXD_TEST_DATABASE_URL must end in /DBNAME"),
        };
        // Armed before the first connection, so a test that fails from
        // here on still drops its database.
        let guard = DropDatabase { name: name.clone() };
        let db = Db::connect(&url, 16)
            .await
            .expect("connect to the test database");
        TestDb {
            db,
            url,
            _dir: None,
            _drop: Some(guard),
        }
    }

    /// A new, migrated SQLite file in a temporary directory.
    pub async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("outbox.db").display());
        let db = Db::connect(&url, 8)
            .await
            .expect("open the SQLite test file");
        migrate(&db).await.expect("migrate the SQLite test file");
        TestDb {
            db,
            url,
            _dir: Some(dir),
            _drop: None,
        }
    }

    pub fn store(&self) -> AnyStore {
        AnyStore::new(&self.db, Duration::from_secs(30))
    }

    pub fn relay<P: Publisher>(&self, publisher: P) -> Relay<AnyStore, P> {
        self.relay_with(publisher, RelayConfig::default(), Arc::new(SystemClock))
    }

    pub fn relay_with<P: Publisher>(
        &self,
        publisher: P,
        config: RelayConfig,
        clock: Arc<dyn Clock>,
    ) -> Relay<AnyStore, P> {
        Relay::new(self.store(), publisher, Router::default(), config, clock)
    }

    /// Postgres: gives `c` (a consumer plugin) a role of its own for its
    /// `tables`, as `outboxd plugin-roles` would, and sets `c.db_role`.
    /// Roles belong to the cluster, so each is named after this test's
    /// database (tests/run.sh drops the leftovers). Nothing on SQLite.
    pub async fn provision_plugin_role(
        &self,
        c: &mut outboxd::config::ConsumerSection,
    ) -> Option<String> {
        let Db::Postgres(pool) = &self.db else {
            return None;
        };
        let database = self.url.rsplit('/').next().expect("database name");
        let mut role = format!("{database}_{}", c.name.replace('-', "_"));
        role.truncate(63);
        c.db_role = Some(role.clone());
        outboxd::store::plugin_sql::roles::provision(pool, std::slice::from_ref(c))
            .await
            .expect("provision the plugin's role");
        Some(role)
    }

    /// Commits one event to the outbox, as a producer would.
    pub async fn enqueue(&self, event: NewEvent) {
        enqueue_on(&self.db, event).await;
    }

    /// Runs a query returning one integer.
    pub async fn count(&self, sql: &str) -> i64 {
        self.one(sql).await
    }

    /// Waits until `sql` (a query returning one integer) returns `want`,
    /// for `within` at most.
    pub async fn wait_count(&self, within: Duration, sql: &str, want: i64) {
        eventually(within, format!("`{sql}` = {want}"), async || {
            let got = self.count(sql).await;
            if got == want { Ok(()) } else { Err(got) }
        })
        .await
    }

    /// Runs a query returning one value of type `T`.
    pub async fn one<T>(&self, sql: &str) -> T
    where
        T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
        T: for<'r> sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
    {
        with_pool!(&self.db, |p| sqlx::query(sql)
            .fetch_one(p)
            .await
            .expect(sql)
            .get(0))
    }

    /// Runs a statement.
    pub async fn exec(&self, sql: &str) {
        with_pool!(&self.db, |p| sqlx::raw_sql(sql)
            .execute(p)
            .await
            .map(|_| ())
            .expect(sql))
    }

    /// Runs DDL of the application's own tables, so that on Postgres they
    /// land in the application's schema (`public`), where plugin roles are
    /// granted them, not in outboxd's, which the host's connections search
    /// first.
    pub async fn exec_app(&self, sql: &str) {
        outboxd::store::execute_in_app_schema(&self.db, sql)
            .await
            .expect(sql);
    }

    /// Skips every backoff: all pending events become due now.
    pub async fn make_all_due(&self) {
        if self.is_postgres() {
            self.exec("UPDATE outbox SET next_attempt_at = now() - interval '1 hour'")
                .await;
        } else {
            self.exec("UPDATE outbox SET next_attempt_at = 0, lease_until = NULL")
                .await;
        }
    }

    pub fn is_postgres(&self) -> bool {
        matches!(self.db, Db::Postgres(_))
    }
}

/// A migrated Postgres test database ready for the WAL relay
/// (`relay.source = "wal"`): its publication and its replication slot exist.
/// The slot is named like the database (`outboxd_t_<uuid>`): slots belong
/// to the whole cluster, so the name never clashes with another test's, and
/// tests/run.sh can find the leftovers of a killed run. Dropping this drops
/// the slot (see [`SlotGuard`]).
pub struct WalTestDb {
    // Fields drop in order: the slot before the database it belongs to.
    _slot: SlotGuard,
    pub t: TestDb,
    pub slot: String,
}

impl std::ops::Deref for WalTestDb {
    type Target = TestDb;
    fn deref(&self) -> &TestDb {
        &self.t
    }
}

impl TestDb {
    /// This database's name, the last part of its URL.
    pub fn database_name(&self) -> &str {
        self.url.rsplit('/').next().expect("database name")
    }

    /// A new Postgres database, migrated, with the WAL relay's publication
    /// and slot created by the product's own `store::wal::ensure`.
    pub async fn postgres_wal() -> WalTestDb {
        let t = TestDb::postgres().await;
        let level = t.text("SHOW wal_level").await;
        assert_eq!(
            level,
            "logical",
            "the WAL relay's tests need a server with wal_level = logical, and {} runs {level}. \
             `bash tests/run.sh` switches the local cluster on 127.0.0.1:5432 (ALTER SYSTEM and a restart); \
             on another server run `ALTER SYSTEM SET wal_level = logical` as a superuser and restart it",
            pg_admin_url()
        );
        let slot = t.database_name().to_string();
        // Armed before the slot exists, so a test that fails from here on
        // still drops it.
        let guard = SlotGuard { slot: slot.clone() };
        wait_for_a_free_slot(&t).await;
        let config = wal_config(&t.url, &slot, "");
        outboxd::store::outbox::wal::ensure(&t.db, &config.relay.wal)
            .await
            .unwrap_or_else(|e| panic!("create the publication and slot {slot}: {e}"));
        WalTestDb {
            t,
            slot,
            _slot: guard,
        }
    }

    /// Runs a query returning one text value.
    pub async fn text(&self, sql: &str) -> String {
        self.one(sql).await
    }
}

/// The cluster has a fixed number of replication slots
/// (`max_replication_slots`); nextest's `wal` group (.config/nextest.toml)
/// bounds how many of these tests run at once. Under plain `cargo test`,
/// or next to a chaos soak holding slots, this waits for one to be free
/// rather than failing on a full cluster.
async fn wait_for_a_free_slot(t: &TestDb) {
    let what = format!(
        "no free replication slot on {} for 3 minutes (max_replication_slots is full): \
         see `SELECT slot_name, database, active FROM pg_replication_slots`; \
         tests/run.sh drops the slots earlier runs left",
        pg_admin_url()
    );
    eventually(Duration::from_secs(180), what, async || {
        let free = t
            .count(
                "SELECT current_setting('max_replication_slots')::bigint - (SELECT count(*) FROM pg_replication_slots)",
            )
            .await;
        if free > 0 { Ok(()) } else { Err(free) }
    })
    .await
}

/// Runs each statement with psql (`-c` each, so each in its own
/// transaction) on the admin URL, synchronously, as a Drop must; returns
/// why it failed, if it did.
fn psql_as_admin(statements: &[&str]) -> Option<String> {
    let mut cmd = std::process::Command::new("psql");
    cmd.args([pg_admin_url().as_str(), "-X", "-q", "-v", "ON_ERROR_STOP=1"]);
    for sql in statements {
        cmd.args(["-c", sql]);
    }
    match cmd.output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(String::from_utf8_lossy(&o.stderr).into_owned()),
        Err(e) => Some(format!("cannot run psql: {e}")),
    }
}

/// Drops a test's replication slot when the test ends, passed or panicked,
/// so no slot pins WAL or blocks its database's DROP DATABASE. A reader
/// still on the slot (a relay the test started, or one a standby is about
/// to start) is terminated first, until the drop succeeds. It runs psql,
/// synchronously: a Drop cannot await, and the test's runtime may be
/// shutting down.
pub struct SlotGuard {
    pub slot: String,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let slot = &self.slot;
        let sql = format!(
            r#"DO $$
DECLARE pid int;
BEGIN
  FOR i IN 1..200 LOOP
    SELECT active_pid INTO pid FROM pg_replication_slots WHERE slot_name = '{slot}';
    IF NOT FOUND THEN RETURN; END IF;
    IF pid IS NULL THEN
      BEGIN
        PERFORM pg_drop_replication_slot('{slot}');
        RETURN;
      EXCEPTION WHEN object_in_use OR undefined_object THEN NULL;
      END;
    ELSE
      PERFORM pg_terminate_backend(pid);
    END IF;
    PERFORM pg_sleep(0.05);
  END LOOP;
  RAISE EXCEPTION 'replication slot {slot} is still in use after 10 s';
END $$"#
        );
        let failed = psql_as_admin(&[&sql]);
        if let Some(why) = failed {
            // Panicking in a Drop during a panic aborts the process and
            // hides the first failure; report it instead.
            if std::thread::panicking() {
                eprintln!("could not drop replication slot {slot}: {why}");
            } else {
                panic!(
                    "could not drop replication slot {slot}: {why} \
                     (tests/run.sh drops leftover slots at its start)"
                );
            }
        }
    }
}

/// Commits `ev` to the outbox in a transaction of its own, as a producer
/// would; returns the event's id, or the producer's error.
pub async fn try_enqueue_on(db: &Db, ev: NewEvent) -> Result<uuid::Uuid, EnqueueError> {
    with_pool!(db, |p| {
        let mut tx = p.begin().await?;
        let r = enqueue(&mut tx, ev).await?;
        tx.commit().await?;
        Ok(r.id().0)
    })
}

/// [`try_enqueue_on`], which must succeed.
pub async fn enqueue_on(db: &Db, ev: NewEvent) -> uuid::Uuid {
    try_enqueue_on(db, ev).await.expect("enqueue")
}

/// Commits one event of aggregate `agg`, type `ty`; returns its id.
pub async fn put(db: &Db, agg: &str, ty: &str, payload: Value) -> uuid::Uuid {
    enqueue_on(db, NewEvent::new(agg, ty, payload)).await
}

/// Rows of two text columns (the second may be NULL).
pub async fn pairs(db: &Db, sql: &str) -> Vec<(String, Option<String>)> {
    with_pool!(db, |p| sqlx::query(sql)
        .fetch_all(p)
        .await
        .expect(sql)
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// Sets `default_transaction_read_only` on the test's Postgres database.
pub async fn set_read_only(t: &TestDb, on: bool) {
    let name = &t.url[t.url.rfind('/').expect("url") + 1..];
    let admin = sqlx::PgPool::connect(&pg_admin_url()).await.expect("admin");
    sqlx::query(&format!(
        "ALTER DATABASE {name} SET default_transaction_read_only = {}",
        if on { "on" } else { "off" }
    ))
    .execute(&admin)
    .await
    .expect("ALTER DATABASE");
    admin.close().await;
}

/// A second connection to the test database that can only read: Postgres
/// with `default_transaction_read_only`, SQLite opened with `mode=ro`.
pub async fn read_only(t: &TestDb) -> Db {
    if t.is_postgres() {
        set_read_only(t, true).await;
        Db::connect(&t.url, 2).await.expect("connect read-only")
    } else {
        Db::connect(&format!("{}?mode=ro", t.url), 2)
            .await
            .expect("open read-only")
    }
}

/// Polls pg_locks until `n` lock requests of this database are waiting.
pub async fn wait_for_pg_lock_waiters(pool: &sqlx::PgPool, n: i64) {
    eventually(
        Duration::from_secs(10),
        "no transaction started waiting on the lock",
        async || {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                  WHERE NOT l.granted AND a.datname = current_database()",
            )
            .fetch_one(pool)
            .await
            .expect("pg_locks");
            if waiting >= n { Ok(()) } else { Err(waiting) }
        },
    )
    .await
}
