//! Shared test fixtures: a fresh database per test (Postgres or a SQLite
//! file), a scripted publisher, and small helpers.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outboxd::broker::PublishError;
use outboxd::broker::Publisher;
use outboxd::clock::{Clock, SystemClock};
use outboxd::message::OutgoingMessage;
use outboxd::relay::Relay;
use outboxd::relay::RelayConfig;
use outboxd::route::Router;
use outboxd::store::{AnyStore, Db, migrate};
use sqlx::Row;

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
    pub async fn enqueue(&self, event: outboxd::event::NewEvent) {
        match &self.db {
            Db::Postgres(p) => {
                let mut tx = p.begin().await.expect("begin");
                outboxd::store::enqueue(&mut tx, event)
                    .await
                    .expect("enqueue");
                tx.commit().await.expect("commit");
            }
            Db::Sqlite(p) => {
                let mut tx = p.begin().await.expect("begin");
                outboxd::store::enqueue(&mut tx, event)
                    .await
                    .expect("enqueue");
                tx.commit().await.expect("commit");
            }
        }
    }

    /// Runs a query returning one integer.
    pub async fn count(&self, sql: &str) -> i64 {
        match &self.db {
            Db::Postgres(p) => sqlx::query(sql)
                .fetch_one(p)
                .await
                .expect(sql)
                .get::<i64, _>(0),
            Db::Sqlite(p) => sqlx::query(sql)
                .fetch_one(p)
                .await
                .expect(sql)
                .get::<i64, _>(0),
        }
    }

    /// Runs a statement.
    pub async fn exec(&self, sql: &str) {
        match &self.db {
            Db::Postgres(p) => sqlx::raw_sql(sql).execute(p).await.map(|_| ()).expect(sql),
            Db::Sqlite(p) => sqlx::raw_sql(sql).execute(p).await.map(|_| ()).expect(sql),
        }
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

/// The grants of the test plugins' tables (`invoices`, `ledger`): what
/// their consumers' `tables` say.
pub fn plugin_tables() -> outboxd::config::TableGrants {
    outboxd::config::TableGrants {
        read: vec![],
        write: vec!["invoices".into(), "ledger".into()],
    }
}

/// The default policy of a test plugin's consumer: its tables granted.
pub fn plugin_policy() -> outboxd::config::TxnPolicy {
    outboxd::config::TxnPolicy {
        consumer: "test".into(),
        tables: plugin_tables(),
        ..outboxd::config::TxnPolicy::default()
    }
}

/// A broker stand-in that records what it acknowledges and fails on cue,
/// so a test can take the broker down and bring it back.
#[derive(Default)]
pub struct ScriptedPublisher {
    pub sent: Mutex<Vec<OutgoingMessage>>,
    pub failing: AtomicBool,
    pub permanent: AtomicBool,
}

impl ScriptedPublisher {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn failing() -> Arc<Self> {
        let p = Self::default();
        p.failing.store(true, Ordering::SeqCst);
        Arc::new(p)
    }

    pub fn set_failing(&self, on: bool) {
        self.failing.store(on, Ordering::SeqCst);
    }

    pub fn sent(&self) -> Vec<OutgoingMessage> {
        self.sent.lock().expect("lock").clone()
    }
}

impl Publisher for ScriptedPublisher {
    async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(if self.permanent.load(Ordering::SeqCst) {
                PublishError::Permanent("message too large".into())
            } else {
                PublishError::Retryable("broker unavailable".into())
            });
        }
        self.sent.lock().expect("lock").push(msg);
        Ok(())
    }
}

/// Runs `$body(TestDb)` once on Postgres and once on SQLite, as two tests.
#[macro_export]
macro_rules! on_both {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name($crate::support::TestDb::postgres().await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name($crate::support::TestDb::sqlite().await).await
            }
        }
    };
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
        match &self.db {
            Db::Postgres(p) => sqlx::query(sql)
                .fetch_one(p)
                .await
                .expect(sql)
                .get::<String, _>(0),
            Db::Sqlite(p) => sqlx::query(sql)
                .fetch_one(p)
                .await
                .expect(sql)
                .get::<String, _>(0),
        }
    }
}

/// The outboxd config of a WAL relay test: this database, `relay.source =
/// "wal"` on `slot`, one reader, short retry and status intervals, a fast
/// backoff with room for many attempts (an outage must not kill events),
/// the embedded transport; then `extra` (TOML sections) appended.
pub fn wal_config_toml(url: &str, slot: &str, extra: &str) -> String {
    format!(
        r#"
[database]
url = "{url}"
max_connections = 16

[relay]
source = "wal"
workers = 1
batch_size = 50
poll_interval = "50ms"
publish_timeout = "5s"
max_attempts = 1000

[relay.backoff]
base_seconds = 0.05
max_seconds = 0.5

[relay.wal]
slot = "{slot}"
standby_retry = "250ms"
status_interval = "250ms"
sender_timeout = "5s"

{extra}
"#
    )
}

/// [`wal_config_toml`], parsed and validated as `outboxd run` would.
pub fn wal_config(url: &str, slot: &str, extra: &str) -> outboxd::config::Config {
    let text = wal_config_toml(url, slot, extra);
    outboxd::config::Config::from_toml("(WAL test config)", &text, std::iter::empty())
        .unwrap_or_else(|e| panic!("the WAL test config is refused: {e}\n{text}"))
}

/// The cluster has a fixed number of replication slots
/// (`max_replication_slots`); nextest's `wal` group (.config/nextest.toml)
/// bounds how many of these tests run at once. Under plain `cargo test`,
/// or next to a chaos soak holding slots, this waits for one to be free
/// rather than failing on a full cluster.
async fn wait_for_a_free_slot(t: &TestDb) {
    let started = std::time::Instant::now();
    loop {
        let free = t
            .count(
                "SELECT current_setting('max_replication_slots')::bigint - (SELECT count(*) FROM pg_replication_slots)",
            )
            .await;
        if free > 0 {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "no free replication slot on {} for 3 minutes (max_replication_slots is full): \
             see `SELECT slot_name, database, active FROM pg_replication_slots`; \
             tests/run.sh drops the slots earlier runs left",
            pg_admin_url()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
