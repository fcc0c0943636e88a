//! The capability gate for consumer-plugin SQL: a parser's view of one
//! statement, checked against what the consumer's config grants
//! (`consumers[].tables`).
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

use std::collections::HashSet;
use std::ops::ControlFlow;

use sqlparser::ast::{
    Expr, FromTable, Ident, ObjectName, ObjectNamePart, Query, SetExpr, Statement, TableFactor,
    TableObject, TableWithJoins, UpdateTableFromKind, Visit, Visitor,
};
use sqlparser::dialect::{Dialect, PostgreSqlDialect, SQLiteDialect};
use sqlparser::parser::Parser;

use crate::config::TableGrants;
use crate::db_url::DbKind;

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

/// Functions plugin SQL may call, lower case, on either database (one that
/// a database lacks fails there). Left out on purpose: anything that
/// builds a value much larger than its input (`repeat`, `lpad`, `rpad`,
/// `replace`, `zeroblob`, `randomblob`, `printf`, `format`, the string and
/// array aggregates), generates rows (`generate_series`), sleeps, reads or
/// changes settings, reads files, large objects or the network, or names
/// the catalogs (every `pg_*` function).
pub const ALLOWED_FUNCTIONS: &[&str] = &[
    // aggregates
    "count",
    "sum",
    "avg",
    "min",
    "max",
    "total",
    "bool_and",
    "bool_or",
    "every",
    // nulls and comparisons
    "coalesce",
    "nullif",
    "ifnull",
    "iif",
    "greatest",
    "least",
    // numbers
    "abs",
    "round",
    "floor",
    "ceil",
    "ceiling",
    "trunc",
    "mod",
    "sign",
    // text, bounded by its input
    "lower",
    "upper",
    "length",
    "char_length",
    "character_length",
    "octet_length",
    "trim",
    "ltrim",
    "rtrim",
    "btrim",
    "substr",
    "substring",
    "left",
    "right",
    "position",
    "strpos",
    "instr",
    "starts_with",
    "split_part",
    "concat",
    "md5",
    // time
    "now",
    "current_timestamp",
    "current_date",
    "current_time",
    "localtimestamp",
    "date_trunc",
    "date_part",
    "to_timestamp",
    "to_char",
    "strftime",
    "datetime",
    "date",
    "time",
    "julianday",
    "unixepoch",
    // JSON
    "json_extract",
    "json_valid",
    "json_type",
    "json_array_length",
    "jsonb_array_length",
    "json_typeof",
    "jsonb_typeof",
    "json_extract_path_text",
    "jsonb_extract_path_text",
    "jsonb_extract_path",
    "json_build_object",
    "jsonb_build_object",
    "to_json",
    "to_jsonb",
    // other
    "typeof",
    "gen_random_uuid",
];

/// Whether `name` (any case) is one of outboxd's own tables, or a name
/// reserved for them or for the databases' catalogs. Plugin SQL never
/// reaches these, and `consumers[].tables` may not list them.
pub fn is_host_table(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n == "outbox"
        || n == "inbox"
        || n == "outbound_calls"
        || [
            "outbox_",
            "inbox_",
            "outboxd",
            "transport_",
            "plugin",
            "consumer_",
            "pg_",
            "sqlite_",
            "information_schema",
        ]
        .iter()
        .any(|p| n.starts_with(p))
}

/// outboxd's own tables and the catalogs a plugin might aim at, by their
/// exact names: refused as tables (with every name [`is_host_table`]
/// reserves) and also as columns and aliases, so no statement that names
/// one can reach it by a door the parse did not see.
pub const HOST_NAMES: &[&str] = &[
    "outbox",
    "inbox",
    "transport_messages",
    "transport_cursors",
    "transport_members",
    "plugins",
    "plugin_activations",
    "plugin_shadow_stats",
    "consumer_dead_letters",
    "consumer_offsets",
    "outboxd_migrations",
    "outbound_calls",
    "pg_shadow",
    "pg_authid",
    "pg_settings",
    "pg_roles",
    "pg_user",
    "sqlite_master",
    "sqlite_schema",
    "sqlite_temp_master",
];

fn is_host_name(ident: &Ident) -> bool {
    HOST_NAMES.contains(&ident.value.to_ascii_lowercase().as_str())
}

