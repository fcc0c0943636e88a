//! One transformer plugin version: compiled and pre-instantiated once, then
//! called per event in a sandboxed Store that is reused until it fails.

use std::time::Instant;

use crate::config::Limits;
use crate::plugin::bindings::transformer::outbox::plugin::types::{
    Event, OutgoingMessage, PluginError as WitError,
};
use crate::plugin::bindings::transformer::{Transformer, TransformerPre};
use crate::plugin::error::{PluginError, classify};
use crate::plugin::host::{StoreState, TransformerState};
use crate::plugin::runtime::loaded::Loaded;

/// A loaded transformer plugin. Share it with `Arc`; calls may overlap.
#[derive(Debug)]
pub struct TransformerPlugin {
    loaded: Loaded<Transformer>,
}

crate::plugin::runtime::loaded::plugin_world!(
    Transformer,
    TransformerPre,
    TransformerPlugin,
    data: TransformerState,
    linker: transformers,
    world: "transformer",
    name: "outbox:plugin/transformer@0.1.0",
    imports: "a transformer may import only WASI p2 and outbox:plugin/config@0.1.0; \
              outbox:plugin/transaction is for consumers, which export `handle`",
    build: "build it against wit/outbox-plugin.wit",
);

impl TransformerPlugin {
    pub fn sha256(&self) -> &str {
        &self.loaded.sha256
    }

    pub fn limits(&self) -> &Limits {
        &self.loaded.limits
    }

    /// Runs the plugin on one event. Never panics and never leaves a failed
    /// Store behind: after a trap, a timeout or an exhausted limit the Store
    /// is dropped and the next call starts from a fresh instance.
    pub async fn transform(&self, event: &Event) -> Result<Vec<OutgoingMessage>, PluginError> {
        let start = Instant::now();
        let result = self.call(event).await;
        self.loaded.metrics.record(
            start.elapsed(),
            result.as_ref().err().map(PluginError::kind),
        );
        result
    }

    async fn call(&self, event: &Event) -> Result<Vec<OutgoingMessage>, PluginError> {
        let mut slot = self.loaded.slot().await?;
        let result = slot.bindings.call_transform(&mut slot.store, event).await;
        self.loaded
            .metrics
            .memory_used(slot.store.data().sandbox().memory.used());
        self.loaded.drain_logs(&slot.store);
        let outcome = match result {
            Ok(Ok(messages)) => self.check_output(messages),
            Ok(Err(WitError::Retryable(message))) => Err(PluginError::Guest {
                retryable: true,
                message,
            }),
            Ok(Err(WitError::Permanent(message))) => Err(PluginError::Guest {
                retryable: false,
                message,
            }),
            Err(e) => {
                // The instance may be in any state: drop the Store.
                let hit = slot.store.data().sandbox().memory.hit;
                return Err(classify(e, hit, &self.loaded.limits));
            }
        };
        self.loaded.give_back(slot);
        outcome
    }

    fn check_output(
        &self,
        messages: Vec<OutgoingMessage>,
    ) -> Result<Vec<OutgoingMessage>, PluginError> {
        if messages.len() > self.loaded.limits.max_outputs {
            return Err(PluginError::TooManyOutputs {
                count: messages.len(),
                cap: self.loaded.limits.max_outputs,
            });
        }
        let bytes: usize = messages.iter().map(message_bytes).sum();
        if bytes > self.loaded.limits.max_output_bytes {
            return Err(PluginError::OutputTooLarge {
                bytes,
                cap: self.loaded.limits.max_output_bytes,
            });
        }
        Ok(messages)
    }
}

/// What a message costs against `max_output_bytes`.
pub fn message_bytes(m: &OutgoingMessage) -> usize {
    m.payload.len()
        + m.key.len()
        + m.topic.as_ref().map_or(0, String::len)
        + m.headers
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
}
