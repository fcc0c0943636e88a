//! Hostile: writes an invoice, then tries to escape the host's transaction
//! with the statement named by config `attack` (`commit`, `ddl`,
//! `set_role`, `multi`, or `read_outbox` for the role check), ignores the refusal and returns `ok`. The host
//! must refuse the statement and roll back the message anyway.

use outboxd_guest::{Consumer, Delivery, Result, Transaction, config};

struct Escape;

impl Consumer for Escape {
    fn handle(tx: &Transaction<'_>, message: Delivery) -> Result<()> {
        tx.execute(
            "INSERT INTO invoices (order_id, customer_id, amount_cents, message_id, issued_at)
             VALUES ('evil', 'evil', 1, $1, 0)",
            &[message.id.as_str().into()],
        )?;
        let sql = match config::get("attack").as_deref() {
            Some("ddl") => "DROP TABLE invoices",
            Some("set_role") => "SET ROLE postgres",
            Some("multi") => "DELETE FROM inbox; DELETE FROM invoices",
            // Passes the guard; the database's role check must stop it.
            Some("read_outbox") => "SELECT * FROM outbox",
            _ => "COMMIT",
        };
        let _ignored = tx.execute(sql, &[]);
        Ok(())
    }
}

outboxd_guest::export_consumer!(Escape);
