//! Plugin SQL admission (`sql_gate`): the lexical rules never panic, and
//! every statement they accept is one SELECT, INSERT, UPDATE or DELETE as
//! *each* database reads it.
//!
//! The oracle is independent of the guard: two small lexers, one following
//! Postgres's rules (nested block comments, `--` ending at CR or LF,
//! dollar quotes, `$` inside identifiers, `E''` and `U&""` escapes, `[` as
//! an operator) and one following SQLite's (flat block comments, `[ident]`,
//! backticks, no dollar quotes). Whatever either database would run as live
//! SQL must be a single statement whose first word is allowed and which
//! names no transaction control, DDL or session-changing function.
//!
//! Behind the lexical rules, the capability gate (a parser's view) runs
//! on both dialects with `customers` readable and `invoices` writable. It
//! never panics, and a statement it accepts never names one of outboxd's
//! tables where either database reads a table name (after FROM, JOIN,
//! INTO, UPDATE or TABLE, as the lexers above see the live words).
#![no_main]

use libfuzzer_sys::fuzz_target;
use outboxd_core::config::TableGrants;
use outboxd_core::db_url::DbKind;
use outboxd_core::sql_gate::{self, MAX_STATEMENT_BYTES, check_statement};

/// Words after which both databases read a table name.
const TABLE_POSITION: &[&str] = &["from", "join", "into", "update", "table"];

fn assert_no_host_table(sql: &str, dialect: &str, tokens: &[Tok]) {
    for pair in tokens.windows(2) {
        let (Tok::Word(k), next) = (&pair[0], &pair[1]) else {
            continue;
        };
        if !TABLE_POSITION.contains(&k.as_str()) {
            continue;
        }
        let name = match next {
            Tok::Word(w) => w.clone(),
            Tok::Quoted(q) => q.to_ascii_lowercase(),
            _ => continue,
        };
        assert!(
            !sql_gate::HOST_NAMES.contains(&name.as_str()),
            "the gate let {dialect} reach `{name}`: {sql:?}"
        );
    }
}

#[derive(Debug, PartialEq)]
enum Tok {
    /// A live keyword or name (lower case).
    Word(String),
    /// A quoted identifier: never a keyword, but a function name.
    Quoted(String),
    Semicolon,
    Other,
}

/// Live words that must never reach the database from a plugin.
const BANNED: &[&str] = &[
    "commit",
    "rollback",
    "begin",
    "savepoint",
    "release",
    "abort",
    "create",
    "alter",
    "drop",
    "truncate",
    "grant",
    "revoke",
    "copy",
    "attach",
    "detach",
    "pragma",
    "vacuum",
    "reset",
    "lock",
    "prepare",
    "execute",
    "call",
    "listen",
    "notify",
];

/// Function names that change the session or leave the transaction,
/// whether written plainly or quoted.
const BANNED_FUNCTIONS: &[&str] = &["set_config", "pg_sleep", "pg_advisory_lock", "dblink"];

const FIRST_WORDS: &[&str] = &["select", "insert", "update", "delete", "with"];

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80
}

