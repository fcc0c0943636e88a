//! The chaos soak's consumer: one `ledger` row per message, so the soak can
//! count effects (exactly once), and check each aggregate's order (`seq`
//! rises in `ledger.id` order). Accepts the plain payload and a CloudEvents
//! envelope whose `data` holds it, because the soak hot-swaps the relay's
//! transformer from one shape to the other mid-run.
//!
//! The table (created by the soak):
//! `ledger(id identity, message_id, aggregate_id, seq, shape, writer)`.

use outboxd_guest_consumer::{Consumer, Delivery, Error, Result, Transaction};
use serde::Deserialize;

#[cfg(not(feature = "v2"))]
const WRITER: &str = "ledger-v1";
#[cfg(feature = "v2")]
const WRITER: &str = "ledger-v2";

#[derive(Deserialize)]
struct Body {
    /// The producer's per-aggregate sequence number (0 when it has none,
    /// e.g. an order confirmation).
    #[serde(default)]
    seq: i64,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Payload {
    CloudEvent { specversion: String, data: Body },
    Plain(Body),
}

struct Ledger;

impl Consumer for Ledger {
    fn handle(tx: &Transaction<'_>, message: Delivery) -> Result<()> {
        let (seq, shape) = match message.json::<Payload>()? {
            Payload::CloudEvent { specversion, data } if specversion.starts_with('1') => {
                (data.seq, "cloudevents")
            }
            Payload::CloudEvent { specversion, .. } => {
                return Err(Error::permanent(format!(
                    "CloudEvents specversion `{specversion}` is not supported"
                )));
            }
            Payload::Plain(body) => (body.seq, "plain"),
        };
        let aggregate = match &message.key {
            Some(key) => String::from_utf8(key.clone()).map_err(|_| {
                Error::permanent(format!("message {}: the key is not UTF-8", message.id))
            })?,
            None => {
                return Err(Error::permanent(format!(
                    "message {}: no key, so no aggregate to order by",
                    message.id
                )));
            }
        };
        tx.execute(
            "INSERT INTO ledger (message_id, aggregate_id, seq, shape, writer)
             VALUES ($1, $2, $3, $4, $5)",
            &[
                message.id.as_str().into(),
                aggregate.into(),
                seq.into(),
                shape.into(),
                WRITER.into(),
            ],
        )?;
        Ok(())
    }
}

outboxd_guest_consumer::export_consumer!(Ledger);
