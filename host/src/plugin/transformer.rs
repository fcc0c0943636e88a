//! One transformer plugin version: compiled and pre-instantiated once, then
//! called per event in a sandboxed Store that is reused until it fails.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sha2::{Digest, Sha256};
use wasmtime::Store;

use super::bindings::transformer::outbox::plugin::types::{
    Event, OutgoingMessage, PluginError as WitError,
};
use super::bindings::transformer::{Transformer, TransformerPre};
use super::engine::{EPOCH_TICK, PluginEngine};
use super::error::PluginError;
use super::host::HostState;
use super::limits::Limits;
use super::log::{LineBudget, drain};
use super::metrics::PluginMetrics;
use super::{cache, validate};

/// A `[[plugins]]` entry and its source are config data, in `outboxd-core`.
pub use outboxd_core::config::{PluginSource, PluginSpec};

/// A Store with a live instance, ready for the next call.
struct Slot {
    store: Store<HostState>,
    bindings: Transformer,
}

/// A loaded transformer plugin. Share it with `Arc`; calls may overlap.
pub struct TransformerPlugin {
    name: String,
    version: String,
    sha256: String,
    limits: Limits,
    engine: PluginEngine,
    pre: TransformerPre<HostState>,
    config: Arc<BTreeMap<String, String>>,
    idle: Mutex<Vec<Slot>>,
    log_budget: Mutex<LineBudget>,
    metrics: PluginMetrics,
}

impl std::fmt::Debug for TransformerPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransformerPlugin")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("sha256", &self.sha256)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// Idle Stores kept per plugin; more concurrent calls instantiate extra
/// Stores that are dropped afterwards.
const MAX_IDLE: usize = 8;

impl TransformerPlugin {
    /// Reads, checks, compiles (or loads from the cache) and pre-instantiates
    /// the component: everything that can be done once per version.
    pub fn load(engine: &PluginEngine, spec: &PluginSpec) -> Result<Self, PluginError> {
        let wasm = std::fs::read(&spec.path).map_err(|e| {
            PluginError::Invalid(format!(
                "plugin `{}`: cannot read {}: {e}",
                spec.name,
                spec.path.display()
            ))
        })?;
        Self::from_bytes(engine, spec, &wasm)
    }

