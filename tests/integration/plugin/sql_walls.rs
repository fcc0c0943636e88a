//! The databases' own walls around consumer-plugin SQL, tested without the
//! capability gate in front of them (a gap in the gate must not be a
//! breach), and the bounds that hold whatever gets through: the Postgres
//! role, SQLite's authorizer, the value-size bound, the server-side cancel
//! at the wall deadline, the session reset before commit and `emit` as the
//! host.

use std::time::{Duration, Instant};

use outboxd::config::TxnPolicy;
use outboxd::config::{ConsumerSection, TableGrants};
use outboxd::consumer::Handler;
use outboxd::consumer::process;
use outboxd::store::Db;
use outboxd::store::InboxTx;
use outboxd::store::backend::sqlite_plugin_guard;
use outboxd::store::backend::sqlite_plugin_guard::PluginPolicy;
use serde_json::json;

use crate::support::plugins::{doubling_bomb, engine, handler, order, plugin_path, seed_tables};
use crate::support::process::outboxd;
use crate::support::{TestDb, on_both};

fn grants() -> TableGrants {
    TableGrants {
        read: vec!["customers".into(), "blobs".into()],
        write: vec!["invoices".into()],
    }
}

fn attacked() -> ConsumerSection {
    let mut c = ConsumerSection::new("attacked", vec!["t".into()], "plugin:attack");
    c.tables = grants();
    c
}

