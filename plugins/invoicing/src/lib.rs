//! Billing that also starts the next saga step: it writes the invoice and
//! emits `invoice.issued` in the same transaction, so the event exists if
//! and only if the invoice does. Config `fail_after_emit = "true"` returns
//! a retryable error after emitting (the tests' rolled-back handler).

use outboxd_guest_consumer::{Consumer, Delivery, Error, NewEvent, Result, Transaction, config};
use serde::Deserialize;

#[derive(Deserialize)]
struct Order {
    order_id: String,
    customer_id: String,
    total_cents: i64,
}

struct Invoicing;

impl Consumer for Invoicing {
    fn handle(tx: &Transaction<'_>, message: Delivery) -> Result<()> {
        let order: Order = message.json()?;
        let rows = tx.query(
            "INSERT INTO invoices (order_id, customer_id, amount_cents, message_id, issued_at)
             VALUES ($1, $2, $3, $4, 0) RETURNING id",
            &[
                order.order_id.as_str().into(),
                order.customer_id.as_str().into(),
                order.total_cents.into(),
                message.id.as_str().into(),
            ],
        )?;
        let invoice_id = match rows.rows.first().and_then(|r| r.first()) {
            Some(outboxd_guest_consumer::Value::Int(id)) => *id,
            other => return Err(Error::permanent(format!("unexpected RETURNING: {other:?}"))),
        };
        let event = NewEvent::json(
            order.order_id.as_str(),
            "invoice.issued",
            &serde_json::json!({
                "invoice_id": invoice_id,
                "order_id": order.order_id,
                "amount_cents": order.total_cents,
            }),
        )?
        .with_header("causation-id", message.id.as_str());
        tx.emit(event)?;
        if config::get("fail_after_emit").as_deref() == Some("true") {
            return Err(Error::retryable("fail_after_emit is set"));
        }
        Ok(())
    }
}

outboxd_guest_consumer::export_consumer!(Invoicing);
