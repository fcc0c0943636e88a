//! Hostile: writes an invoice and then traps, unless config `trap` is
//! `"false"`: a test redelivers the same message to a fixed version of the
//! plugin and sees it succeed once.

use outboxd_guest_consumer::{Consumer, Delivery, Result, Transaction};

struct TrapAfterWrite;

impl Consumer for TrapAfterWrite {
    fn handle(tx: &Transaction<'_>, message: Delivery) -> Result<()> {
        tx.execute(
            "INSERT INTO invoices (order_id, customer_id, amount_cents, message_id, issued_at)
             VALUES ('trap', 'trap', 1, $1, 0)",
            &[message.id.as_str().into()],
        )?;
        if outboxd_guest_consumer::config::get("trap").as_deref() != Some("false") {
            panic!("trapping after a write");
        }
        Ok(())
    }
}

outboxd_guest_consumer::export_consumer!(TrapAfterWrite);
