//! The lexical rules for SQL that consumer plugins send through their
//! borrowed transaction, the first part of [`admit`](super::admit). Only one SELECT, INSERT, UPDATE or DELETE with bound
//! parameters gets through; everything that could end, escape or outlive the
//! host's transaction is refused before it reaches the database.
//!
//! The same text must mean the same thing to Postgres and to SQLite, so
//! constructs the two lex differently (backslash escapes, nested comments,
//! dollar quotes, `[…]` holding quotes, backticks, `U&` escapes) are refused or read the stricter
//! way; `fuzz/fuzz_targets/sql_guard.rs` checks accepted statements against
//! a lexer of each database.
//!
//! This is a gate, not the only wall: on Postgres the statement also runs
//! under the plugin's configured role and a statement timeout, so the
//! database limits what an accepted statement can touch.

use super::lexer::{GuardError, Token, tokenize};

/// Longest statement a plugin may send.
pub const MAX_STATEMENT_BYTES: usize = 64 * 1024;

/// Keywords that never appear in an allowed statement, wherever they are
/// (unquoted). SET, DO, END and START are left out: they are also parts of
/// UPDATE … SET, ON CONFLICT DO, CASE … END; as statements they are refused
/// by the first-word rule.
const FORBIDDEN_WORDS: &[&str] = &[
    "commit",
    "rollback",
    "savepoint",
    "release",
    "begin",
    "abort",
    "prepare",
    "reset",
    "copy",
    "vacuum",
    "analyze",
    "listen",
    "notify",
    "unlisten",
    "lock",
    "grant",
    "revoke",
    "create",
    "alter",
    "drop",
    "truncate",
    "call",
    "execute",
    "deallocate",
    "discard",
    "load",
    "attach",
    "detach",
    "pragma",
    "checkpoint",
    "cluster",
    "reindex",
    "refresh",
    "security",
    "import",
];

/// Functions that change the session or reach outside the transaction.
const FORBIDDEN_FUNCTION_PREFIXES: &[&str] = &[
    "set_config",
    "pg_advisory",
    "pg_try_advisory",
    "pg_terminate_backend",
    "pg_cancel_backend",
    "pg_reload_conf",
    "pg_read_file",
    "pg_read_binary_file",
    "pg_ls_",
    "pg_file_",
    "pg_stat_file",
    "pg_sleep",
    "lo_",
    "dblink",
    "pg_notify",
    "pg_logical",
    "pg_replication",
    "pg_create",
    "pg_drop",
    "pg_switch_wal",
    "pg_promote",
    "txid_",
    "pg_export_snapshot",
    "load_extension",
    "readfile",
    // These run a query given as text, out of the guard's sight.
    "query_to_xml",
    "cursor_to_xml",
    "table_to_xml",
    "schema_to_xml",
    "database_to_xml",
    "ts_stat",
    "ts_rewrite",
    "writefile",
];