pub fn is_allowed_function(name: &str) -> bool {
    ALLOWED_FUNCTIONS.contains(&name)
}

/// The largest an output column may grow when the databases inline the
/// subqueries and CTEs it is built from, in expression nodes (see
/// [`expansion`]).
pub const MAX_EXPANDED_COLUMN: u64 = 20_000;
/// The largest the whole statement may grow the same way.
pub const MAX_EXPANDED_STATEMENT: u64 = 200_000;

/// Deepest parenthesis nesting a statement may have.
pub const MAX_DEPTH: usize = 40;
/// Most operators (and AND, OR, NOT) a statement may have: a chain of them
/// is a tree as deep as it is long.
pub const MAX_OPERATORS: usize = 2_000;

/// Checks one statement against `grants`; `consumer` names the config
/// entry in errors.
///
/// Parsing, walking and dropping a syntax tree recurse as deep as the
/// tree. Its depth is bounded first, from the tokens ([`MAX_DEPTH`],
/// [`MAX_OPERATORS`]); a statement beyond a shallow shape is then checked
/// on a thread with a stack sized for the bound, so no statement can
/// overflow the caller's stack, in a debug build either.
pub fn check(
    sql: &str,
    db: DbKind,
    grants: &TableGrants,
    consumer: &str,
) -> Result<Checked, GateError> {
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
) -> Result<Checked, GateError> {
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
    let mut gate = Gate {
        grants,
        consumer,
        scope: HashSet::new(),
    };
    let checked = gate.statement(statement)?;
    expansion(statement)?;
    Ok(checked)
}

/// Refuses a statement that grows when it is planned.
///
/// Both planners inline a subquery or CTE into the query that reads it
/// (Postgres pulls subqueries up, SQLite flattens them): every reference to
/// an inner output column is replaced by that column's expression. Twenty
/// levels of `SELECT c || c AS c FROM (…)` are a few hundred bytes of SQL
/// and 2^20 nodes to plan; twenty-five made a Postgres backend allocate
/// 23 GB before the kernel killed it, and SQLite plans inside the host's
/// own process, before any deadline runs. So the gate weighs each output
/// column as the planners would expand it (a column reference weighs what
/// the heaviest column of the subqueries and CTEs in its FROM weighs) and
/// bounds the column ([`MAX_EXPANDED_COLUMN`]) and the statement
/// ([`MAX_EXPANDED_STATEMENT`]).
fn expansion(statement: &Statement) -> Result<(), GateError> {
    let mut ctes = std::collections::HashMap::new();
    if let Statement::Query(q) = statement
        && let Some(with) = &q.with
    {
        for cte in &with.cte_tables {
            let w = query_weight(&cte.query, &ctes);
            ctes.insert(cte.alias.name.value.to_ascii_lowercase(), w);
        }
    }
    let mut total = Expansion {
        ctes: &ctes,
        total: 0,
        heaviest: 0,
    };
    let _ = statement.visit(&mut total);
    if total.heaviest > MAX_EXPANDED_COLUMN || total.total > MAX_EXPANDED_STATEMENT {
        return Err(GateError::TooComplex(format!(
            "it expands to {} expression nodes when its subqueries are inlined ({} in one column); the limits are {MAX_EXPANDED_STATEMENT} and {MAX_EXPANDED_COLUMN}",
            total.total, total.heaviest
        )));
    }
    Ok(())
}

type Weights<'a> = &'a std::collections::HashMap<String, u64>;

/// Sums the expanded size of every SELECT in the statement.
struct Expansion<'a> {
    ctes: Weights<'a>,
    total: u64,
    heaviest: u64,
}

impl Visitor for Expansion<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
        let mut selects = Vec::new();
        collect_selects(&q.body, &mut selects);
        for select in selects {
            let inner = from_weight(&select.from, self.ctes);
            self.total = self.total.saturating_add(nodes(select, inner));
            self.heaviest = self.heaviest.max(select_weight(select, self.ctes));
        }
        ControlFlow::Continue(())
    }
}

fn collect_selects<'q>(body: &'q SetExpr, out: &mut Vec<&'q sqlparser::ast::Select>) {
    match body {
        SetExpr::Select(s) => out.push(s),
        SetExpr::SetOperation { left, right, .. } => {
            collect_selects(left, out);
            collect_selects(right, out);
        }
        _ => {}
    }
}

