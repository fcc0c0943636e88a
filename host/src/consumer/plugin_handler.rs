//! [`PluginHandler`]: a consumer plugin as an inbox [`Handler`]. It maps
//! what the plugin did onto what the runner does next: a guest `permanent`
//! dead-letters, everything else (traps, timeouts, budgets, database
//! errors, guest `retryable`) is rolled back and retried.

use std::sync::Arc;

use super::inbox::{Handler, HandlerError, InboxTx};
use crate::broker::Delivery;
use crate::plugin::bindings::transformer::outbox::plugin::types::Message;
use crate::plugin::{ConsumerPlugin, PluginError, TxnPolicy};

#[derive(Debug, Clone)]
pub struct PluginHandler {
    plugin: Arc<ConsumerPlugin>,
    policy: TxnPolicy,
}

impl PluginHandler {
    pub fn new(plugin: Arc<ConsumerPlugin>, policy: TxnPolicy) -> Self {
        Self { plugin, policy }
    }

    /// `plugin NAME@VERSION`, the dead letters' handler id.
    pub fn handler_id(&self) -> String {
        format!("plugin {}", self.plugin.label())
    }

    pub fn plugin(&self) -> &ConsumerPlugin {
        &self.plugin
    }
}

/// The plugin's view of a delivery. Header values that are not UTF-8 are
/// passed lossily; the message id is the deduplicated one.
fn to_message(d: &Delivery, id: String) -> Message {
    Message {
        id,
        topic: d.topic.clone(),
        key: d.key.clone(),
        payload: d.payload.clone(),
        headers: d
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
            .collect(),
        attempt: d.attempt,
    }
}

impl Handler for PluginHandler {
    async fn begin(&self, tx: &mut InboxTx) -> Result<(), sqlx::Error> {
        crate::plugin::transaction::begin_session(tx, &self.policy).await
    }

    async fn handle(&self, tx: &mut InboxTx, d: &Delivery) -> Result<(), HandlerError> {
        let id = d.message_id().map_err(HandlerError::Permanent)?.to_string();
        let message = to_message(d, id);
        self.plugin
            .handle(tx, &message, &self.policy)
            .await
            .map_err(|e| {
                let text = format!("plugin {}: {e}", self.plugin.label());
                if e.is_permanent() {
                    HandlerError::Permanent(text)
                } else {
                    HandlerError::Retryable(text)
                }
            })
    }
}

impl From<PluginError> for HandlerError {
    fn from(e: PluginError) -> Self {
        HandlerError::Retryable(e.to_string())
    }
}
