//! The hostile SQL corpus, so that every known way out of the consumer
//! plugin's SQL sandbox stays shut: one running `outboxd run` process,
//! one consumer plugin that runs whatever SQL its message carries, and
//! every attack below on both databases. Each attack must be refused or
//! cut off, with the reason in the dead letter; right after it, 20
//! innocent messages through the same process (relay, embedded transport,
//! consumer) must each take effect exactly once. At the end the host's
//! tables are whole: every event published once, no temporary objects
//! left, nothing forged.

use std::process::Stdio;
use std::time::Duration;

use outboxd::config::{ConsumerSection, TableGrants};
use outboxd::event::NewEvent;
use serde_json::{Value, json};

use crate::support::plugins::{doubling_bomb, plugin_path, seed_tables};
use crate::support::process::outboxd;
use crate::support::{TestDb, on_both};

/// One attack: its class, the statement, and whether it is sent with
/// `query` (rows back to the plugin) rather than `execute`.
struct Attack {
    class: &'static str,
    sql: String,
    query: bool,
}

fn a(class: &'static str, sql: &str, query: bool) -> Attack {
    Attack {
        class,
        sql: sql.to_string(),
        query,
    }
}

fn corpus() -> Vec<Attack> {
    vec![
        // Temporary objects: a temporary `inbox` would shadow the host's.
        a(
            "temporary objects",
            "SELECT * INTO TEMP inbox FROM invoices",
            false,
        ),
        a(
            "temporary objects",
            "SELECT 1 AS consumer INTO TEMPORARY TABLE outbox",
            false,
        ),
        a(
            "temporary objects",
            "CREATE TEMP TABLE inbox (consumer text, message_id text)",
            false,
        ),
        a(
            "temporary objects",
            "CREATE TEMPORARY VIEW transport_messages AS SELECT 1 AS x",
            false,
        ),
        a(
            "temporary objects",
            "INSERT INTO temp.inbox (consumer) VALUES ('x')",
            false,
        ),
        a(
            "temporary objects",
            "INSERT INTO pg_temp.inbox (consumer) VALUES ('x')",
            false,
        ),
        // Settings, by every route.
        a(
            "settings",
            "UPDATE pg_settings SET setting = 'on' WHERE name = 'default_transaction_read_only'",
            false,
        ),
        a(
            "settings",
            "SELECT set_config('default_transaction_read_only', 'on', false)",
            true,
        ),
        a(
            "settings",
            "SELECT set_config('statement_timeout', '0', false)",
            true,
        ),
        a(
            "settings",
            "SELECT name FROM customers WHERE id = CAST(length(set_config('role', 'postgres', true)) AS text)",
            true,
        ),
        a(
            "settings",
            "SET SESSION default_transaction_read_only = on",
            false,
        ),
        a("settings", "SET statement_timeout = 0", false),
        a("settings", "RESET ROLE", false),
        a("settings", "SELECT current_setting('data_directory')", true),
        a("settings", "ALTER SYSTEM SET fsync = off", false),
        a("settings", "PRAGMA journal_mode = OFF", false),
        // The host's tables, directly and through CTEs.
        a("host tables", "DELETE FROM inbox", false),
        a(
            "host tables",
            "UPDATE outbox SET published_at = NULL",
            false,
        ),
        a("host tables", "DELETE FROM transport_messages", false),
        a(
            "host tables",
            "UPDATE transport_cursors SET next_offset = 0",
            false,
        ),
        a("host tables", "DELETE FROM plugin_activations", false),
        a(
            "host tables",
            "WITH gone AS (DELETE FROM inbox RETURNING 1) SELECT count(*) FROM gone",
            true,
        ),
        a(
            "host tables",
            "WITH i AS (SELECT * FROM inbox) SELECT count(*) FROM i",
            true,
        ),
        a(
            "host tables",
            "INSERT INTO invoices (order_id, customer_id, amount_cents, message_id, issued_at) SELECT aggregate_id, 'x', 1, 'x', 0 FROM outbox",
            false,
        ),
        a(
            "host tables",
            "SELECT count(*) FROM customers WHERE id IN (SELECT consumer FROM inbox)",
            true,
        ),
        // Catalogs and other schemas.
        a("catalogs", "SELECT usename, passwd FROM pg_shadow", true),
        a(
            "catalogs",
            "SELECT rolname, rolpassword FROM pg_catalog.pg_authid",
            true,
        ),
        a(
            "catalogs",
            "SELECT table_name FROM information_schema.tables",
            true,
        ),
        a("catalogs", "SELECT sql FROM sqlite_master", true),
        a("catalogs", "SELECT secret FROM secrets", true),
        a("catalogs", "SELECT * FROM public.inbox", true),
        a("catalogs", "SELECT * FROM main.inbox", true),
        // Row locks.
        a("row locks", "SELECT * FROM customers FOR UPDATE", true),
        a("row locks", "SELECT * FROM invoices FOR SHARE", true),
        a(
            "row locks",
            "LOCK TABLE invoices IN ACCESS EXCLUSIVE MODE",
            false,
        ),
        a("row locks", "SELECT pg_advisory_lock(42)", true),
        // Byte and time bombs.
        a("byte and time bombs", "SELECT repeat('x', 300000000)", true),
        a(
            "byte and time bombs",
            "SELECT lpad('x', 300000000, 'y')",
            true,
        ),
        a("byte and time bombs", "SELECT zeroblob(300000000)", true),
        a(
            "byte and time bombs",
            "WITH RECURSIVE b(x) AS (SELECT zeroblob(1000000) UNION ALL SELECT x || x FROM b) SELECT length(x) FROM b",
            true,
        ),
        a(
            "byte and time bombs",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
            true,
        ),
        a(
            "byte and time bombs",
            "SELECT count(*) FROM customers a, customers b, customers c, customers d, customers e, customers f",
            true,
        ),
        a("byte and time bombs", "SELECT b || b || b FROM blobs", true),
        Attack {
            class: "byte and time bombs",
            sql: doubling_bomb(13, 60_000),
            query: true,
        },
        // A planner bomb: 2^25 nodes once the subqueries are inlined.
        Attack {
            class: "byte and time bombs",
            sql: doubling_bomb(25, 16),
            query: true,
        },
        a("byte and time bombs", "SELECT pg_sleep(60)", true),
        // Files, large objects and the network.
        a(
            "files and network",
            "SELECT pg_read_file('/etc/passwd')",
            true,
        ),
        a("files and network", "SELECT lo_import('/etc/passwd')", true),
        a(
            "files and network",
            "COPY invoices TO '/tmp/outboxd-stolen'",
            false,
        ),
        a("files and network", "SELECT readfile('/etc/passwd')", true),
        a(
            "files and network",
            "SELECT dblink('host=127.0.0.1', 'select 1')",
            true,
        ),
        a("files and network", "SELECT * FROM pg_ls_dir('.')", true),
        // Qualified, quoted and Unicode-escaped names.
        a("names", "DELETE FROM \"inbox\"", false),
        a("names", "DELETE FROM INBOX", false),
        a("names", "DELETE FROM U&\"\\0069nbox\"", false),
        a("names", "SELECT * FROM \"public\".\"outbox\"", true),
        // Comments and dollar quotes.
        a(
            "comments and quotes",
            "SELECT 1 /* x */; DELETE FROM inbox",
            false,
        ),
        a("comments and quotes", "DELETE/**/FROM/**/inbox", false),
        a(
            "comments and quotes",
            "SELECT $$x$$; DELETE FROM inbox --$$",
            false,
        ),
        a(
            "comments and quotes",
            "SELECT 1 --\r\nDELETE FROM inbox",
            false,
        ),
        // SQLite's own doors.
        a(
            "sqlite doors",
            "ATTACH DATABASE '/tmp/outboxd-evil.db' AS evil",
            false,
        ),
        a("sqlite doors", "PRAGMA writable_schema = ON", false),
        a(
            "sqlite doors",
            "SELECT load_extension('/tmp/outboxd-evil.so')",
            true,
        ),
        a(
            "sqlite doors",
            "SELECT * FROM pragma_table_info('inbox')",
            true,
        ),
        a("sqlite doors", "VACUUM INTO '/tmp/outboxd-copy.db'", false),
        // The host's transaction.
        a("transaction control", "COMMIT", false),
        a("transaction control", "ROLLBACK", false),
        a("transaction control", "SAVEPOINT x", false),
        a("transaction control", "END", false),
    ]
}

