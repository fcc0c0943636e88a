//! Hostile: writes an invoice, then tries to escape the host's transaction
//! or its limits with the statement named by config `attack`, ignores the
//! refusal and returns `ok`. The host must refuse or stop the statement and
//! roll back the message anyway.
//!
//! The guard's attacks: `commit`, `ddl`, `set_role`, `multi`, and
//! `set_config` (a role change hidden in a subscript, which Postgres runs).
//! The capability gate's: `read_outbox` and `write_outbox` (the host's
//! tables; outside the plugin's role too). The database's: `slow` (past
//! the statement timeout). The host's: `rows` (past the row budget).

use outboxd_guest_consumer::{Consumer, Delivery, Result, Transaction, config};

struct Escape;

/// 10^`tens` rows on Postgres and SQLite alike, without recursion or
/// functions (which the gate refuses): a cross join of ten-row unions.
fn rows(tens: usize) -> String {
    let ten = (0..10)
        .map(|i| format!("SELECT {i} AS x"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let from = (0..tens)
        .map(|i| format!("({ten}) t{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!("SELECT t0.x FROM {from}")
}

impl Consumer for Escape {
    fn handle(tx: &Transaction<'_>, message: Delivery) -> Result<()> {
        tx.execute(
            "INSERT INTO invoices (order_id, customer_id, amount_cents, message_id, issued_at)
             VALUES ('evil', 'evil', 1, $1, 0)",
            &[message.id.as_str().into()],
        )?;
        let attack = config::get("attack");
        match attack.as_deref() {
            Some("rows") => {
                let _ignored = tx.query(&rows(3), &[]);
            }
            Some("slow") => {
                let _ignored = tx.query(&format!("SELECT count(*) FROM ({}) c", rows(9)), &[]);
            }
            other => {
                let sql = match other {
                    Some("ddl") => "DROP TABLE invoices",
                    Some("set_role") => "SET ROLE postgres",
                    Some("multi") => "DELETE FROM inbox; DELETE FROM invoices",
                    Some("set_config") => {
                        "SELECT (ARRAY[1,2,3,4,5,6,7,8])[length(set_config('role', 'postgres', true))]"
                    }
                    // These pass the guard; the database's role check must
                    // stop them.
                    Some("read_outbox") => "SELECT * FROM outbox",
                    Some("write_outbox") => "DELETE FROM outbox",
                    _ => "COMMIT",
                };
                let _ignored = tx.execute(sql, &[]);
            }
        }
        Ok(())
    }
}

outboxd_guest_consumer::export_consumer!(Escape);