/// Postgres: `None` when the server's lexer would reject the text (then it
/// cannot run, whatever the guard said).
fn lex_postgres(sql: &[u8]) -> Option<Vec<Tok>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < sql.len() {
        let c = sql[i];
        let next = sql.get(i + 1).copied();
        if c == b'-' && next == Some(b'-') {
            while i < sql.len() && sql[i] != b'\n' && sql[i] != b'\r' {
                i += 1;
            }
        } else if c == b'/' && next == Some(b'*') {
            let mut depth = 0;
            loop {
                if i + 1 >= sql.len() {
                    return None;
                }
                if sql[i] == b'/' && sql[i + 1] == b'*' {
                    depth += 1;
                    i += 2;
                } else if sql[i] == b'*' && sql[i + 1] == b'/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == b'\'' {
            // E'…' takes backslash escapes; the word `e` was already pushed.
            let escapes = matches!(out.last(), Some(Tok::Word(w)) if w == "e")
                && i > 0
                && (sql[i - 1] == b'e' || sql[i - 1] == b'E');
            i += 1;
            loop {
                match sql.get(i) {
                    None => return None,
                    Some(b'\\') if escapes => i += 2,
                    Some(b'\'') if sql.get(i + 1) == Some(&b'\'') => i += 2,
                    Some(b'\'') => {
                        i += 1;
                        break;
                    }
                    Some(_) => i += 1,
                }
            }
            out.push(Tok::Other);
        } else if c == b'"' {
            let start = i + 1;
            let mut name = Vec::new();
            i += 1;
            loop {
                match sql.get(i) {
                    None => return None,
                    Some(b'"') if sql.get(i + 1) == Some(&b'"') => {
                        name.push(b'"');
                        i += 2;
                    }
                    Some(b'"') => {
                        i += 1;
                        break;
                    }
                    Some(&b) => {
                        name.push(b);
                        i += 1;
                    }
                }
            }
            let unicode =
                start >= 3 && sql[start - 2] == b'&' && sql[start - 3].eq_ignore_ascii_case(&b'u');
            let name = if unicode {
                decode_unicode_escapes(&name)
            } else {
                name
            };
            out.push(Tok::Quoted(String::from_utf8_lossy(&name).into_owned()));
        } else if c == b'$' {
            // $1 parameter, or $tag$ … $tag$.
            let mut e = i + 1;
            while e < sql.len()
                && (sql[e].is_ascii_alphanumeric() || sql[e] == b'_' || sql[e] >= 0x80)
            {
                e += 1;
            }
            if sql.get(e) == Some(&b'$') && !sql.get(i + 1).is_some_and(u8::is_ascii_digit) {
                let tag = &sql[i..=e];
                let body = e + 1;
                let close = sql[body..].windows(tag.len()).position(|w| w == tag)?;
                i = body + close + tag.len();
            } else {
                i += 1;
                while i < sql.len() && sql[i].is_ascii_digit() {
                    i += 1;
                }
            }
            out.push(Tok::Other);
        } else if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 {
            let start = i;
            while i < sql.len() && (is_ident(sql[i]) || sql[i] == b'$') {
                i += 1;
            }
            out.push(Tok::Word(
                String::from_utf8_lossy(&sql[start..i]).to_ascii_lowercase(),
            ));
        } else if c == b';' {
            out.push(Tok::Semicolon);
            i += 1;
        } else {
            if !c.is_ascii_whitespace() {
                out.push(Tok::Other);
            }
            i += 1;
        }
    }
    Some(out)
}

/// `U&"…"` identifiers: `\XXXX` and `\+XXXXXX` code points (the default
/// escape character; a UESCAPE clause is another way to hide a name, which
/// the oracle flags by the word `uescape`).
fn decode_unicode_escapes(raw: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let width = if chars.peek() == Some(&'+') {
            chars.next();
            6
        } else {
            4
        };
        let hex: String = chars.by_ref().take(width).collect();
        match u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
            Some(d) => out.push(d),
            None => out.push_str(&hex),
        }
    }
    out.into_bytes()
}

