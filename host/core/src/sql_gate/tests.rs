//! The gate's unit tests: what it admits and refuses, on both dialects.

use super::*;

fn grants() -> TableGrants {
    TableGrants {
        read: vec!["customers".into()],
        write: vec!["invoices".into()],
    }
}

fn on_both(sql: &str) -> Vec<Result<Checked, GateError>> {
    [DbKind::Postgres, DbKind::Sqlite]
        .into_iter()
        .map(|db| check(sql, db, &grants(), "billing"))
        .collect()
}

#[test]
fn statements_within_the_grants_pass_on_both_databases() {
    for sql in [
        "SELECT id, name FROM customers WHERE id = $1",
        "SELECT c.name, count(*) FROM customers c JOIN invoices i ON i.customer_id = c.id GROUP BY c.name",
        "INSERT INTO invoices (order_id, amount_cents) VALUES ($1, $2)",
        "INSERT INTO invoices (order_id) SELECT id FROM customers WHERE id = $1",
        "INSERT INTO invoices (order_id) VALUES ($1) ON CONFLICT (order_id) DO UPDATE SET amount_cents = invoices.amount_cents + 1",
        "UPDATE invoices SET amount_cents = amount_cents + $1 WHERE order_id = $2",
        "DELETE FROM invoices WHERE order_id = $1",
        "DELETE FROM invoices WHERE order_id IN (SELECT id FROM customers)",
        "WITH big AS (SELECT id FROM customers WHERE id > $1) SELECT count(*) FROM big",
        "WITH a AS (SELECT 1 AS x), b AS (SELECT x FROM a) SELECT x FROM b",
        "SELECT coalesce(max(amount_cents), 0) FROM invoices",
        "SELECT 1 UNION ALL SELECT 2",
        "SELECT lower(name) || '-' || upper(name) FROM customers",
        "SELECT CAST(amount_cents AS text) FROM invoices",
        "INSERT INTO invoices (order_id) VALUES ($1) RETURNING order_id",
    ] {
        for r in on_both(sql) {
            assert!(r.is_ok(), "{sql}: {r:?}");
        }
    }
}

#[test]
fn host_tables_are_never_reachable_whatever_the_grants_say() {
    let everything = TableGrants {
        read: vec!["inbox".into(), "outbox".into(), "customers".into()],
        write: vec!["inbox".into(), "transport_messages".into()],
    };
    for sql in [
        "DELETE FROM inbox",
        "UPDATE outbox SET published_at = now()",
        "SELECT * FROM inbox",
        "SELECT * FROM INBOX",
        "SELECT * FROM \"inbox\"",
        "DELETE FROM transport_messages",
        "SELECT * FROM plugin_activations",
        "SELECT * FROM outboxd_migrations",
        "SELECT * FROM pg_shadow",
        "SELECT * FROM sqlite_master",
        "SELECT * FROM customers WHERE id IN (SELECT message_id FROM inbox)",
        "WITH i AS (SELECT * FROM inbox) SELECT * FROM i",
        // Named as a column or an alias, never as a table (found by
        // the fuzz target: `SELECT DELETE .FROM inbox`).
        "SELECT DELETE .FROM inbox",
        "SELECT 1 AS inbox",
        "SELECT name FROM customers AS outbox",
        "SELECT inbox.x FROM customers",
        "WITH inbox AS (SELECT 1 AS x) SELECT x FROM inbox",
    ] {
        for db in [DbKind::Postgres, DbKind::Sqlite] {
            let r = check(sql, db, &everything, "billing");
            assert!(
                matches!(r, Err(GateError::HostTable(_))),
                "{sql} on {db:?}: {r:?}"
            );
        }
    }
}

