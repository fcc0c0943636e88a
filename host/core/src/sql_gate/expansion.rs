//! The expansion bound: a statement is weighed as the planners would grow
//! it when they inline its subqueries and CTEs, and refused past a bound.

use std::ops::ControlFlow;

use sqlparser::ast::{
    Expr, ObjectNamePart, Query, SetExpr, Statement, TableFactor, TableWithJoins, Visit, Visitor,
};

use super::GateError;

/// The largest an output column may grow when the databases inline the
/// subqueries and CTEs it is built from, in expression nodes (see
/// [`expansion`]).
pub const MAX_EXPANDED_COLUMN: u64 = 20_000;
/// The largest the whole statement may grow the same way.
pub const MAX_EXPANDED_STATEMENT: u64 = 200_000;

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
pub(super) fn expansion(statement: &Statement) -> Result<(), GateError> {
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