/// SQLite.
fn lex_sqlite(sql: &[u8]) -> Option<Vec<Tok>> {
    let mut out = Vec::new();
    let mut i = 0;
    let quoted = |i: &mut usize, close: u8, doubled: bool| -> Option<Vec<u8>> {
        let mut name = Vec::new();
        *i += 1;
        loop {
            match sql.get(*i) {
                None => return None,
                Some(&b) if b == close && doubled && sql.get(*i + 1) == Some(&close) => {
                    name.push(b);
                    *i += 2;
                }
                Some(&b) if b == close => {
                    *i += 1;
                    return Some(name);
                }
                Some(&b) => {
                    name.push(b);
                    *i += 1;
                }
            }
        }
    };
    while i < sql.len() {
        let c = sql[i];
        let next = sql.get(i + 1).copied();
        if c == b'-' && next == Some(b'-') {
            while i < sql.len() && sql[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && next == Some(b'*') {
            // Not nested; an unterminated comment runs to the end.
            match sql[i + 2..].windows(2).position(|w| w == b"*/") {
                Some(p) => i = i + 2 + p + 2,
                None => i = sql.len(),
            }
        } else if c == b'\'' {
            quoted(&mut i, b'\'', true)?;
            out.push(Tok::Other);
        } else if c == b'"' || c == b'`' {
            let name = quoted(&mut i, c, true)?;
            out.push(Tok::Quoted(String::from_utf8_lossy(&name).into_owned()));
        } else if c == b'[' {
            let name = quoted(&mut i, b']', false)?;
            out.push(Tok::Quoted(String::from_utf8_lossy(&name).into_owned()));
        } else if matches!(c, b'$' | b'@' | b':' | b'#' | b'?') {
            // A parameter: `?NNN`, `$name`, `@name`, `:name`, `#name`.
            i += 1;
            while i < sql.len() && (is_ident(sql[i]) || sql[i] == b'$') {
                i += 1;
            }
            out.push(Tok::Other);
        } else if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 {
            let start = i;
            while i < sql.len() && (is_ident(sql[i]) || sql[i] == b'$') {
                i += 1;
            }
            out.push(Tok::Word(
                String::from_utf8_lossy(&sql[start..i]).to_ascii_lowercase(),
            ));
        } else if c == b';' {
            out.push(Tok::Semicolon);
            i += 1;
        } else if c == 0 {
            // SQLite stops reading at a NUL.
            break;
        } else {
            if !c.is_ascii_whitespace() {
                out.push(Tok::Other);
            }
            i += 1;
        }
    }
    Some(out)
}

/// Panics (a finding) when `tokens` are not one allowed statement.
fn assert_single_dml(sql: &str, dialect: &str, tokens: &[Tok]) {
    let mut seen_semicolon = false;
    for t in tokens {
        match t {
            Tok::Semicolon => seen_semicolon = true,
            _ => assert!(
                !seen_semicolon,
                "{dialect} runs a second statement: {sql:?}"
            ),
        }
    }
    let first = tokens.iter().find_map(|t| match t {
        Tok::Word(w) => Some(w.as_str()),
        _ => None,
    });
    if let Some(first) = first {
        assert!(
            FIRST_WORDS.contains(&first),
            "{dialect} starts with `{first}`: {sql:?}"
        );
    }
    for t in tokens {
        match t {
            Tok::Word(w) => {
                assert!(
                    !BANNED.contains(&w.as_str()),
                    "{dialect} runs `{w}`: {sql:?}"
                );
                assert!(w != "uescape", "{dialect}: UESCAPE hides names: {sql:?}");
                assert!(
                    !BANNED_FUNCTIONS.iter().any(|f| w.starts_with(f)),
                    "{dialect} calls `{w}`: {sql:?}"
                );
            }
            Tok::Quoted(q) => {
                let q = q.to_ascii_lowercase();
                assert!(
                    !BANNED_FUNCTIONS.iter().any(|f| q.starts_with(f)),
                    "{dialect} calls quoted `{q}`: {sql:?}"
                );
            }
            _ => {}
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(sql) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(kind) = check_statement(sql) else {
        return;
    };
    assert!(sql.len() <= MAX_STATEMENT_BYTES);
    assert!(FIRST_WORDS.contains(&kind), "kind {kind}");
    let pg = lex_postgres(sql.as_bytes());
    let lite = lex_sqlite(sql.as_bytes());
    if let Some(tokens) = &pg {
        assert_single_dml(sql, "postgres", tokens);
    }
    if let Some(tokens) = &lite {
        assert_single_dml(sql, "sqlite", tokens);
    }
    let grants = TableGrants {
        read: vec!["customers".into()],
        write: vec!["invoices".into()],
    };
    for (db, tokens, dialect) in [
        (DbKind::Postgres, &pg, "postgres"),
        (DbKind::Sqlite, &lite, "sqlite"),
    ] {
        if sql_gate::check(sql, db, &grants, "fuzz").is_ok()
            && let Some(tokens) = tokens
        {
            assert_no_host_table(sql, dialect, tokens);
        }
    }
});
