//! The billing consumer: one invoice per `order.confirmed`. The inbox makes
//! a redelivered order a no-op, so the `invoices` table needs no unique
//! constraint. Accepts the plain order payload and a CloudEvents envelope
//! whose `data` holds the order (the `cloudevents` transformer's output).
//!
//! The message id is stored with the invoice: it is also the idempotency
//! key to pass to an external billing API, so a retry after a crash cannot
//! charge twice there either.

use outboxd_guest_consumer::{Consumer, Delivery, Error, Result, Transaction};
use serde::Deserialize;

#[derive(Deserialize)]
struct Order {
    order_id: String,
    customer_id: String,
    total_cents: i64,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Payload {
    CloudEvent { specversion: String, data: Order },
    Plain(Order),
}

/// Reads the order from either shape.
pub fn order(message: &Delivery) -> Result<(String, String, i64)> {
    let order = match message.json::<Payload>()? {
        Payload::CloudEvent { specversion, data } if specversion.starts_with('1') => data,
        Payload::CloudEvent { specversion, .. } => {
            return Err(Error::permanent(format!(
                "CloudEvents specversion `{specversion}` is not supported"
            )));
        }
        Payload::Plain(order) => order,
    };
    Ok((order.order_id, order.customer_id, order.total_cents))
}

fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

struct Billing;

impl Consumer for Billing {
    fn handle(tx: &Transaction<'_>, message: Delivery) -> Result<()> {
        let (order_id, customer_id, total_cents) = order(&message)?;
        tx.execute(
            "INSERT INTO invoices (order_id, customer_id, amount_cents, message_id, issued_at)
             VALUES ($1, $2, $3, $4, $5)",
            &[
                order_id.into(),
                customer_id.into(),
                total_cents.into(),
                message.id.as_str().into(),
                now_micros().into(),
            ],
        )?;
        Ok(())
    }
}

outboxd_guest_consumer::export_consumer!(Billing);
