//! `outboxd bench sql-gate`: what the checks in front of a consumer
//! plugin's statement cost on the host's CPU, per statement: the lexical
//! guard alone, and the guard with the capability gate (parse, grants,
//! allowlist, shape and expansion bounds), for statements a plugin sends.

use std::time::Instant;

use outboxd_core::config::TableGrants;
use outboxd_core::db_url::DbKind;
use outboxd_core::sql_gate;

use super::BenchError;

#[derive(Debug, Clone, clap::Args)]
pub struct SqlGateBenchArgs {
    /// Checks of each statement per measurement.
    #[arg(long, default_value_t = 20_000)]
    pub iterations: u32,
}

const STATEMENTS: &[(&str, &str)] = &[
    (
        "insert",
        "INSERT INTO invoices (order_id, customer_id, amount_cents, message_id, issued_at) VALUES ($1, $2, $3, $4, $5)",
    ),
    (
        "upsert",
        "INSERT INTO invoices (order_id, amount_cents) VALUES ($1, $2) ON CONFLICT (order_id) DO UPDATE SET amount_cents = invoices.amount_cents + 1",
    ),
    ("select", "SELECT id, name FROM customers WHERE id = $1"),
    (
        "join",
        "SELECT c.name, count(*) FROM customers c JOIN invoices i ON i.customer_id = c.id WHERE c.id = $1 GROUP BY c.name",
    ),
];

pub async fn sql_gate(args: &SqlGateBenchArgs) -> Result<(), BenchError> {
    let grants = TableGrants {
        read: vec!["customers".into()],
        write: vec!["invoices".into()],
    };
    let n = args.iterations.max(1);
    println!("plugin SQL checks per statement, {n} iterations (µs):");
    println!(
        "{:<8} {:>10} {:>14} {:>14}",
        "", "guard", "guard+gate pg", "guard+gate sqlite"
    );
    for (name, sql) in STATEMENTS {
        let time = |f: &dyn Fn() -> bool| {
            let start = Instant::now();
            for _ in 0..n {
                if !f() {
                    return None;
                }
            }
            Some(start.elapsed().as_secs_f64() * 1e6 / f64::from(n))
        };
        let guard = time(&|| sql_gate::check_statement(sql).is_ok());
        let pg = time(&|| {
            sql_gate::check_statement(sql).is_ok()
                && sql_gate::check(sql, DbKind::Postgres, &grants, "bench").is_ok()
        });
        let lite = time(&|| {
            sql_gate::check_statement(sql).is_ok()
                && sql_gate::check(sql, DbKind::Sqlite, &grants, "bench").is_ok()
        });
        match (guard, pg, lite) {
            (Some(g), Some(p), Some(l)) => println!("{name:<8} {g:>10.2} {p:>14.2} {l:>14.2}"),
            _ => {
                return Err(BenchError::Incorrect(format!(
                    "`{sql}` was refused; the benchmark's statements must pass"
                )));
            }
        }
    }
    Ok(())
}
