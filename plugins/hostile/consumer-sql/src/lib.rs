//! Hostile: writes an invoice, then tries to escape the host's transaction
//! or its limits with the statement named by config `attack`, ignores the
//! refusal and returns `ok`. The host must refuse or stop the statement and
//! roll back the message anyway.
//!
//! The guard's attacks: `commit`, `ddl`, `set_role`, `multi`, and
//! `set_config` (a role change hidden in a subscript, which Postgres runs).
//! The database's: `read_outbox` and `write_outbox` (outside the plugin's
//! role), `slow` (past the statement timeout). The host's: `rows` (past the
//! row budget).

use outboxd_guest::{Consumer, Delivery, Result, Transaction, config};

struct Escape;

/// 1 000 rows on Postgres and SQLite alike; the slow attack counts to 10⁹.
const COUNT_TO: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < ";

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
                let _ignored = tx.query(&format!("{COUNT_TO}1000) SELECT x FROM c"), &[]);
            }
            Some("slow") => {
                let _ignored =
                    tx.query(&format!("{COUNT_TO}1000000000) SELECT count(*) FROM c"), &[]);
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

outboxd_guest::export_consumer!(Escape);
