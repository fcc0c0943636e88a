//! Admission of consumer-plugin SQL: [`admit`] takes one statement and
//! either refuses it with a reason for the plugin, or returns what the host
//! needs to run it ([`Admitted`]: its kind, whether it writes, whether it
//! returns rows, the table it names first). Its parts:
//!
//! - `lexer.rs` and `lexical.rs`: the lexical rules, first. One statement
//!   of bounded length, starting with SELECT, INSERT, UPDATE, DELETE or
//!   WITH, with no text that Postgres and SQLite lex differently, and no
//!   keyword or function that ends, escapes or outlives the host's
//!   transaction;
//! - then the capability gate, a parser's view checked against what the
//!   consumer's config grants (`consumers[].tables`): `scope.rs` (the
//!   visitor over tables, aliases, functions and CTE scope), `names.rs`
//!   (the function allowlist, outboxd's own tables and the catalogs) and
//!   `expansion.rs` (the bound on how far the planners would grow it).
//!
//! It refuses early and with a reason that names the table and the config
//! key. It is not the wall: the databases' own machinery is (the plugin's
//! role and its grants on Postgres, the authorizer on SQLite), because a
//! parser and a database can disagree about a statement. The gate is the
//! stricter of the two wherever it can tell:
//!
//! - one SELECT, INSERT, UPDATE or DELETE (VALUES and set operations
//!   allowed), and WITH only at the start: no RECURSIVE, no writable CTEs,
//!   no nested WITH (so the gate's scoping of CTE names is the databases');
//! - no `SELECT … INTO`, no locking clauses, no `TABLE name`, no
//!   table-valued functions;
//! - every table is a single, unqualified name: a CTE in scope, or a table
//!   of `tables.read`/`tables.write` (writes need `write`); outboxd's own
//!   tables and the catalogs never, whatever the config says;
//! - every function is on [`ALLOWED_FUNCTIONS`] (operators and casts are
//!   not functions and are allowed).

mod expansion;
mod lexer;
mod lexical;
mod names;
mod scope;
#[cfg(test)]
mod tests;

use sqlparser::ast::Statement;
use sqlparser::dialect::{Dialect, PostgreSqlDialect, SQLiteDialect};
use sqlparser::parser::Parser;

use crate::config::TableGrants;
use crate::db_url::DbKind;
use expansion::expansion;
use scope::Gate;

pub use expansion::{MAX_EXPANDED_COLUMN, MAX_EXPANDED_STATEMENT};
pub use lexer::GuardError;
pub use lexical::{MAX_STATEMENT_BYTES, check_statement};
pub use names::{ALLOWED_FUNCTIONS, HOST_NAMES, is_allowed_function, is_host_table};

/// Why a statement was not admitted: the lexical rules or the capability
/// gate refused it. The text goes back to the plugin and into the dead
/// letter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(transparent)]
    Lexical(#[from] GuardError),
    #[error(transparent)]
    Gate(#[from] GateError),
}

/// What the host needs of an admitted statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// `select`, `insert`, `update` or `delete` (a WITH is the kind of its
    /// main statement).
    pub kind: &'static str,
    /// It returns rows (a query, or DML with RETURNING).
    pub returns_rows: bool,
    /// It writes (INSERT, UPDATE or DELETE).
    pub writes: bool,
    /// The table it names first: the target of a write, else the first
    /// table read (a CTE's name when that comes first). For traces; never
    /// a value.
    pub table: Option<String>,
}

/// Admits one statement of consumer `consumer` (named in errors) on `db`
/// under `grants`: the lexical rules, then the capability gate.
pub fn admit(
    sql: &str,
    db: DbKind,
    grants: &TableGrants,
    consumer: &str,
) -> Result<Admitted, Refused> {
    check_statement(sql)?;
    let (checked, target) = checked_statement(sql, db, grants, consumer)?;
    Ok(Admitted {
        kind: target.kind,
        returns_rows: checked.returns_rows,
        writes: checked.writes,
        table: target.table,
    })
}

/// Why the gate refused a statement; the text goes back to the plugin and
/// into the dead letter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    #[error(
        "outboxd cannot parse this statement ({0}); plugin SQL is one plain SELECT, INSERT, UPDATE or DELETE"
    )]
    Parse(String),
    #[error("only one statement per call")]
    MultipleStatements,
    #[error("`{0}` statements are not allowed; send one SELECT, INSERT, UPDATE or DELETE")]
    NotDml(String),
    #[error("{0} is not allowed in plugin SQL")]
    Construct(&'static str),
    #[error(
        "`{0}` is outboxd's own table or a catalog; plugin SQL can never reach it, whatever the config says"
    )]
    HostTable(String),
    #[error(
        "`{name}`: schema-qualified names are not allowed; plugin SQL names the tables of consumers[{consumer}].tables unqualified"
    )]
    Qualified { name: String, consumer: String },
    #[error(
        "table `{table}` is not in consumers[{consumer}].tables.{key}; add it there (and grant it to the consumer's db_role on Postgres) to allow it"
    )]
    NotGranted {
        table: String,
        consumer: String,
        key: &'static str,
    },
    #[error(
        "function `{0}` is not on plugin SQL's allowlist (see SECURITY.md); compute the value in the plugin and bind it as a parameter"
    )]
    Function(String),
    #[error("`{0}`: identifiers must be ASCII")]
    NonAscii(String),
    #[error("the statement is too complex for plugin SQL ({0}); split it or compute in the plugin")]
    TooComplex(String),
}