    pub fn from_bytes(
        engine: &PluginEngine,
        spec: &PluginSpec,
        wasm: &[u8],
    ) -> Result<Self, PluginError> {
        let invalid = |what: String| {
            PluginError::Invalid(format!(
                "plugin `{}` ({}): {what}",
                spec.name,
                spec.path.display()
            ))
        };
        validate::check_is_component(wasm).map_err(invalid)?;
        let sha256 = hex::encode(Sha256::digest(wasm));
        let component = cache::load_or_compile(
            &engine.engine,
            engine.config.cache_dir.as_deref(),
            &sha256,
            wasm,
        )
        .map_err(|e| invalid(format!("does not compile: {e}")))?;
        let instance_pre = engine.linker.instantiate_pre(&component).map_err(|e| {
            invalid(format!(
                "imports something outboxd does not provide ({e}); a transformer may import only WASI p2 and outbox:plugin/config@0.1.0"
            ))
        })?;
        let pre = TransformerPre::new(instance_pre).map_err(|e| {
            invalid(format!(
                "is not an outbox:plugin/transformer@0.1.0 component ({e}); build it against wit/outbox-plugin.wit"
            ))
        })?;
        Ok(Self {
            name: spec.name.clone(),
            version: spec
                .version
                .clone()
                .unwrap_or_else(|| format!("sha256:{}", &sha256[..12])),
            sha256,
            limits: spec.limits,
            engine: engine.clone(),
            pre,
            config: Arc::new(spec.config.clone()),
            idle: Mutex::new(Vec::new()),
            log_budget: Mutex::new(LineBudget::new(20.0, 100.0)),
            metrics: PluginMetrics::default(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn version(&self) -> &str {
        &self.version
    }

    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn metrics(&self) -> &PluginMetrics {
        &self.metrics
    }

    /// `name@version`, as recorded in the outbox.
    pub fn label(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }

    fn deadline_ticks(&self, ms: u64) -> u64 {
        ms.div_ceil(EPOCH_TICK.as_millis() as u64).max(1)
    }

    async fn instantiate(&self) -> Result<Slot, PluginError> {
        let mut store = Store::new(
            &self.engine.engine,
            HostState::new(self.limits.memory_bytes(), self.config.clone()),
        );
        store.limiter(|s| &mut s.memory);
        store.epoch_deadline_trap();
        // Start-up code (a Python interpreter's, say) gets ten call budgets.
        store.set_epoch_deadline(self.deadline_ticks(self.limits.timeout_ms.saturating_mul(10)));
        self.metrics.instantiated();
        match self.pre.instantiate_async(&mut store).await {
            Ok(bindings) => Ok(Slot { store, bindings }),
            Err(e) => {
                let hit = store.data().memory.hit;
                self.drain_logs(&store);
                Err(match classify(e, hit, &self.limits) {
                    PluginError::Trap(m) => PluginError::Instantiate(m),
                    other => other,
                })
            }
        }
    }

    /// Runs the plugin on one event. Never panics and never leaves a failed
    /// Store behind: after a trap, a timeout or an exhausted limit the Store
    /// is dropped and the next call starts from a fresh instance.
    pub async fn transform(&self, event: &Event) -> Result<Vec<OutgoingMessage>, PluginError> {
        let start = Instant::now();
        let result = self.call(event).await;
        self.metrics.record(
            start.elapsed(),
            result.as_ref().err().map(PluginError::kind),
        );
        result
    }

    async fn call(&self, event: &Event) -> Result<Vec<OutgoingMessage>, PluginError> {
        let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
        let mut slot = match idle {
            Some(slot) => slot,
            None => self.instantiate().await?,
        };
        slot.store.data_mut().memory.hit = false;
        slot.store
            .set_epoch_deadline(self.deadline_ticks(self.limits.timeout_ms));
        let result = slot.bindings.call_transform(&mut slot.store, event).await;
        self.metrics.memory_used(slot.store.data().memory.used());
        self.drain_logs(&slot.store);
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
                let hit = slot.store.data().memory.hit;
                return Err(classify(e, hit, &self.limits));
            }
        };
        if self.limits.reuse_instances
            && let Ok(mut idle) = self.idle.lock()
            && idle.len() < MAX_IDLE
        {
            idle.push(slot);
        }
        outcome
    }

    fn check_output(
        &self,
        messages: Vec<OutgoingMessage>,
    ) -> Result<Vec<OutgoingMessage>, PluginError> {
        if messages.len() > self.limits.max_outputs {
            return Err(PluginError::TooManyOutputs {
                count: messages.len(),
                cap: self.limits.max_outputs,
            });
        }
        let bytes: usize = messages.iter().map(message_bytes).sum();
        if bytes > self.limits.max_output_bytes {
            return Err(PluginError::OutputTooLarge {
                bytes,
                cap: self.limits.max_output_bytes,
            });
        }
        Ok(messages)
    }

    fn drain_logs(&self, store: &Store<HostState>) {
        let data = store.data();
        drain(&self.name, "stdout", &data.stdout, &self.log_budget);
        drain(&self.name, "stderr", &data.stderr, &self.log_budget);
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

/// Turns a wasmtime error from a call or an instantiation into a
/// [`PluginError`].
pub(crate) fn classify(e: wasmtime::Error, memory_hit: bool, limits: &Limits) -> PluginError {
    if let Some(wasmtime::Trap::Interrupt) = e.downcast_ref::<wasmtime::Trap>() {
        return PluginError::Timeout(limits.timeout_ms);
    }
    if memory_hit {
        return PluginError::OutOfMemory {
            cap_bytes: limits.memory_bytes(),
        };
    }
    // The cause alone: the wasm backtrace around it can fill a dead
    // reason's 500 characters by itself (a stack overflow has thousands of
    // frames) and cut the cause off.
    match e.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => PluginError::Trap(trap.to_string()),
        None => PluginError::Trap(format!("{e:#}")),
    }
}