/// What a plugin's statements may never do, as SQL the gate would refuse.
const BEYOND_THE_GRANTS: &[&str] = &[
    "CREATE TEMP TABLE inbox (consumer text)",
    "SELECT * INTO TEMP stolen FROM invoices",
    "DELETE FROM inbox",
    "UPDATE outbox SET published_at = NULL",
    "DELETE FROM transport_messages",
    "DELETE FROM plugin_activations",
    "SELECT secret FROM secrets",
    "UPDATE customers SET name = 'x'",
    "CREATE TABLE evil (x int)",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_role_alone_holds_the_plugin_to_its_grants() {
    let t = TestDb::postgres().await;
    seed_tables(&t).await;
    // A `serial` column: its sequence is granted with the table.
    t.exec_app("CREATE TABLE notes (id serial PRIMARY KEY, note text NOT NULL)")
        .await;
    let mut c = attacked();
    c.tables.write.push("notes".into());
    let role = t.provision_plugin_role(&mut c).await.expect("a role");
    let Db::Postgres(pool) = &t.db else {
        unreachable!()
    };
    outboxd::store::plugin_sql::roles::check(pool, 0, &c)
        .await
        .expect("the provisioned role is safe");
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query(&format!("SET LOCAL ROLE \"{role}\""))
        .execute(&mut *tx)
        .await
        .expect("set role");
    let mut attempts = BEYOND_THE_GRANTS.to_vec();
    attempts.extend([
        "SELECT outbox_enqueue('a', 'b', '{}'::jsonb, '{}'::jsonb)",
        "SELECT passwd FROM pg_shadow",
        // outboxd's schema: the role has no USAGE on it.
        "DELETE FROM outboxd.inbox",
        "SELECT * FROM outboxd.outbox",
        "SELECT * FROM \"outboxd\".\"plugins\"",
    ]);
    for sql in attempts {
        sqlx::query("SAVEPOINT s")
            .execute(&mut *tx)
            .await
            .expect("sp");
        let err = sqlx::raw_sql(sql).execute(&mut *tx).await.expect_err(sql);
        let code = err
            .as_database_error()
            .and_then(|d| d.code().map(|c| c.into_owned()));
        // outboxd's tables are not even visible to name resolution under
        // the role (it has no USAGE on their schema): they do not exist for
        // it. The view `outbox` left for earlier producers (migration 0011)
        // is visible, and denied.
        let hidden = ["inbox", "transport_messages", "plugin_activations"]
            .iter()
            .any(|t| sql.ends_with(&format!("FROM {t}")));
        let want = if hidden { "42P01" } else { "42501" };
        assert_eq!(code.as_deref(), Some(want), "{sql}: {err}");
        sqlx::query("ROLLBACK TO SAVEPOINT s")
            .execute(&mut *tx)
            .await
            .expect("rollback to");
    }
    for sql in [
        "INSERT INTO notes (note) VALUES ('a serial id')",
        "SELECT count(*) FROM customers",
        "INSERT INTO invoices (order_id, customer_id, amount_cents, message_id, issued_at) VALUES ('o', 'c', 1, 'm', 0)",
        "UPDATE invoices SET amount_cents = 2",
        "DELETE FROM invoices",
    ] {
        sqlx::raw_sql(sql)
            .execute(&mut *tx)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    tx.rollback().await.expect("rollback");
}

/// A consumer plugin on Postgres does not start under a role that could
/// reach more than its tables; the error names the key and shows the SQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsafe_role_is_refused_with_the_key_and_the_sql() {
    let t = TestDb::postgres().await;
    seed_tables(&t).await;
    let Db::Postgres(pool) = &t.db else {
        unreachable!()
    };
    let database = t.url.rsplit('/').next().expect("db name").to_string();
    let role = format!("{database}_loose");
    t.exec(&format!("CREATE ROLE \"{role}\" NOLOGIN")).await;
    t.exec(&format!(
        "GRANT SELECT, INSERT ON invoices, inbox TO \"{role}\""
    ))
    .await;
    t.exec(&format!("GRANT USAGE ON SCHEMA outboxd TO \"{role}\""))
        .await;
    let mut c = attacked();
    c.db_role = Some(role.clone());
    let err = outboxd::store::plugin_sql::roles::check(pool, 3, &c)
        .await
        .expect_err("TEMP is granted to PUBLIC, and inbox to the role")
        .to_string();
    for part in [
        "consumers[3].db_role",
        "temporary tables",
        "outboxd's table `outboxd.inbox`",
        "USAGE on outboxd's schema `outboxd`",
        "REVOKE ALL ON SCHEMA \"outboxd\" FROM",
        "REVOKE TEMPORARY ON DATABASE",
        "GRANT SELECT ON \"public\".\"customers\"",
    ] {
        assert!(err.contains(part), "missing `{part}` in:\n{err}");
    }
    let missing = outboxd::store::plugin_sql::roles::check(
        pool,
        0,
        &ConsumerSection {
            db_role: Some("no_such_role_anywhere".into()),
            ..attacked()
        },
    )
    .await
    .expect_err("no such role")
    .to_string();
    assert!(missing.contains("does not exist"), "{missing}");
    // The same refusal stops `outboxd run` before any consumer starts.
    let out = outboxd(&t)
        .arg("run")
        .env(
            "OUTBOXD__PLUGINS",
            format!(
                r#"[{{name = "attack", path = "{}"}}]"#,
                plugin_path("hostile-consumer-attack").display()
            ),
        )
        .env(
            "OUTBOXD__CONSUMERS",
            format!(
                r#"[{{name = "attacked", topics = ["t"], handler = "plugin:attack", tables = {{read = ["customers"], write = ["invoices"]}}, db_role = "{role}"}}]"#
            ),
        )
        .output()
        .await
        .expect("run outboxd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started under an unsafe role");
    assert!(
        stderr.contains("consumers[0].db_role") && stderr.contains("REVOKE TEMPORARY"),
        "{stderr}"
    );
    t.exec(&format!("DROP OWNED BY \"{role}\"")).await;
    t.exec(&format!("DROP ROLE \"{role}\"")).await;
}

fn sqlite_policy(deadline: Duration) -> PluginPolicy {
    PluginPolicy {
        consumer: "attacked".into(),
        grants: grants(),
        deadline: Instant::now() + deadline,
        max_value_bytes: 1 << 20,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlites_authorizer_alone_holds_the_plugin_to_its_grants() {
    let t = TestDb::sqlite().await;
    seed_tables(&t).await;
    let Db::Sqlite(pool) = &t.db else {
        unreachable!()
    };
    let mut conn = pool.acquire().await.expect("a connection");
    let mut attempts = BEYOND_THE_GRANTS.to_vec();
    attempts.extend([
        "SELECT sql FROM sqlite_master",
        "ATTACH DATABASE ':memory:' AS evil",
        "PRAGMA writable_schema = ON",
        "SELECT zeroblob(10)",
        "SELECT load_extension('/tmp/outboxd-evil.so')",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
        "SELECT * FROM pragma_table_info('inbox')",
        "INSERT INTO temp.sqlite_master VALUES ('table', 'x', 'x', 0, '')",
        "BEGIN",
        "COMMIT",
    ]);
    for sql in attempts {
        let active = sqlite_plugin_guard::begin(&mut conn, sqlite_policy(Duration::from_secs(5)))
            .await
            .expect("guard");
        let result = sqlx::query(sql).persistent(false).execute(&mut *conn).await;
        let refused = active.end(&mut conn).await.expect("end");
        assert!(result.is_err(), "{sql} ran under the authorizer");
        let why = refused.unwrap_or_else(|| format!("{:?}", result.err()));
        // SQLite has no SELECT … INTO: its parser refuses that one.
        assert!(
            why.contains("not in consumers[attacked].tables")
                || why.contains("outboxd's own table")
                || why.contains("not allowed")
                || why.contains("allowlist")
                || why.contains("the host owns the transaction")
                || why.contains("syntax error"),
            "{sql}: {why}"
        );
    }
    // Within the grants it runs, and the host's own statements run on the
    // same connection once the policy ended.
    for sql in [
        "SELECT count(*) FROM customers",
        "INSERT INTO invoices (order_id, customer_id, amount_cents, message_id, issued_at) VALUES ('o', 'c', 1, 'm', 0)",
        "DELETE FROM invoices",
    ] {
        let active = sqlite_plugin_guard::begin(&mut conn, sqlite_policy(Duration::from_secs(5)))
            .await
            .expect("guard");
        let result = sqlx::query(sql).persistent(false).execute(&mut *conn).await;
        let refused = active.end(&mut conn).await.expect("end");
        assert!(result.is_ok(), "{sql}: {result:?} {refused:?}");
    }
    sqlx::query("SELECT count(*) FROM inbox")
        .execute(&mut *conn)
        .await
        .expect("the host's statement after the policy ended");

    // The deadline interrupts a statement that passes every check.
    let active = sqlite_plugin_guard::begin(&mut conn, sqlite_policy(Duration::from_millis(200)))
        .await
        .expect("guard");
    let start = Instant::now();
    let result = sqlx::query(
        "SELECT count(*) FROM customers a, customers b, customers c, customers d, customers e",
    )
    .persistent(false)
    .execute(&mut *conn)
    .await;
    let refused = active.end(&mut conn).await.expect("end");
    assert!(result.is_err(), "the time bomb ran to the end");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert!(
        refused.as_deref().is_some_and(|r| r.contains("deadline")),
        "{refused:?}"
    );
    // A value beyond max_value_bytes is refused by SQLite itself.
    let active = sqlite_plugin_guard::begin(&mut conn, sqlite_policy(Duration::from_secs(5)))
        .await
        .expect("guard");
    let result = sqlx::query(&doubling_bomb(5, 60_000))
        .persistent(false)
        .execute(&mut *conn)
        .await;
    active.end(&mut conn).await.expect("end");
    let err = result.expect_err("1.9 MB past a 1 MiB limit");
    assert!(err.to_string().contains("too big"), "{err}");
}

fn peak_rss_reset() {
    // Writing 5 resets the peak resident set size (VmHWM) to the current.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

/// Giant values stop where they are built: on the server (the result-row
/// wrapper) or in SQLite (its length limit); the host's peak RSS stays
/// within 256 MiB of idle. Each test runs in its own process under
/// nextest, so the peak is this test's.
async fn giant_values_never_reach_the_hosts_memory(t: TestDb) {
    seed_tables(&t).await;
    let policy = TxnPolicy {
        consumer: "attacked".into(),
        tables: grants(),
        statement_timeout: std::time::Duration::from_millis(30_000),
        ..TxnPolicy::default()
    };
    // Room for Postgres to build 300 MB and measure it (about 4 s here):
    // the test is about where the value stops, not about the deadline.
    let mut spec = outboxd::config::PluginSpec::new(
        "hostile-consumer-attack",
        plugin_path("hostile-consumer-attack"),
    );
    spec.limits.timeout = std::time::Duration::from_millis(20_000);
    let plugin = outboxd::plugin::ConsumerPlugin::load(engine(), &spec).expect("load the plugin");
    let h = outboxd::consumer::PluginHandler::new(std::sync::Arc::new(plugin), policy.clone());
    let innocent = |offset: i64| {
        let mut d = order(offset, &format!("i{offset}"));
        d.payload = serde_json::to_vec(&json!({ "order_id": format!("i{offset}") })).expect("json");
        d
    };
    process(&t.db, "attacked", &innocent(0), &h)
        .await
        .expect("warm-up");
    let idle = kib("VmRSS:");
    peak_rss_reset();
    // Each bomb, and what must stop it.
    let bombs = [
        (
            "SELECT repeat('x', 300000000)".to_string(),
            "function `repeat` is not on plugin SQL's allowlist",
        ),
        (
            "WITH RECURSIVE b(x) AS (SELECT zeroblob(1000000) UNION ALL SELECT x || x FROM b) SELECT length(x) FROM b".to_string(),
            "WITH RECURSIVE is not allowed",
        ),
        // Past the gate: 300 MB built from a 100 MB value, stopped by the
        // value bound (the server's row check, SQLite's length limit).
        (
            "SELECT b || b || b FROM blobs".to_string(),
            if t.is_postgres() {
                "max_result_bytes"
            } else {
                "string or blob too big"
            },
        ),
        // Refused by the gate: they would grow 2^13- and 2^25-fold when
        // planned, before any deadline runs.
        (doubling_bomb(13, 60_000), "too complex"),
        (doubling_bomb(25, 16), "too complex"),
    ];
    for (i, (sql, stopped_by)) in bombs.iter().enumerate() {
        let mut d = order(10 + i as i64, &format!("bomb{i}"));
        d.payload = serde_json::to_vec(&json!({ "sql": sql, "query": true })).expect("json");
        let err = process(&t.db, "attacked", &d, &h)
            .await
            .expect_err("the bomb is stopped");
        let text = err.to_string();
        assert!(text.contains(stopped_by), "bomb {i}: {text}");
    }
    let peak = kib("VmHWM:");
    let grew_mib = peak.saturating_sub(idle) / 1024;
    eprintln!(
        "idle {} MiB, peak {} MiB, +{grew_mib} MiB",
        idle / 1024,
        peak / 1024
    );
    assert!(grew_mib < 256, "peak RSS grew by {grew_mib} MiB");
    // Many small rows are capped in bytes per message.
    let tight = handler(
        "hostile-consumer-attack",
        &[],
        TxnPolicy {
            max_result_bytes: 10_000,
            ..policy
        },
    );
    let mut d = order(20, "many");
    d.payload = serde_json::to_vec(&json!({
        "sql": "SELECT a.name, b.name FROM customers a, customers b",
        "query": true
    }))
    .expect("json");
    let err = process(&t.db, "attacked", &d, &tight)
        .await
        .expect_err("over the byte budget");
    assert!(err.to_string().contains("max_result_bytes"), "{err}");
    process(&t.db, "attacked", &innocent(30), &h)
        .await
        .expect("the plugin keeps serving");
}
on_both!(giant_values_never_reach_the_hosts_memory);

/// At the wall deadline the statement is cancelled on the server, not only
/// abandoned: here the statement timeout has been lifted (as a gap would),
/// and the rollback after the deadline must not wait for the query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wall_deadline_cancels_the_statement_on_the_server() {
    let t = TestDb::postgres().await;
    seed_tables(&t).await;
    let Db::Postgres(pool) = &t.db else {
        unreachable!()
    };
    let mut spec = outboxd::config::PluginSpec::new(
        "hostile-consumer-attack",
        plugin_path("hostile-consumer-attack"),
    );
    spec.limits.timeout = std::time::Duration::from_millis(300);
    let plugin = outboxd::plugin::ConsumerPlugin::load(engine(), &spec).expect("load the plugin");
    // The role is what `outboxd run` requires on Postgres; setting it also
    // reads the backend's pid, which the cancel needs.
    let mut c = attacked();
    let role = t.provision_plugin_role(&mut c).await.expect("role");
    let policy = TxnPolicy {
        consumer: "attacked".into(),
        tables: grants(),
        db_role: Some(role),
        statement_timeout: std::time::Duration::from_millis(500),
        ..TxnPolicy::default()
    };
    let message = outboxd::plugin::bindings::consumer::outbox::plugin::types::Message {
        id: uuid::Uuid::new_v4().to_string(),
        topic: "t".into(),
        key: None,
        payload: serde_json::to_vec(&json!({
            "sql": "SELECT count(*) FROM customers a, customers b, customers c, customers d, customers e, customers f",
            "query": true
        }))
        .expect("json"),
        headers: vec![],
        attempt: 1,
    };
    let mut tx = InboxTx::Postgres(pool.begin().await.expect("begin").into());
    if let InboxTx::Postgres(inner) = &mut tx {
        sqlx::query("SET LOCAL statement_timeout = 0")
            .execute(&mut **inner)
            .await
            .expect("lift the bound");
    }
    let start = Instant::now();
    let err = plugin
        .handle_cancellable(&mut tx, &message, &policy, Some(&t.db))
        .await
        .expect_err("past the wall deadline");
    assert!(err.to_string().contains("timed out"), "{err}");
    let InboxTx::Postgres(inner) = tx else {
        unreachable!()
    };
    tokio::time::timeout(Duration::from_secs(10), inner.rollback())
        .await
        .expect("the rollback waited for the abandoned query: it was not cancelled")
        .expect("rollback");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(
        t.count("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%customers f%' AND state = 'active' AND pid <> pg_backend_pid()")
            .await,
        0
    );
}

/// A Postgres database with the attacked tables, and the attack plugin
/// under a provisioned role of its own.
async fn attack_under_its_role() -> (TestDb, outboxd::consumer::PluginHandler) {
    let t = TestDb::postgres().await;
    seed_tables(&t).await;
    let mut c = attacked();
    let role = t.provision_plugin_role(&mut c).await.expect("role");
    let h = handler(
        "hostile-consumer-attack",
        &[],
        TxnPolicy {
            consumer: "attacked".into(),
            tables: grants(),
            db_role: Some(role),
            ..TxnPolicy::default()
        },
    );
    (t, h)
}

/// `emit` runs as the host, even after the plugin's statements set its
/// role: the role has no right on the outbox, and needs none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emit_runs_as_the_host_after_the_plugins_statements() {
    let (t, h) = attack_under_its_role().await;
    let mut d = order(1, "emit");
    d.payload = serde_json::to_vec(&json!({
        "sql": "SELECT count(*) FROM customers",
        "query": true,
        "emit_after": true
    }))
    .expect("json");
    process(&t.db, "attacked", &d, &h)
        .await
        .expect("the event is emitted as the host");
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE event_type = 'attack.emitted'")
            .await,
        1
    );
}

/// Whatever a plugin statement left on the session (a setting, a temporary
/// table, a session advisory lock) is gone before the connection goes back to the pool: here the
/// host itself leaves them, as a gap in every other layer would, on a pool
/// of one connection so the next transaction gets the same session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_is_reset_before_the_connection_goes_back() {
    let t = TestDb::postgres().await;
    let db = Db::connect(&t.url, 1).await.expect("a pool of one");
    let Db::Postgres(pool) = &db else {
        unreachable!()
    };
    let h = handler("hostile-consumer-attack", &[], TxnPolicy::default());
    let mut tx = InboxTx::Postgres(pool.begin().await.expect("begin").into());
    if let InboxTx::Postgres(inner) = &mut tx {
        sqlx::raw_sql(
            "SELECT set_config('default_transaction_read_only', 'on', false);
             CREATE TEMP TABLE inbox (consumer text, message_id text);
             SELECT pg_advisory_lock(4242)",
        )
        .execute(&mut **inner)
        .await
        .expect("poison the session");
    }
    h.before_commit(&mut tx).await.expect("reset");
    let InboxTx::Postgres(inner) = tx else {
        unreachable!()
    };
    inner.commit().await.expect("commit");
    let mut next = pool.begin().await.expect("the next transaction");
    let read_only: String = sqlx::query_scalar("SHOW default_transaction_read_only")
        .fetch_one(&mut *next)
        .await
        .expect("show");
    assert_eq!(read_only, "off");
    let temps: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_class WHERE relpersistence = 't'")
        .fetch_one(&mut *next)
        .await
        .expect("temps");
    assert_eq!(temps, 0);
    let locks: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242",
    )
    .fetch_one(&mut *next)
    .await
    .expect("locks");
    assert_eq!(locks, 0, "a session advisory lock outlived the transaction");
    sqlx::query("INSERT INTO inbox (consumer, message_id) VALUES ('c', gen_random_uuid())")
        .execute(&mut *next)
        .await
        .expect("the host's inbox, writable");
    next.rollback().await.expect("rollback");
}

