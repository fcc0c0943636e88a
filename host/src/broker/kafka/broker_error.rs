//! The last error librdkafka reported about the brokers themselves (a
//! refused login, a connection that failed). A message that cannot be
//! delivered fails only with "timed out"; the relay stores that reason with
//! the broker's own complaint added, so the operator reads "SASL
//! authentication failed" instead of guessing.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// Errors older than this are not added to a failed message's reason.
const RECENT: Duration = Duration::from_secs(60);

/// Shared by every producer a publisher creates, so the report survives a
/// producer being replaced.
#[derive(Debug, Clone, Default)]
pub(super) struct BrokerErrors {
    last: Arc<Mutex<Option<(Instant, String)>>>,
}

impl BrokerErrors {
    /// The last client-level error, if one was reported recently.
    pub(super) fn recent(&self) -> Option<String> {
        let last = self.last.lock().ok()?;
        match &*last {
            Some((at, reason)) if at.elapsed() < RECENT => Some(reason.clone()),
            _ => None,
        }
    }
}

impl ClientContext for BrokerErrors {
    fn error(&self, error: KafkaError, reason: &str) {
        // librdkafka's reasons name brokers, mechanisms and states, never
        // the configured secrets.
        tracing::warn!(error = %error, reason, "kafka client error");
        if let Ok(mut last) = self.last.lock() {
            // "All brokers are down" follows the error that brought them
            // down; keep the cause when it is recent.
            let summary = error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown);
            if summary && last.as_ref().is_some_and(|(at, _)| at.elapsed() < RECENT) {
                return;
            }
            *last = Some((Instant::now(), format!("{error}: {reason}")));
        }
    }
}