#[test]
fn tables_outside_the_grants_are_refused_with_the_key_to_change() {
    let r = check(
        "UPDATE customers SET name = $1",
        DbKind::Postgres,
        &grants(),
        "billing",
    );
    let e = r.expect_err("customers is read-only");
    assert_eq!(
        e.to_string(),
        "table `customers` is not in consumers[billing].tables.write; add it there (and grant it to the consumer's db_role on Postgres) to allow it"
    );
    for sql in [
        "SELECT * FROM secrets",
        "DELETE FROM customers",
        "INSERT INTO customers (id) VALUES (1)",
        "SELECT * FROM invoices, secrets",
        "SELECT (SELECT count(*) FROM secrets)",
        "SELECT * FROM \"Invoices\"",
        "SELECT * FROM public.invoices",
        "SELECT * FROM main.invoices",
        "SELECT * FROM temp.invoices",
        "SELECT * FROM pg_temp.invoices",
        "SELECT * FROM information_schema.tables",
        "SELECT * FROM pg_catalog.pg_authid",
        // The CTE is out of scope in its own body and before it.
        "WITH a AS (SELECT * FROM b), b AS (SELECT 1) SELECT * FROM a",
        "WITH secrets AS (SELECT * FROM secrets) SELECT * FROM secrets",
        // A write target is never a CTE.
        "WITH invoices AS (SELECT 1) DELETE FROM customers",
    ] {
        for r in on_both(sql) {
            assert!(r.is_err(), "{sql} must be refused");
        }
    }
}

#[test]
fn constructs_that_escape_the_statement_or_its_bounds_are_refused() {
    for sql in [
        "SELECT * INTO TEMP inbox_copy FROM invoices",
        "SELECT * INTO invoices2 FROM invoices",
        "SELECT * FROM invoices FOR UPDATE",
        "SELECT * FROM customers FOR SHARE",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
        "WITH d AS (DELETE FROM invoices RETURNING 1) SELECT count(*) FROM d",
        "SELECT * FROM (WITH x AS (SELECT 1) SELECT * FROM x) y",
        "TABLE invoices",
        "SELECT * FROM generate_series(1, 1000000000)",
        "SELECT * FROM pragma_table_info('inbox')",
        "SELECT * FROM json_each('[1]')",
        "SELECT * FROM unnest(ARRAY[1, 2])",
        "SELECT 1; SELECT 2",
        "SET statement_timeout = 0",
        "RESET ALL",
        "COMMIT",
        "CREATE TEMP TABLE inbox (x int)",
        "PRAGMA writable_schema = 1",
        "ATTACH DATABASE '/tmp/x' AS x",
        "VACUUM INTO '/tmp/x'",
        "LOCK TABLE invoices",
        "COPY invoices TO '/tmp/x'",
        "EXPLAIN SELECT 1",
        "UPDATE pg_settings SET setting = 'on' WHERE name = 'default_transaction_read_only'",
    ] {
        for r in on_both(sql) {
            assert!(r.is_err(), "{sql} must be refused");
        }
    }
}

#[test]
fn functions_outside_the_allowlist_are_refused() {
    for sql in [
        "SELECT set_config('role', 'postgres', false)",
        "SELECT pg_catalog.set_config('role', 'postgres', false)",
        "SELECT \"set_config\"('statement_timeout', '0', false)",
        "SELECT current_setting('role')",
        "SELECT repeat('x', 300000000)",
        "SELECT lpad('x', 300000000, 'y')",
        "SELECT zeroblob(300000000)",
        "SELECT randomblob(300000000)",
        "SELECT printf('%.*c', 300000000, 'x')",
        "SELECT string_agg(name, ',') FROM customers",
        "SELECT group_concat(name) FROM customers",
        "SELECT pg_sleep(60)",
        "SELECT pg_read_file('/etc/passwd')",
        "SELECT lo_import('/etc/passwd')",
        "SELECT load_extension('/tmp/x.so')",
        "SELECT readfile('/etc/passwd')",
        "SELECT dblink_connect('host=evil')",
        "SELECT pg_advisory_lock(1)",
        "SELECT name FROM customers WHERE id = length(set_config('role', 'postgres', true))",
        "INSERT INTO invoices (order_id) VALUES (set_config('role', 'postgres', true))",
        "SELECT outbox_enqueue('a', 'b', '{}', '{}')",
    ] {
        for r in on_both(sql) {
            assert!(
                matches!(r, Err(GateError::Function(_)) | Err(GateError::Parse(_))),
                "{sql}: {r:?}"
            );
        }
    }
}

