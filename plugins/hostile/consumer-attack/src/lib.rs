//! Hostile: runs whatever SQL the message carries, as an attacker who
//! controls the plugin (or its input) would. The hostile corpus
//! (tests/integration/hostile_sql_corpus.rs) sends one attack, then
//! innocent messages that must each take effect exactly once.
//!
//! Payload: `{"sql": "...", "query": true}` runs the statement with
//! `query` (else `execute`), ignores any refusal and returns `ok`, so only
//! the host can stop it. `{"emit_after": true}` emits an event after the
//! statement. Without `sql`: writes one invoice for `order_id` (the
//! innocent effect).

use outboxd_guest_consumer::{Consumer, Delivery, NewEvent, Result, Transaction};
use serde::Deserialize;

#[derive(Deserialize, Default)]
#[serde(default)]
struct Input {
    sql: Option<String>,
    query: bool,
    emit_after: bool,
    order_id: Option<String>,
}

struct Attack;

impl Consumer for Attack {
    fn handle(tx: &Transaction<'_>, message: Delivery) -> Result<()> {
        let input: Input = serde_json::from_slice(&message.payload).unwrap_or_default();
        match input.sql {
            Some(sql) if input.query => {
                let _ignored = tx.query(&sql, &[]);
            }
            Some(sql) => {
                let _ignored = tx.execute(&sql, &[]);
            }
            None => {
                let order = input.order_id.unwrap_or_else(|| message.id.clone());
                tx.execute(
                    "INSERT INTO invoices (order_id, customer_id, amount_cents, message_id, issued_at)
                     VALUES ($1, 'innocent', 1, $2, 0)",
                    &[order.as_str().into(), message.id.as_str().into()],
                )?;
            }
        }
        if input.emit_after {
            tx.emit(NewEvent {
                aggregate_id: format!("emitted-{}", message.id),
                event_type: "attack.emitted".into(),
                payload: br#"{"from":"attack"}"#.to_vec(),
                headers: vec![],
            })?;
        }
        Ok(())
    }
}

outboxd_guest_consumer::export_consumer!(Attack);