/// The heaviest output column of a query.
fn query_weight(q: &Query, ctes: Weights<'_>) -> u64 {
    set_weight(&q.body, ctes)
}

fn set_weight(body: &SetExpr, ctes: Weights<'_>) -> u64 {
    match body {
        SetExpr::Select(s) => select_weight(s, ctes),
        SetExpr::Query(q) => query_weight(q, ctes),
        SetExpr::SetOperation { left, right, .. } => {
            set_weight(left, ctes).max(set_weight(right, ctes))
        }
        SetExpr::Values(v) => nodes(v, 1),
        _ => 1,
    }
}

fn select_weight(s: &sqlparser::ast::Select, ctes: Weights<'_>) -> u64 {
    use sqlparser::ast::SelectItem;
    let inner = from_weight(&s.from, ctes);
    s.projection
        .iter()
        .map(|item| match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                nodes(e, inner)
            }
            _ => inner,
        })
        .max()
        .unwrap_or(1)
}

/// What a column reference weighs in a query with this FROM: the heaviest
/// column of its subqueries and CTEs, 1 for tables.
fn from_weight(from: &[TableWithJoins], ctes: Weights<'_>) -> u64 {
    from.iter()
        .flat_map(|t| std::iter::once(&t.relation).chain(t.joins.iter().map(|j| &j.relation)))
        .map(|f| factor_weight(f, ctes))
        .max()
        .unwrap_or(1)
}

fn factor_weight(f: &TableFactor, ctes: Weights<'_>) -> u64 {
    match f {
        TableFactor::Table { name, .. } => match name.0.as_slice() {
            [ObjectNamePart::Identifier(i)] => ctes
                .get(&i.value.to_ascii_lowercase())
                .copied()
                .unwrap_or(1),
            _ => 1,
        },
        TableFactor::Derived { subquery, .. } => query_weight(subquery, ctes),
        TableFactor::NestedJoin {
            table_with_joins, ..
        } => from_weight(std::slice::from_ref(table_with_joins), ctes),
        _ => 1,
    }
}

/// Expression nodes in `node` outside the queries nested in it (those are
/// weighed on their own), a column reference weighing `column`.
fn nodes<V: Visit>(node: &V, column: u64) -> u64 {
    struct Count {
        nodes: u64,
        column: u64,
        nested: usize,
    }
    impl Visitor for Count {
        type Break = ();
        fn pre_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
            self.nested += 1;
            ControlFlow::Continue(())
        }
        fn post_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
            self.nested -= 1;
            ControlFlow::Continue(())
        }
        fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
            if self.nested == 0 {
                // A literal is copied with every node that holds it, so it
                // weighs its length too.
                let n = match e {
                    Expr::Identifier(_) | Expr::CompoundIdentifier(_) => self.column,
                    Expr::Value(v) => 1 + v.to_string().len() as u64 / 16,
                    _ => 1,
                };
                self.nodes = self.nodes.saturating_add(n);
            }
            ControlFlow::Continue(())
        }
    }
    let mut c = Count {
        nodes: 0,
        column,
        nested: 0,
    };
    let _ = node.visit(&mut c);
    c.nodes.max(1)
}

struct Gate<'a> {
    grants: &'a TableGrants,
    consumer: &'a str,
    /// CTE names the statement's tables may refer to at this point.
    scope: HashSet<String>,
}