/// What the gate learnt about an accepted statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// It returns rows (a query, or DML with RETURNING).
    pub returns_rows: bool,
    /// It writes (INSERT, UPDATE or DELETE).
    pub writes: bool,
}

/// Deepest parenthesis nesting a statement may have.
pub const MAX_DEPTH: usize = 40;
/// Most operators (and AND, OR, NOT) a statement may have: a chain of them
/// is a tree as deep as it is long.
pub const MAX_OPERATORS: usize = 2_000;

/// The capability gate alone (the second part of [`admit`]): checks one
/// statement against `grants`; `consumer` names the config entry in
/// errors.
pub fn check(
    sql: &str,
    db: DbKind,
    grants: &TableGrants,
    consumer: &str,
) -> Result<Checked, GateError> {
    checked_statement(sql, db, grants, consumer).map(|(checked, _)| checked)
}

/// The kind and first table of a statement the gate accepted.
struct Target {
    kind: &'static str,
    table: Option<String>,
}

/// Parsing, walking and dropping a syntax tree recurse as deep as the
/// tree. Its depth is bounded first, from the tokens ([`MAX_DEPTH`],
/// [`MAX_OPERATORS`]); a statement beyond a shallow shape is then checked
/// on a thread with a stack sized for the bound, so no statement can
/// overflow the caller's stack, in a debug build either.
fn checked_statement(
    sql: &str,
    db: DbKind,
    grants: &TableGrants,
    consumer: &str,
) -> Result<(Checked, Target), GateError> {
    let (depth, operators) = shape(sql, db)?;
    if depth <= 6 && operators <= 48 {
        return check_parsed(sql, db, grants, consumer);
    }
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("outboxd-sql-gate".into())
            .stack_size(256 << 20)
            .spawn_scoped(scope, || check_parsed(sql, db, grants, consumer))
            .map_err(|e| GateError::Parse(format!("cannot start the gate's thread: {e}")))?
            .join()
            .unwrap_or_else(|_| Err(GateError::Parse("the gate failed on this statement".into())))
    })
}

fn dialect(db: DbKind) -> &'static dyn Dialect {
    match db {
        DbKind::Postgres => &PostgreSqlDialect {},
        DbKind::Sqlite => &SQLiteDialect {},
    }
}

/// The statement's parenthesis depth and operator count, refused beyond
/// the bounds.
fn shape(sql: &str, db: DbKind) -> Result<(usize, usize), GateError> {
    use sqlparser::keywords::Keyword;
    use sqlparser::tokenizer::{Token, Tokenizer};
    let tokens = Tokenizer::new(dialect(db), sql)
        .tokenize()
        .map_err(|e| GateError::Parse(e.to_string()))?;
    let (mut depth, mut deepest, mut operators) = (0usize, 0usize, 0usize);
    for t in &tokens {
        match t {
            Token::LParen | Token::LBracket | Token::LBrace => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            Token::RParen | Token::RBracket | Token::RBrace => depth = depth.saturating_sub(1),
            Token::Word(w) if matches!(w.keyword, Keyword::AND | Keyword::OR | Keyword::NOT) => {
                operators += 1
            }
            Token::Word(_)
            | Token::Number(..)
            | Token::SingleQuotedString(_)
            | Token::Placeholder(_)
            | Token::Comma
            | Token::Period
            | Token::SemiColon
            | Token::Whitespace(_)
            | Token::EOF => {}
            _ => operators += 1,
        }
    }
    if deepest > MAX_DEPTH {
        return Err(GateError::TooComplex(format!(
            "nested {deepest} levels deep; the limit is {MAX_DEPTH}"
        )));
    }
    if operators > MAX_OPERATORS {
        return Err(GateError::TooComplex(format!(
            "{operators} operators; the limit is {MAX_OPERATORS}"
        )));
    }
    Ok((deepest, operators))
}

fn check_parsed(
    sql: &str,
    db: DbKind,
    grants: &TableGrants,
    consumer: &str,
) -> Result<(Checked, Target), GateError> {
    let statements = Parser::new(dialect(db))
        .with_recursion_limit(4 * MAX_DEPTH + 16)
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_statements())
        .map_err(|e| GateError::Parse(e.to_string()))?;
    let statement = match statements.as_slice() {
        [one] => one,
        [] => return Err(GateError::Parse("empty statement".into())),
        _ => return Err(GateError::MultipleStatements),
    };
    let mut gate = Gate::new(grants, consumer);
    let checked = gate.statement(statement)?;
    expansion(statement)?;
    let kind = match statement {
        Statement::Insert(_) => "insert",
        Statement::Update(_) => "update",
        Statement::Delete(_) => "delete",
        _ => "select",
    };
    let table = gate.first_table;
    Ok((checked, Target { kind, table }))
}
