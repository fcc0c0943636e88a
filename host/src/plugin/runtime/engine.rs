//! The shared engine: one wasmtime `Engine` for every plugin, a `Linker`
//! per world, and the thread that advances the epoch clock the call
//! deadlines use.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::Linker;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::plugin::error::PluginError;
use crate::plugin::host::{ConsumerState, StoreState, TransformerState};

/// One epoch tick. Deadlines are whole ticks, so a 50 ms deadline fires
/// between 50 and 52 ms.
pub const EPOCH_TICK: Duration = Duration::from_millis(2);

/// Engine-wide settings.
#[derive(Debug, Clone, Default)]
pub struct EngineConfig {
    /// Where compiled components are cached; `None` compiles every time.
    pub cache_dir: Option<PathBuf>,
    /// Use the pooling instance allocator (pays off when instances are
    /// created per call; with instance reuse it buys little).
    pub pooling: bool,
}

/// Cheap to clone; every plugin shares it.
#[derive(Clone)]
pub struct PluginEngine {
    pub(crate) engine: Engine,
    /// WASI and `config`: what a transformer may import.
    pub(crate) transformers: Arc<Linker<TransformerState>>,
    /// The same plus `transaction`.
    pub(crate) consumers: Arc<Linker<ConsumerState>>,
    pub(crate) config: EngineConfig,
}

impl std::fmt::Debug for PluginEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginEngine")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl PluginEngine {
    pub fn new(config: EngineConfig) -> Result<Self, PluginError> {
        if let Some(dir) = &config.cache_dir {
            crate::plugin::runtime::cache::prepare_dir(dir)?;
        }
        let mut wasm = Config::new();
        wasm.epoch_interruption(true);
        wasm.wasm_component_model(true);
        // Guests get 512 KiB of wasm stack; deep recursion traps cleanly.
        wasm.max_wasm_stack(512 * 1024);
        if config.pooling {
            let mut pool = PoolingAllocationConfig::default();
            pool.total_component_instances(256)
                .total_memories(512)
                .total_tables(512)
                .total_core_instances(2048)
                .max_memories_per_component(16)
                .max_tables_per_component(32)
                .max_core_instances_per_component(64)
                .max_memory_size(1 << 30);
            wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        }
        let engine = Engine::new(&wasm)
            .map_err(|e| PluginError::Invalid(format!("cannot create the Wasm engine: {e}")))?;
        let transformers = Arc::new(TransformerState::linker(&engine)?);
        let consumers = Arc::new(ConsumerState::linker(&engine)?);
        spawn_ticker(&engine);
        Ok(Self {
            engine,
            transformers,
            consumers,
            config,
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

/// Advances the epoch every tick until the engine is dropped.
fn spawn_ticker(engine: &Engine) {
    let weak = engine.weak();
    let spawned = std::thread::Builder::new()
        .name("outboxd-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        });
    if let Err(e) = spawned {
        // Without the ticker no deadline ever fires; say so loudly.
        tracing::error!(error = %e, "cannot start the plugin epoch thread: plugin deadlines are not enforced");
    }
}