impl Gate<'_> {
    fn statement(&mut self, statement: &Statement) -> Result<Checked, GateError> {
        match statement {
            Statement::Query(q) => self.root_query(q),
            Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_) => {
                self.dml(statement)
            }
            other => Err(GateError::NotDml(statement_kind(other))),
        }
    }

    /// The statement's own query: its WITH (the only one allowed) is
    /// checked CTE by CTE, each seeing only the CTEs before it.
    fn root_query(&mut self, q: &Query) -> Result<Checked, GateError> {
        if let Some(with) = &q.with {
            if with.recursive {
                return Err(GateError::Construct("WITH RECURSIVE"));
            }
            for cte in &with.cte_tables {
                if is_host_name(&cte.alias.name) {
                    return Err(GateError::HostTable(cte.alias.name.value.clone()));
                }
                let name = normalize(&cte.alias.name)?;
                if cte.from.is_some() {
                    return Err(GateError::Construct("a CTE with FROM"));
                }
                self.walk(&*cte.query)?;
                if !self.scope.insert(name) {
                    return Err(GateError::Construct("two CTEs of one name"));
                }
            }
        }
        match &*q.body {
            SetExpr::Insert(s) | SetExpr::Update(s) | SetExpr::Delete(s) if q.with.is_some() => {
                if q.order_by.is_some() || q.limit_clause.is_some() || !q.locks.is_empty() {
                    return Err(GateError::Construct("ORDER BY, LIMIT or FOR after DML"));
                }
                self.dml(s)
            }
            _ => {
                let mut bare = q.clone();
                bare.with = None;
                self.walk(&bare)?;
                Ok(Checked {
                    returns_rows: true,
                    writes: false,
                })
            }
        }
    }

    fn dml(&mut self, statement: &Statement) -> Result<Checked, GateError> {
        let (target, returns_rows) = match statement {
            Statement::Insert(i) => {
                let TableObject::TableName(name) = &i.table else {
                    return Err(GateError::Construct("INSERT INTO a table function"));
                };
                (name.clone(), i.returning.is_some())
            }
            Statement::Update(u) => {
                if matches!(u.from, Some(UpdateTableFromKind::BeforeSet(_))) {
                    return Err(GateError::Construct("UPDATE FROM before SET"));
                }
                (single_table(&u.table)?, u.returning.is_some())
            }
            Statement::Delete(d) => {
                if !d.tables.is_empty() || d.limit.is_some() || !d.order_by.is_empty() {
                    return Err(GateError::Construct("multi-table DELETE"));
                }
                let (FromTable::WithFromKeyword(from) | FromTable::WithoutKeyword(from)) = &d.from;
                match from.as_slice() {
                    [t] => (single_table(t)?, d.returning.is_some()),
                    _ => return Err(GateError::Construct("DELETE from several tables")),
                }
            }
            other => return Err(GateError::NotDml(statement_kind(other))),
        };
        // A write target is always a real table (never a CTE), so it is
        // checked against the grants whatever is in scope.
        let table = self.table_name(&target)?;
        if !self.grants.may_write(&table) {
            return Err(GateError::NotGranted {
                table,
                consumer: self.consumer.into(),
                key: "write",
            });
        }
        self.walk(statement)?;
        Ok(Checked {
            returns_rows,
            writes: true,
        })
    }

    fn walk<V: Visit>(&mut self, node: &V) -> Result<(), GateError> {
        match node.visit(self) {
            ControlFlow::Continue(()) => Ok(()),
            ControlFlow::Break(e) => Err(e),
        }
    }

    /// A relation's name as the database resolves it: one ASCII part,
    /// unquoted names folded to lower case, never a host table.
    fn table_name(&self, name: &ObjectName) -> Result<String, GateError> {
        let [ObjectNamePart::Identifier(ident)] = name.0.as_slice() else {
            return Err(GateError::Qualified {
                name: name.to_string(),
                consumer: self.consumer.into(),
            });
        };
        let n = normalize(ident)?;
        if is_host_table(&n) {
            return Err(GateError::HostTable(n));
        }
        Ok(n)
    }
}

