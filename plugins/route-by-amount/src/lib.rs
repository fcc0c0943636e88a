//! Splits an order into one message per item, keyed by SKU, and sends large
//! items to their own topic: the split and re-key example.
//!
//! Payload: `{"order_id": "o-1", "items": [{"sku": "a", "amount": 120}]}`.
//! Config: `threshold` (default 1000) and `large_topic` (default
//! `orders.large`). An order without items is filtered.

use outboxd_guest::{Error, Event, Message, Result, Transformer, config};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Order {
    order_id: String,
    #[serde(default)]
    items: Vec<Item>,
}

#[derive(Deserialize, Serialize)]
struct Item {
    sku: String,
    amount: i64,
}

#[derive(Serialize)]
struct ItemMessage<'a> {
    order_id: &'a str,
    index: usize,
    #[serde(flatten)]
    item: &'a Item,
}

struct RouteByAmount;

impl Transformer for RouteByAmount {
    fn transform(event: Event) -> Result<Vec<Message>> {
        let order: Order = event.json()?;
        let threshold = match config::get("threshold") {
            Some(t) => t
                .parse::<i64>()
                .map_err(|e| Error::permanent(format!("config `threshold` = `{t}`: {e}")))?,
            None => 1000,
        };
        let large_topic = config::get("large_topic").unwrap_or_else(|| "orders.large".into());
        order
            .items
            .iter()
            .enumerate()
            .map(|(index, item)| {
                let msg =
                    event
                        .forward()
                        .with_key(item.sku.as_bytes())
                        .with_json(&ItemMessage {
                            order_id: &order.order_id,
                            index,
                            item,
                        })?;
                Ok(if item.amount >= threshold {
                    msg.with_topic(large_topic.clone())
                } else {
                    msg
                })
            })
            .collect()
    }
}

outboxd_guest::export_transformer!(RouteByAmount);
