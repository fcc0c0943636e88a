//! The billing side of the example: one invoice per confirmed order. The
//! `invoices` table has no unique constraint on purpose, so a duplicate
//! effect would be visible; the inbox is what prevents it.

use serde::Deserialize;

use outboxd::consumer::Handler;
use outboxd::consumer::HandlerError;
use outboxd::db_url::DbKind;
use outboxd::message::Delivery;
use outboxd::sql_values::SqlValue;
use outboxd::store::Db;
use outboxd::store::InboxTx;

const PG_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS invoices (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  order_id     text   NOT NULL,
  customer_id  text   NOT NULL,
  amount_cents bigint NOT NULL,
  message_id   text   NOT NULL,
  issued_at    bigint NOT NULL
)";

const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS invoices (
  id           INTEGER PRIMARY KEY AUTOINCREMENT,
  order_id     TEXT    NOT NULL,
  customer_id  TEXT    NOT NULL,
  amount_cents INTEGER NOT NULL,
  message_id   TEXT    NOT NULL,
  issued_at    INTEGER NOT NULL
)";

/// Safe when several processes start at once: on Postgres two concurrent
/// `CREATE TABLE IF NOT EXISTS` can both miss the table and one then fails
/// on the catalog's unique index, so creators take an advisory lock first.
pub async fn create_schema(db: &Db) -> Result<(), sqlx::Error> {
    let sql = match db.kind() {
        DbKind::Postgres => PG_SCHEMA,
        DbKind::Sqlite => SQLITE_SCHEMA,
    };
    outboxd::store::execute_in_app_schema(db, sql).await
}

#[derive(Debug, Deserialize)]
struct OrderConfirmed {
    order_id: String,
    customer_id: String,
    total_cents: i64,
}

/// The order, from a plain payload or from a CloudEvents envelope's `data`.
fn order_from(payload: &[u8]) -> Result<OrderConfirmed, serde_json::Error> {
    let value: serde_json::Value = serde_json::from_slice(payload)?;
    let inner = match value.get("specversion").and(value.get("data")) {
        Some(data) => data.clone(),
        None => value,
    };
    serde_json::from_value(inner)
}

/// The example's native billing handler: what the billing plugin does, in
/// Rust. A binary registers it as `builtin:billing` with
/// `Daemon::builder().handler("billing", BillingHandler)`.
#[derive(Debug, Default, Clone)]
pub struct BillingHandler;

impl Handler for BillingHandler {
    async fn handle(&self, tx: &mut InboxTx, d: &Delivery) -> Result<(), HandlerError> {
        let ev: OrderConfirmed = order_from(&d.payload).map_err(|e| {
            HandlerError::Permanent(format!(
                "{}/{}@{}: payload is not an order.confirmed event ({e})",
                d.topic, d.partition, d.offset
            ))
        })?;
        let message_id = d.message_id().map_err(HandlerError::Permanent)?.to_string();
        let now = chrono::Utc::now().timestamp_micros();
        let sql =
            "INSERT INTO invoices (order_id, customer_id, amount_cents, message_id, issued_at)
                   VALUES ($1, $2, $3, $4, $5)";
        tx.execute(
            sql,
            vec![
                SqlValue::Text(ev.order_id),
                SqlValue::Text(ev.customer_id),
                SqlValue::Int(ev.total_cents),
                SqlValue::Text(message_id),
                SqlValue::Int(now),
            ],
        )
        .await?;
        Ok(())
    }
}