impl Visitor for Gate<'_> {
    type Break = GateError;

    fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<GateError> {
        let refuse = |what| ControlFlow::Break(GateError::Construct(what));
        if q.with.is_some() {
            return refuse("WITH inside a statement (put it at the start)");
        }
        if !q.locks.is_empty() {
            return refuse("a locking clause (FOR UPDATE, FOR SHARE …)");
        }
        if q.for_clause.is_some()
            || q.settings.is_some()
            || q.format_clause.is_some()
            || !q.pipe_operators.is_empty()
        {
            return refuse("this query syntax");
        }
        if let Some(name) = host_alias(&q.body) {
            return ControlFlow::Break(GateError::HostTable(name));
        }
        match body_problem(&q.body) {
            Some(what) => refuse(what),
            None => ControlFlow::Continue(()),
        }
    }

    fn pre_visit_relation(&mut self, relation: &ObjectName) -> ControlFlow<GateError> {
        let table = match self.table_name(relation) {
            Ok(t) => t,
            Err(e) => return ControlFlow::Break(e),
        };
        if self.scope.contains(&table) || self.grants.may_read(&table) {
            return ControlFlow::Continue(());
        }
        ControlFlow::Break(GateError::NotGranted {
            table,
            consumer: self.consumer.into(),
            key: "read",
        })
    }

    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<GateError> {
        let alias = match factor {
            TableFactor::Table { alias, .. } | TableFactor::Derived { alias, .. } => alias.as_ref(),
            _ => None,
        };
        if let Some(a) = alias
            && is_host_name(&a.name)
        {
            return ControlFlow::Break(GateError::HostTable(a.name.value.clone()));
        }
        match factor {
            TableFactor::Table {
                args, with_hints, ..
            } if args.is_none() && with_hints.is_empty() => ControlFlow::Continue(()),
            TableFactor::Table { .. } => {
                ControlFlow::Break(GateError::Construct("a table-valued function"))
            }
            TableFactor::Derived { .. } | TableFactor::NestedJoin { .. } => {
                ControlFlow::Continue(())
            }
            _ => ControlFlow::Break(GateError::Construct(
                "this FROM item (only tables, subqueries and joins)",
            )),
        }
    }

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<GateError> {
        let named = match expr {
            Expr::Identifier(i) => std::slice::from_ref(i),
            Expr::CompoundIdentifier(parts) => parts.as_slice(),
            _ => &[],
        };
        if let Some(i) = named.iter().find(|i| is_host_name(i)) {
            return ControlFlow::Break(GateError::HostTable(i.value.clone()));
        }
        let Expr::Function(f) = expr else {
            return ControlFlow::Continue(());
        };
        let [ObjectNamePart::Identifier(ident)] = f.name.0.as_slice() else {
            return ControlFlow::Break(GateError::Function(f.name.to_string()));
        };
        match normalize(ident) {
            Ok(name) if is_allowed_function(&name) => ControlFlow::Continue(()),
            Ok(name) => ControlFlow::Break(GateError::Function(name)),
            Err(e) => ControlFlow::Break(e),
        }
    }
}

/// What in a query body (outside its subqueries, which are visited as
/// queries of their own) is refused.
fn body_problem(body: &SetExpr) -> Option<&'static str> {
    match body {
        SetExpr::Select(s) if s.into.is_some() => Some("SELECT … INTO"),
        SetExpr::Select(_) | SetExpr::Values(_) | SetExpr::Query(_) => None,
        SetExpr::SetOperation { left, right, .. } => body_problem(left).or(body_problem(right)),
        SetExpr::Insert(_) | SetExpr::Update(_) | SetExpr::Delete(_) | SetExpr::Merge(_) => {
            Some("a data-modifying statement inside a query (a writable CTE)")
        }
        SetExpr::Table(_) => Some("`TABLE name`"),
    }
}

/// A select-list alias that is one of [`HOST_NAMES`].
fn host_alias(body: &SetExpr) -> Option<String> {
    use sqlparser::ast::SelectItem;
    match body {
        SetExpr::Select(s) => s.projection.iter().find_map(|item| match item {
            SelectItem::ExprWithAlias { alias, .. } if is_host_name(alias) => {
                Some(alias.value.clone())
            }
            _ => None,
        }),
        SetExpr::SetOperation { left, right, .. } => host_alias(left).or_else(|| host_alias(right)),
        _ => None,
    }
}

fn single_table(t: &TableWithJoins) -> Result<ObjectName, GateError> {
    match &t.relation {
        TableFactor::Table { name, args, .. } if args.is_none() && t.joins.is_empty() => {
            Ok(name.clone())
        }
        _ => Err(GateError::Construct("writing to anything but one table")),
    }
}

/// An identifier as both databases resolve it, for the checks: ASCII only;
/// unquoted folded to lower case; quoted kept (Postgres is case-sensitive
/// there, so a quoted name must match a grant exactly).
fn normalize(ident: &Ident) -> Result<String, GateError> {
    if !ident.value.is_ascii() {
        return Err(GateError::NonAscii(ident.value.clone()));
    }
    Ok(match ident.quote_style {
        None => ident.value.to_ascii_lowercase(),
        Some(_) => ident.value.clone(),
    })
}

fn statement_kind(s: &Statement) -> String {
    let text = s.to_string();
    text.split_whitespace().next().unwrap_or("?").to_uppercase()
}

#[cfg(test)]
mod tests {
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
}
