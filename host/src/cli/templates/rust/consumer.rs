//! {{name}}: a consumer. Records each order in `orders_seen`, in the
//! transaction that also marks the message handled; a database error
//! rolls the message back and retries it (`?` converts it).

use outboxd_guest_consumer::{Consumer, Delivery, Result, Transaction};
use serde::Deserialize;

#[derive(Deserialize)]
struct Order {
    order_id: String,
    amount_cents: i64,
}

struct Plugin;

impl Consumer for Plugin {
    fn handle(tx: &Transaction<'_>, message: Delivery) -> Result<()> {
        let order: Order = message.json()?;
        tx.execute(
            "INSERT INTO orders_seen (message_id, order_id, amount_cents) VALUES ($1, $2, $3)",
            &[
                message.id.as_str().into(),
                order.order_id.into(),
                order.amount_cents.into(),
            ],
        )?;
        Ok(())
    }
}

outboxd_guest_consumer::export_consumer!(Plugin);