/// In a batch the plugin's role stays set from one message to the next
/// (one switch per batch, not two per message), and the host's own
/// statements still run as the host: here a refused statement fails the
/// third message, and the rerun of the first two writes their inbox marks
/// after the plugin's statements, which the plugin's role could not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_batch_the_host_writes_as_itself_between_the_plugins_statements() {
    let (t, h) = attack_under_its_role().await;
    let message = |i: i64, body: serde_json::Value| {
        let mut d = order(i, &format!("batch-{i}"));
        d.payload = serde_json::to_vec(&body).expect("json");
        d
    };
    let all_good: Vec<_> = (0..4)
        .map(|i| {
            message(
                i,
                json!({"sql": "SELECT count(*) FROM customers", "query": true}),
            )
        })
        .collect();
    let attempts = outboxd::consumer::batch::attempt_batch(&t.db, "attacked", &all_good, &h)
        .await
        .expect("a batch of four");
    assert!(attempts.iter().all(|a| a.result.is_ok()), "{attempts:?}");
    let with_emit = vec![
        message(
            10,
            json!({"sql": "SELECT count(*) FROM customers", "query": true, "emit_after": true}),
        ),
        message(
            11,
            json!({"sql": "SELECT count(*) FROM customers", "query": true}),
        ),
        message(12, json!({"sql": "DELETE FROM inbox"})),
        message(
            13,
            json!({"sql": "SELECT count(*) FROM customers", "query": true}),
        ),
    ];
    let attempts = outboxd::consumer::batch::attempt_batch(&t.db, "attacked", &with_emit, &h)
        .await
        .expect("a batch that fails at its third message");
    assert_eq!(attempts.len(), 3, "{attempts:?}");
    assert!(
        attempts[0].result.is_ok() && attempts[1].result.is_ok(),
        "{attempts:?}"
    );
    assert!(attempts[2].result.is_err(), "{attempts:?}");
    assert_eq!(
        t.count("SELECT count(*) FROM inbox WHERE consumer = 'attacked'")
            .await,
        6,
        "four marks, then the two of the rerun prefix"
    );
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE event_type = 'attack.emitted'")
            .await,
        1
    );
}