/// Deep trees are checked on a thread with room for them, and bounded:
/// none of these may overflow the test thread's stack.
#[test]
fn deep_and_long_statements_are_bounded_without_overflowing_the_stack() {
    let nested = |levels: usize| {
        let mut sql = "SELECT 'x' AS c0".to_string();
        for i in 1..=levels {
            sql = format!("SELECT c{p} || c{p} AS c{i} FROM ({sql}) t{i}", p = i - 1);
        }
        sql
    };
    for r in on_both(&nested(13)) {
        assert!(r.is_ok(), "{r:?}");
    }
    // Thirteen levels over a 60 kB literal: 8192 copies of it to plan.
    let big = nested(13).replace("'x'", &format!("'{}'", "x".repeat(60_000)));
    for r in on_both(&big) {
        assert!(matches!(r, Err(GateError::TooComplex(_))), "{r:?}");
    }
    // Planned, these double at every level: 2^25 nodes made a Postgres
    // backend allocate 23 GB before the kernel killed it.
    for levels in [16, 25, MAX_DEPTH + 1] {
        for r in on_both(&nested(levels)) {
            assert!(
                matches!(r, Err(GateError::TooComplex(_))),
                "{levels}: {r:?}"
            );
        }
    }
    let ctes = (1..=20)
        .map(|i| format!("c{i} AS (SELECT x || x AS x FROM c{})", i - 1))
        .collect::<Vec<_>>()
        .join(", ");
    let cte_bomb = format!("WITH c0 AS (SELECT 'x' AS x), {ctes} SELECT x FROM c20");
    for r in on_both(&cte_bomb) {
        assert!(matches!(r, Err(GateError::TooComplex(_))), "{r:?}");
    }
    let parens = format!("SELECT {}1{}", "(".repeat(5000), ")".repeat(5000));
    let chain = format!("SELECT 1{}", " + 1".repeat(10_000));
    let ands = format!(
        "SELECT 1 FROM customers WHERE true{}",
        " AND true".repeat(1_500)
    );
    let nots = format!("SELECT {}true", "NOT ".repeat(1_500));
    for sql in [parens, chain] {
        for r in on_both(&sql) {
            assert!(matches!(r, Err(GateError::TooComplex(_))), "{r:?}");
        }
    }
    for r in on_both(&ands) {
        assert!(r.is_ok(), "{r:?}");
    }
    // Refused by the parser's own recursion limit; what matters is that
    // it returns.
    for r in on_both(&nots) {
        assert!(r.is_err(), "{r:?}");
    }
}

#[test]
fn host_name_rules_cover_every_host_table() {
    for t in [
        "outbox",
        "inbox",
        "transport_messages",
        "transport_cursors",
        "plugins",
        "plugin_activations",
        "plugin_shadow_stats",
        "consumer_dead_letters",
        "consumer_offsets",
        "outboxd_migrations",
        "outbound_calls",
        "pg_authid",
        "sqlite_schema",
    ] {
        assert!(is_host_table(t), "{t}");
    }
    for t in ["invoices", "customers", "orders", "outgoing"] {
        assert!(!is_host_table(t), "{t}");
    }
}

/// What a trace may say about an admitted statement: its kind (a WITH is
/// the kind of its main statement) and the table it names first, as the
/// databases resolve the name, never its values; a refused statement
/// gives nothing.
#[test]
fn an_admitted_statements_target_is_its_kind_and_table_never_its_values() {
    let grants = TableGrants {
        read: vec!["carts".into(), "Ledger".into()],
        write: vec!["invoices".into(), "accounts".into(), "carts".into()],
    };
    for (sql, kind, table) in [
        (
            "INSERT INTO invoices (order_id) VALUES ($1)",
            "insert",
            Some("invoices"),
        ),
        (
            "update accounts set n = 'from secret' where id = $1",
            "update",
            Some("accounts"),
        ),
        ("DELETE FROM carts WHERE id = $1", "delete", Some("carts")),
        (
            "SELECT 'into x' FROM \"Ledger\" WHERE k = $1",
            "select",
            Some("Ledger"),
        ),
        (
            "WITH c AS (SELECT id FROM carts) SELECT id FROM c",
            "select",
            Some("carts"),
        ),
        ("SELECT 1", "select", None),
    ] {
        let admitted = admit(sql, DbKind::Postgres, &grants, "billing")
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        assert_eq!(
            (admitted.kind, admitted.table.as_deref()),
            (kind, table),
            "{sql}"
        );
    }
    assert!(matches!(
        admit("DROP TABLE x", DbKind::Postgres, &grants, "billing"),
        Err(Refused::Lexical(_))
    ));
    assert!(matches!(
        admit(
            "SELECT * FROM secrets",
            DbKind::Postgres,
            &grants,
            "billing"
        ),
        Err(Refused::Gate(GateError::NotGranted { .. }))
    ));
}
