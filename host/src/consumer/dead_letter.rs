//! Consumer dead letters: a message that failed permanently, or too many
//! times, is recorded with its payload, headers, error, handler and attempt
//! count (and, on Kafka, published to `<topic>.dlq`), so its partition can
//! move on without losing it.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::broker::PublishError;
use crate::message::Delivery;
use crate::message::OutgoingMessage;

/// Publishes a dead letter to `<topic>.dlq` (Kafka).
pub type DeadLetterTopic =
    Arc<dyn Fn(OutgoingMessage) -> BoxFuture<'static, Result<(), PublishError>> + Send + Sync>;

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
