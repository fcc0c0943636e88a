//! Adds `amount_cents` (an integer) next to an order's `amount`, and the
//! header `amount-cents-by` naming the version that did it.
//!
//! The first version reads `amount` only as a JSON number and fails an
//! event whose amount is written as text (`"12.50"`) permanently, so the
//! relay dead-letters it. Built with `--features v2`, it also reads a
//! decimal string: the fix for that bug. The two are the tests'
//! fix-forward pair (a poison event dead on v1, redriven through v2).
//!
//! Payload: `{"order_id": "o-1", "amount": 12.5}`.

use outboxd_guest::{Error, Event, Message, Result, Transformer};
use serde_json::Value;

#[cfg(not(feature = "v2"))]
const VERSION: &str = "amount-cents-v1";
#[cfg(feature = "v2")]
const VERSION: &str = "amount-cents-v2";

/// `amount` in cents, rounded to the nearest cent.
fn cents(amount: &Value) -> Result<i64> {
    let units = match amount {
        Value::Number(n) => n.as_f64(),
        #[cfg(feature = "v2")]
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    match units {
        Some(u) if u.is_finite() && u.abs() < 9e13 => Ok((u * 100.0).round() as i64),
        _ => Err(Error::permanent(format!(
            "`amount` must be a number, not {amount}"
        ))),
    }
}

struct AmountCents;

impl Transformer for AmountCents {
    fn transform(event: Event) -> Result<Vec<Message>> {
        let mut doc: Value = event.json()?;
        let Some(order) = doc.as_object_mut() else {
            return Err(Error::permanent("the payload must be a JSON object"));
        };
        let amount = order.get("amount").cloned().unwrap_or(Value::Null);
        order.insert("amount_cents".into(), Value::from(cents(&amount)?));
        Ok(vec![
            event
                .forward()
                .with_json(&doc)?
                .with_header("amount-cents-by", VERSION),
        ])
    }
}

outboxd_guest::export_transformer!(AmountCents);
