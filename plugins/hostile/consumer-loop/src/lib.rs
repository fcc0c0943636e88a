//! Hostile: writes an invoice, then calls the host forever, ignoring every
//! error. The statement budget stops the calls and the deadline stops the
//! loop.

use outboxd_guest_consumer::{Consumer, Delivery, Result, Transaction};

struct Forever;

impl Consumer for Forever {
    fn handle(tx: &Transaction<'_>, message: Delivery) -> Result<()> {
        tx.execute(
            "INSERT INTO invoices (order_id, customer_id, amount_cents, message_id, issued_at)
             VALUES ('loop', 'loop', 1, $1, 0)",
            &[message.id.as_str().into()],
        )?;
        loop {
            let _ignored = tx.query("SELECT 1", &[]);
        }
    }
}

outboxd_guest_consumer::export_consumer!(Forever);
