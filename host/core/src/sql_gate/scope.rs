//! The scope visitor: walks a parsed statement and checks every table,
//! alias, function and construct against the consumer's grants and the
//! names in `names.rs`, keeping the CTE names in scope as the databases do.

use std::collections::HashSet;
use std::ops::ControlFlow;

use sqlparser::ast::{
    Expr, FromTable, Ident, ObjectName, ObjectNamePart, Query, SetExpr, Statement, TableFactor,
    TableObject, TableWithJoins, UpdateTableFromKind, Visit, Visitor,
};

use super::names::{is_allowed_function, is_host_name, is_host_table};
use super::{Checked, GateError};
use crate::config::TableGrants;

pub(super) struct Gate<'a> {
    pub(super) grants: &'a TableGrants,
    pub(super) consumer: &'a str,
    /// CTE names the statement's tables may refer to at this point.
    pub(super) scope: HashSet<String>,
    /// The first table the statement names (a write's target first).
    pub(super) first_table: Option<String>,
}

impl<'a> Gate<'a> {
    pub(super) fn new(grants: &'a TableGrants, consumer: &'a str) -> Self {
        Gate {
            grants,
            consumer,
            scope: HashSet::new(),
            first_table: None,
        }
    }

    pub(super) fn statement(&mut self, statement: &Statement) -> Result<Checked, GateError> {
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
        self.first_table = Some(table.clone());
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
            self.first_table.get_or_insert(table);
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