/// What a refusal or a cut-off says in the dead letter: the host's own
/// words (`statement refused`, `budget exceeded`, the wall deadline), or
/// the database's statement timeout, permission or size error.
const STOPPED: &[&str] = &[
    // The wall deadline (the statement is cancelled on the server too).
    "timed out after",
    "statement refused",
    "budget exceeded",
    "57014",
    "42501",
    "54000",
    "too big",
];

async fn send(t: &TestDb, aggregate: String, payload: Value) {
    t.enqueue(NewEvent::new(aggregate, "attack.msg", payload))
        .await;
}

async fn every_attack_is_stopped_and_the_next_messages_run_exactly_once(t: TestDb) {
    seed_tables(&t).await;
    let mut section = ConsumerSection::new("attacked", vec!["attack.msg".into()], "plugin:attack");
    section.tables = TableGrants {
        read: vec!["customers".into(), "blobs".into()],
        write: vec!["invoices".into()],
    };
    let role = match t.provision_plugin_role(&mut section).await {
        Some(r) => format!(", db_role = \"{r}\""),
        None => String::new(),
    };
    let plugins = format!(
        r#"[{{name = "attack", path = "{}", limits = {{timeout_ms = 3000}}}}]"#,
        plugin_path("hostile-consumer-attack").display()
    );
    let consumers = format!(
        r#"[{{name = "attacked", topics = ["attack.msg"], handler = "plugin:attack", max_attempts = 1, statement_timeout_ms = 1000, tables = {{read = ["customers", "blobs"], write = ["invoices"]}}{role}}}]"#
    );
    let mut child = outboxd(&t)
        .arg("run")
        .env("OUTBOXD__PLUGINS", &plugins)
        .env("OUTBOXD__CONSUMERS", &consumers)
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn outboxd run");

    let attacks = corpus();
    let mut report = Vec::new();
    for (k, attack) in attacks.iter().enumerate() {
        let what = format!("attack {k} ({}): {}", attack.class, attack.sql);
        send(
            &t,
            format!("attack-{k}"),
            json!({ "sql": attack.sql, "query": attack.query }),
        )
        .await;
        for j in 0..20 {
            send(
                &t,
                format!("innocent-{k}-{j}"),
                json!({ "order_id": format!("{k}-{j}") }),
            )
            .await;
        }
        t.wait_count(
            Duration::from_secs(90),
            "SELECT count(*) FROM consumer_dead_letters WHERE consumer = 'attacked'",
            k as i64 + 1,
        )
        .await;
        t.wait_count(
            Duration::from_secs(90),
            &format!("SELECT count(*) FROM invoices WHERE order_id LIKE '{k}-%'"),
            20,
        )
        .await;
        let reason = t
            .text(
            "SELECT error FROM consumer_dead_letters WHERE consumer = 'attacked' ORDER BY id DESC LIMIT 1",
        )
        .await;
        assert!(
            STOPPED.iter().any(|s| reason.contains(s)),
            "{what}: not refused or cut off with a reason: {reason}"
        );
        report.push(format!(
            "{:<22} {:<60.60} {reason:.160}",
            attack.class, attack.sql
        ));
    }
    // Exactly once each: 20 invoices per attack, every one distinct, none
    // from an attack.
    let innocents = 20 * attacks.len() as i64;
    assert_eq!(t.count("SELECT count(*) FROM invoices").await, innocents);
    assert_eq!(
        t.count("SELECT count(DISTINCT order_id) FROM invoices")
            .await,
        innocents
    );
    assert_eq!(
        t.count("SELECT count(*) FROM inbox WHERE consumer = 'attacked'")
            .await,
        innocents
    );
    // The relay kept publishing every event once, and nothing was forged.
    let events = innocents + attacks.len() as i64;
    t.wait_count(
        Duration::from_secs(90),
        "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL",
        events,
    )
    .await;
    assert_eq!(t.count("SELECT count(*) FROM outbox").await, events);
    // At least once: a SQLite writer held by a plugin statement (up to its
    // deadline) can outlast a relay's lease, and the batch is published
    // again; the inbox made each innocent message's effect happen once.
    assert_eq!(
        t.count("SELECT count(DISTINCT message_id) FROM transport_messages")
            .await,
        events
    );
    assert_eq!(t.count("SELECT count(*) FROM secrets").await, 1);
    if t.is_postgres() {
        assert_eq!(
            t.count("SELECT count(*) FROM pg_class WHERE relpersistence = 't'")
                .await,
            0,
            "a temporary object outlived its transaction"
        );
    }
    child.start_kill().expect("stop outboxd");
    let _ = child.wait().await;
    eprintln!(
        "{} attacks, each stopped:\n{}",
        attacks.len(),
        report.join("\n")
    );
}
on_both!(every_attack_is_stopped_and_the_next_messages_run_exactly_once);
