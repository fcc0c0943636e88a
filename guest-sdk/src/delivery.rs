//! A message as a consumer receives it. The type comes from the WIT types
//! both worlds share, so it lives here; consumers get it through
//! `outboxd-guest-consumer`.

use serde::de::DeserializeOwned;

use crate::Error;
use crate::wit::transformer::outbox::plugin::types;

/// A message as the consumer receives it. `id` is the message id the inbox
/// deduplicates on: pass it as the idempotency key of any external call.
pub type Delivery = types::Message;

impl Delivery {
    /// The payload parsed as JSON into `T`; a mismatch is permanent.
    pub fn json<T: DeserializeOwned>(&self) -> crate::Result<T> {
        serde_json::from_slice(&self.payload).map_err(|e| {
            Error::Permanent(format!(
                "message {} on {}: payload does not match the expected JSON shape: {e}",
                self.id, self.topic
            ))
        })
    }

    /// The first header with this name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}
