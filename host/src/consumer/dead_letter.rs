//! Consumer dead letters: a message that failed permanently, or too many
//! times, is recorded with its payload, headers, error, handler and attempt
//! count (and, on Kafka, published to `<topic>.dlq`), so its partition can
//! move on without losing it.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::broker::{Delivery, OutgoingMessage, PublishError};
use crate::store::{Db, on_pool};

/// Publishes a dead letter to `<topic>.dlq` (Kafka).
pub type DeadLetterTopic =
    Arc<dyn Fn(OutgoingMessage) -> BoxFuture<'static, Result<(), PublishError>> + Send + Sync>;

fn headers_json(headers: &[(String, Vec<u8>)]) -> String {
    let list: Vec<serde_json::Value> = headers
        .iter()
        .map(|(k, v)| match std::str::from_utf8(v) {
            Ok(text) => serde_json::json!([k, text]),
            Err(_) => serde_json::json!([k, { "hex": hex::encode(v) }]),
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

/// Records `d` as dead for `consumer`.
pub async fn record(
    db: &Db,
    consumer: &str,
    d: &Delivery,
    error: &str,
    handler: &str,
    attempts: u32,
) -> Result<(), sqlx::Error> {
    let message_id = d.message_id().ok();
    let headers = headers_json(&d.headers);
    let error = crate::store::truncate(error, 2000);
    let sql = "INSERT INTO consumer_dead_letters
        (consumer, message_id, topic, partition, \"offset\", message_key, payload, headers, error, handler, attempts)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";
    // Both databases take the id as text and the attempts as a bigint;
    // Postgres casts them to its column types.
    let sql = match db {
        Db::Postgres(_) => sql
            .replace("$2,", "CAST($2 AS uuid),")
            .replace("$8,", "$8::jsonb,")
            .replace("$11)", "CAST($11 AS integer))"),
        Db::Sqlite(_) => sql.to_string(),
    };
    on_pool!(db, |p| {
        sqlx::query(&sql)
            .bind(consumer)
            .bind(message_id.map(|u| u.to_string()))
            .bind(&d.topic)
            .bind(d.partition)
            .bind(d.offset)
            .bind(&d.key)
            .bind(&d.payload)
            .bind(&headers)
            .bind(&error)
            .bind(handler)
            .bind(attempts as i64)
            .execute(p)
            .await?;
    });
    Ok(())
}

/// The `<topic>.dlq` message for a dead delivery: the original key, payload
/// and headers, plus why it died.
pub fn dlq_message(
    consumer: &str,
    d: &Delivery,
    error: &str,
    handler: &str,
    attempts: u32,
) -> OutgoingMessage {
    let mut headers = d.headers.clone();
    headers.push(("dlq-consumer".into(), consumer.as_bytes().to_vec()));
    headers.push((
        "dlq-error".into(),
        crate::store::truncate(error, 2000).into_bytes(),
    ));
    headers.push(("dlq-handler".into(), handler.as_bytes().to_vec()));
    headers.push(("dlq-attempts".into(), attempts.to_string().into_bytes()));
    headers.push((
        "dlq-source".into(),
        format!("{}/{}@{}", d.topic, d.partition, d.offset).into_bytes(),
    ));
    OutgoingMessage {
        topic: format!("{}.dlq", d.topic),
        key: d.key.clone().unwrap_or_default(),
        payload: d.payload.clone(),
        headers,
        message_id: d.message_id().unwrap_or_else(|_| uuid::Uuid::new_v4()),
        created_at: chrono::Utc::now(),
    }
}