/// Accepts one DML statement; returns its kind in lower case.
pub fn check_statement(sql: &str) -> Result<&'static str, GuardError> {
    if sql.len() > MAX_STATEMENT_BYTES {
        return Err(GuardError::TooLong {
            len: sql.len(),
            max: MAX_STATEMENT_BYTES,
        });
    }
    let tokens = tokenize(sql)?;
    // What comes before the first keyword is part of the statement too: a
    // SQLite `$name`/`:name` parameter there would make the next word look
    // like the first.
    match tokens.iter().find(|t| **t != Token::Open) {
        Some(Token::Word(_) | Token::Semicolon) | None => {}
        Some(_) => return Err(GuardError::NoLeadingKeyword),
    }
    let mut words = Vec::new();
    let mut seen_semicolon = false;
    for t in &tokens {
        match t {
            Token::Semicolon => seen_semicolon = true,
            _ if seen_semicolon => return Err(GuardError::MultipleStatements),
            Token::Word(w) => words.push(w.as_str()),
            Token::Quoted(q) => {
                if FORBIDDEN_FUNCTION_PREFIXES.iter().any(|p| q.starts_with(p)) {
                    return Err(GuardError::Forbidden(q.clone()));
                }
            }
            Token::Open | Token::Other => {}
        }
    }
    let first = *words.first().ok_or(GuardError::Empty)?;
    let kind = match first {
        "select" => "select",
        "insert" => "insert",
        "update" => "update",
        "delete" => "delete",
        "with" => "with",
        other => return Err(GuardError::NotDml(other.to_uppercase())),
    };
    for w in &words {
        if FORBIDDEN_WORDS.contains(w) {
            return Err(GuardError::Forbidden(w.to_uppercase()));
        }
        if FORBIDDEN_FUNCTION_PREFIXES.iter().any(|p| w.starts_with(p)) {
            return Err(GuardError::Forbidden((*w).to_string()));
        }
    }
    Ok(kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_dml_with_parameters_passes() {
        for (sql, kind) in [
            (
                "SELECT id, total FROM invoices WHERE order_id = $1",
                "select",
            ),
            (
                "insert into invoices (order_id, amount) values ($1, $2)",
                "insert",
            ),
            (
                "UPDATE accounts SET balance = balance - $1 WHERE id = $2;",
                "update",
            ),
            ("DELETE FROM carts WHERE id = ?", "delete"),
            (
                "INSERT INTO t (k) VALUES ($1) ON CONFLICT (k) DO UPDATE SET n = t.n + 1",
                "insert",
            ),
            ("SELECT CASE WHEN $1 THEN 1 ELSE 0 END", "select"),
            ("(SELECT 1) UNION (SELECT 2)", "select"),
            ("WITH t AS (SELECT 1 AS x) SELECT x FROM t", "with"),
            (
                "SELECT 'commit; drop table x' AS s, \"set\" FROM t -- rollback\n",
                "select",
            ),
            ("SELECT 1 /* a comment with commit */", "select"),
            ("SELECT 1 -- windows line end\r\n FROM t", "select"),
            ("SELECT 'C:\\temp' AS path, E'tab\\tstop'", "select"),
            ("SELECT arr[1] FROM t WHERE \"order\" = $1", "select"),
        ] {
            assert_eq!(check_statement(sql), Ok(kind), "{sql}");
        }
    }

    #[test]
    fn transaction_control_ddl_and_session_changes_are_refused() {
        for sql in [
            "COMMIT",
            "rollback",
            "SAVEPOINT a",
            "RELEASE SAVEPOINT a",
            "BEGIN",
            "SET ROLE postgres",
            "SET LOCAL statement_timeout = 0",
            "RESET ROLE",
            "CREATE TABLE t (x int)",
            "DROP TABLE invoices",
            "ALTER TABLE invoices ADD COLUMN x int",
            "TRUNCATE invoices",
            "COPY invoices TO '/tmp/x'",
            "GRANT ALL ON invoices TO public",
            "DO $$ BEGIN PERFORM 1; END $$",
            "CALL proc()",
            "VACUUM",
            "LISTEN x",
            "PRAGMA writable_schema = 1",
            "ATTACH DATABASE '/etc/passwd' AS p",
            "LOCK TABLE invoices",
            "PREPARE p AS SELECT 1",
        ] {
            assert!(check_statement(sql).is_err(), "{sql} must be refused");
        }
    }

    /// Each of these hides a second statement or a session change from one
    /// of the two databases (found by the `sql_guard` fuzz target and its
    /// per-database lexers).
    #[test]
    fn text_the_databases_read_differently_is_refused() {
        for sql in [
            // Postgres: one E-string; standard strings (SQLite, Postgres by
            // default): a string ending at `\'`, then live SQL.
            "SELECT 'a\\'; DELETE FROM inbox; --'",
            "SELECT E'a\\'; DELETE FROM inbox; --'",
            // SQLite: the comment ends at the first `*/`.
            "SELECT 1 /* /* */ ; DELETE FROM inbox; -- */ */",
            // SQLite: `$a$` is a parameter, not a quote.
            "SELECT $a$; DELETE FROM inbox; --$a$",
            "SELECT x$$, set_config('role', 'postgres', true), $$ FROM t",
            "SELECT $é$ x $é$ FROM t",
            // Postgres: `[` is a subscript, its content runs.
            "SELECT (ARRAY[1])[length(set_config('role', 'postgres', true))]",
            "SELECT [a; DELETE FROM inbox; --]",
            // SQLite: the quote is inside the [identifier] (found by the
            // fuzz target).
            "SELECT r[x'] FROM t WHERE a = ''; DELETE FROM inbox; --'",
            "SELECT `set_config`('role', 'postgres', true)",
            // Postgres: a line comment ends at CR.
            "SELECT 1 --\r, set_config('role', 'postgres', true)",
            // SQLite: the comment runs on past the CR (found by the fuzz
            // target).
            "SELECT 1 --\r\", 'x\n''; DELETE FROM inbox; --\"",
            // Postgres: quoted and escaped function names.
            "SELECT \"set_config\"('role', 'postgres', true)",
            "SELECT pg_catalog.\"set_config\"('role', 'postgres', true)",
            "SELECT U&\"\\0073et_config\"('role', 'postgres', true)",
            // Postgres: functions that run a query given as text.
            "SELECT query_to_xml('select set_config(''role'',''postgres'',true)', true, true, '')",
            "SELECT ts_stat('select 1')",
            // SQLite: `$SELECT` is a parameter, so the first word is `grant`
            // (found by the fuzz target).
            "$SELECT grant",
            "SELECT$'x' FROM t",
            ":SELECT 1",
        ] {
            assert!(check_statement(sql).is_err(), "{sql} must be refused");
        }
    }

    #[test]
    fn several_statements_and_hidden_escapes_are_refused() {
        assert_eq!(
            check_statement("SELECT 1; SELECT 2"),
            Err(GuardError::MultipleStatements)
        );
        assert_eq!(
            check_statement("SELECT 1; COMMIT"),
            Err(GuardError::MultipleStatements)
        );
        assert_eq!(
            check_statement("UPDATE t SET x = 1; ROLLBACK;"),
            Err(GuardError::MultipleStatements)
        );
        assert!(matches!(
            check_statement("SELECT set_config('role', 'postgres', false)"),
            Err(GuardError::Forbidden(_))
        ));
        assert!(matches!(
            check_statement("SELECT pg_advisory_lock(1)"),
            Err(GuardError::Forbidden(_))
        ));
        assert!(matches!(
            check_statement("SELECT pg_sleep(100)"),
            Err(GuardError::Forbidden(_))
        ));
        assert!(matches!(
            check_statement("SELECT pg_read_file('/etc/passwd')"),
            Err(GuardError::Forbidden(_))
        ));
        assert!(matches!(
            check_statement("WITH x AS (SELECT 1) DELETE FROM t; DROP TABLE t"),
            Err(GuardError::MultipleStatements)
        ));
        assert!(matches!(
            check_statement("SELECT 'unterminated"),
            Err(GuardError::Unterminated(_))
        ));
        assert!(matches!(
            check_statement("SELECT /* open"),
            Err(GuardError::Unterminated(_))
        ));
        assert_eq!(
            check_statement("   -- only a comment"),
            Err(GuardError::Empty)
        );
        assert_eq!(check_statement(""), Err(GuardError::Empty));
        assert!(matches!(
            check_statement(&"x".repeat(MAX_STATEMENT_BYTES + 1)),
            Err(GuardError::TooLong { .. })
        ));
    }
}
