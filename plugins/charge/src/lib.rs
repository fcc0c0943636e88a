//! The charge consumer: charges an order through an HTTP payment provider
//! and records the payment, exactly once per message.
//!
//! The effect that matters happens outside the database, so the inbox
//! alone cannot make it exactly once: if the process dies after the
//! provider answered and before the inbox commit, the message is
//! delivered again and charged again. The host sends every request with
//! `Idempotency-Key: <message id>`; a provider that deduplicates by that
//! key replays its first answer, and the order is charged once: only the
//! provider can deduplicate an effect that happens on its side.
//! `outbound_calls` keeps the evidence either way.
//!
//! Message: `{"order_id": "...", "amount_cents": 1250}`.
//! Config: `provider_url` (e.g. `http://127.0.0.1:8080`); the plugin POSTs
//! to `{provider_url}/charges`. A 2xx answer `{"charge_id": "..."}` writes
//! `payments (order_id, charge_id, message_id)`; a 4xx is permanent (the
//! same request is refused again), a 5xx or a transport error retryable.

use outboxd_guest_consumer::{Consumer, Delivery, Error, Result, Transaction, config, http};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize)]
struct Order {
    order_id: String,
    amount_cents: i64,
}

#[derive(Deserialize)]
struct Charge {
    charge_id: String,
}

struct ChargeOrder;

impl Consumer for ChargeOrder {
    fn handle(tx: &Transaction<'_>, message: Delivery) -> Result<()> {
        let order: Order = message.json()?;
        if order.amount_cents <= 0 {
            return Err(Error::permanent(format!(
                "order {}: amount_cents must be positive, got {}",
                order.order_id, order.amount_cents
            )));
        }
        let provider = config::get("provider_url")
            .ok_or_else(|| Error::permanent("config `provider_url` is not set"))?;
        let charge: Charge = http::post(format!("{}/charges", provider.trim_end_matches('/')))
            .json(&order)?
            .send()?
            .error_for_status()?
            .json()?;
        tx.execute(
            "INSERT INTO payments (order_id, charge_id, message_id) VALUES ($1, $2, $3)",
            &[
                order.order_id.into(),
                charge.charge_id.into(),
                message.id.as_str().into(),
            ],
        )?;
        Ok(())
    }
}

outboxd_guest_consumer::export_consumer!(ChargeOrder);
