//! Hostile: writes an invoice and then traps. Config `trap_until_attempt`
//! is not needed: a message whose payload has `"trap": false` is handled
//! normally, so a test can redeliver the same message id and see it succeed.

use outboxd_guest::{Consumer, Delivery, Result, Transaction};

struct TrapAfterWrite;

impl Consumer for TrapAfterWrite {
    fn handle(tx: &Transaction<'_>, message: Delivery) -> Result<()> {
        tx.execute(
            "INSERT INTO invoices (order_id, customer_id, amount_cents, message_id, issued_at)
             VALUES ('trap', 'trap', 1, $1, 0)",
            &[message.id.as_str().into()],
        )?;
        let input: serde_json::Value = message.json()?;
        if input.get("trap") != Some(&serde_json::Value::Bool(false)) {
            panic!("trapping after a write");
        }
        Ok(())
    }
}

outboxd_guest::export_consumer!(TrapAfterWrite);
