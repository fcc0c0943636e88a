//! What every loaded plugin version has, whatever its world: read, checked,
//! compiled (or loaded from the cache) and pre-instantiated once; its name,
//! version, limits and config; and a pool of idle Stores with live
//! instances, reused until a call fails. The pool is one code for both
//! worlds, generic over the world's Store data ([`World::Data`]).
//! `TransformerPlugin` and `ConsumerPlugin` are this plus their call.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use outboxd_core::config::PluginSpec;

use crate::plugin::host::http::OutboundPolicy;
use sha2::{Digest, Sha256};
use wasmtime::Store;
use wasmtime::component::{InstancePre, Linker};

use crate::config::Limits;
use crate::plugin::error::{PluginError, classify};
use crate::plugin::host::StoreState;
use crate::plugin::host::log::{LineBudget, drain};
use crate::plugin::metrics::PluginMetrics;
use crate::plugin::runtime::cache;
use crate::plugin::runtime::engine::{EPOCH_TICK, PluginEngine};

/// A WIT world a plugin may export: its Store data and Linker, its
/// pre-instantiated form and how to instantiate it, and the words of the
/// errors that refuse a component.
pub(crate) trait World: Sized + Send + 'static {
    /// What this world's Store holds.
    type Data: StoreState;
    type Pre: Send + Sync + 'static;
    /// `outbox:plugin/transformer@0.1.0`, say.
    const NAME: &'static str;
    /// What a component of this world may import.
    const IMPORTS: &'static str;
    /// How to build one.
    const BUILD_HINT: &'static str;
    /// This world's Linker in `engine`.
    fn linker(engine: &PluginEngine) -> &Linker<Self::Data>;
    fn pre(instance: InstancePre<Self::Data>) -> wasmtime::Result<Self::Pre>;
    fn instantiate(
        pre: &Self::Pre,
        store: &mut Store<Self::Data>,
    ) -> impl Future<Output = wasmtime::Result<Self>> + Send;
}

/// Makes a bindgen world a [`World`], and gives its plugin type (a struct
/// holding `loaded: Loaded<world>`) the constructors and the accessors both
/// worlds share, and its report for `/metrics` and the admin API.
macro_rules! plugin_world {
    (
        $bindings:ty, $pre:ident, $plugin:ident,
        data: $data:ty, linker: $linker:ident, world: $world:literal,
        name: $name:literal, imports: $imports:literal, build: $hint:literal $(,)?
    ) => {
        impl $crate::plugin::runtime::loaded::World for $bindings {
            type Data = $data;
            type Pre = $pre<$data>;
            const NAME: &'static str = $name;
            const IMPORTS: &'static str = $imports;
            const BUILD_HINT: &'static str = $hint;

            fn linker(
                engine: &$crate::plugin::runtime::engine::PluginEngine,
            ) -> &wasmtime::component::Linker<$data> {
                &engine.$linker
            }

            fn pre(
                instance: wasmtime::component::InstancePre<$data>,
            ) -> wasmtime::Result<Self::Pre> {
                $pre::new(instance)
            }

            fn instantiate(
                pre: &Self::Pre,
                store: &mut wasmtime::Store<$data>,
            ) -> impl std::future::Future<Output = wasmtime::Result<Self>> + Send {
                pre.instantiate_async(store)
            }
        }

        impl $plugin {
            /// Reads, checks, compiles (or loads from the cache) and
            /// pre-instantiates the component: everything that can be done
            /// once per version.
            pub fn load(
                engine: &$crate::plugin::runtime::engine::PluginEngine,
                spec: &outboxd_core::config::PluginSpec,
            ) -> Result<Self, $crate::plugin::error::PluginError> {
                Ok(Self {
                    loaded: $crate::plugin::runtime::loaded::Loaded::load(engine, spec)?,
                })
            }

            /// The same as [`load`](Self::load) from bytes already read (a
            /// registry version); `spec.path` only names the source in
            /// errors.
            pub fn from_bytes(
                engine: &$crate::plugin::runtime::engine::PluginEngine,
                spec: &outboxd_core::config::PluginSpec,
                wasm: &[u8],
            ) -> Result<Self, $crate::plugin::error::PluginError> {
                Ok(Self {
                    loaded: $crate::plugin::runtime::loaded::Loaded::from_bytes(
                        engine, spec, wasm,
                    )?,
                })
            }

            pub fn name(&self) -> &str {
                &self.loaded.name
            }

            pub fn version(&self) -> &str {
                &self.loaded.version
            }

            pub fn metrics(&self) -> &$crate::plugin::metrics::PluginMetrics {
                &self.loaded.metrics
            }

            /// `name@version`, as the outbox and dead letters record it.
            pub fn label(&self) -> String {
                self.loaded.label()
            }
        }

        impl $crate::plugin::metrics::PluginReport for $plugin {
            fn name(&self) -> &str {
                &self.loaded.name
            }

            fn version(&self) -> &str {
                &self.loaded.version
            }

            fn world(&self) -> &'static str {
                $world
            }

            fn counters(&self) -> $crate::plugin::metrics::PluginCounters {
                let m = &self.loaded.metrics;
                let s = m.snapshot();
                $crate::plugin::metrics::PluginCounters {
                    calls: s.calls,
                    errors: s.errors,
                    total_time: s.total_time,
                    memory_high_water: m.memory_high_water(),
                }
            }

            fn latency(&self) -> &$crate::plugin::metrics::LatencyBuckets {
                self.loaded.metrics.latency()
            }

            fn metrics(&self) -> Option<&$crate::plugin::metrics::PluginMetrics> {
                Some(&self.loaded.metrics)
            }

            fn http(&self) -> Option<&$crate::plugin::metrics::HttpMetrics> {
                Some(&self.loaded.http_metrics)
            }
        }
    };
}
pub(crate) use plugin_world;

/// A Store with a live instance, ready for the next call.
pub(crate) struct Slot<W: World> {
    pub(crate) store: Store<W::Data>,
    pub(crate) bindings: W,
}

/// Idle Stores kept per plugin version; more concurrent calls instantiate
/// extra Stores that are dropped afterwards.
const MAX_IDLE: usize = 8;

pub(crate) struct Loaded<W: World> {
    pub(crate) name: String,
    pub(crate) version: String,
    pub(crate) sha256: String,
    pub(crate) limits: Limits,
    engine: PluginEngine,
    pre: W::Pre,
    config: Arc<BTreeMap<String, String>>,
    /// Who the plugin may call over `wasi:http` (consumers only).
    pub(crate) outbound: Arc<OutboundPolicy>,
    idle: Mutex<Vec<Slot<W>>>,
    log_budget: Mutex<LineBudget>,
    pub(crate) metrics: PluginMetrics,
    /// Outbound HTTP requests (consumers; a transformer's stays empty).
    pub(crate) http_metrics: crate::plugin::metrics::HttpMetrics,
}

impl<W: World> std::fmt::Debug for Loaded<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(W::NAME)
            .field("name", &self.name)
            .field("version", &self.version)
            .field("sha256", &self.sha256)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl<W: World> Loaded<W> {
    /// Reads the component `spec.path` names, then [`Loaded::from_bytes`].
    pub(crate) fn load(engine: &PluginEngine, spec: &PluginSpec) -> Result<Self, PluginError> {
        let wasm = std::fs::read(&spec.path).map_err(|e| {
            PluginError::Invalid(format!(
                "plugin `{}`: cannot read {}: {e}",
                spec.name,
                spec.path.display()
            ))
        })?;
        Self::from_bytes(engine, spec, &wasm)
    }

    /// Checks, compiles (or loads from the cache) and pre-instantiates the
    /// component: everything that can be done once per version. `spec.path`
    /// only names the source in errors.
    pub(crate) fn from_bytes(
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
        check_is_component(wasm).map_err(invalid)?;
        let sha256 = hex::encode(Sha256::digest(wasm));
        let component = cache::load_or_compile(
            &engine.engine,
            engine.config.cache_dir.as_deref(),
            &sha256,
            wasm,
        )
        .map_err(|e| invalid(format!("does not compile: {e}")))?;
        let outbound = OutboundPolicy::from_spec(spec).map_err(|e| invalid(e.to_string()))?;
        let imports_http = component
            .component_type()
            .imports(&engine.engine)
            .any(|(name, _)| name.starts_with("wasi:http/"));
        if imports_http && W::NAME.contains("transformer") {
            return Err(invalid(
                "imports wasi:http, and transformers never get network; only a consumer plugin (world consumer-http) may call out".into(),
            ));
        }
        if imports_http && !outbound.is_enabled() {
            return Err(invalid(format!(
                "imports wasi:http but plugins[{}].allowed_outbound_hosts is empty; list the hosts it may call (\"https://HOST[:PORT]\"), or build it without HTTP",
                spec.name
            )));
        }
        let instance_pre = W::linker(engine).instantiate_pre(&component).map_err(|e| {
            invalid(format!(
                "imports something outboxd does not provide ({e}); {}",
                W::IMPORTS
            ))
        })?;
        let pre = W::pre(instance_pre).map_err(|e| {
            invalid(format!(
                "is not an {} component ({e}); {}",
                W::NAME,
                W::BUILD_HINT
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
            outbound: Arc::new(outbound),
            idle: Mutex::new(Vec::new()),
            log_budget: Mutex::new(LineBudget::new(20.0, 100.0)),
            metrics: PluginMetrics::default(),
            http_metrics: Default::default(),
        })
    }

    /// `name@version`, as the outbox and dead letters record it.
    pub(crate) fn label(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }

    pub(crate) fn deadline_ticks(&self, d: std::time::Duration) -> u64 {
        (d.as_millis() as u64)
            .div_ceil(EPOCH_TICK.as_millis() as u64)
            .max(1)
    }

    /// An idle Store, or a new instance; its memory mark is cleared and its
    /// deadline set to one call's budget.
    pub(crate) async fn slot(&self) -> Result<Slot<W>, PluginError> {
        let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
        let mut slot = match idle {
            Some(slot) => slot,
            None => self.instantiate().await?,
        };
        slot.store.data_mut().sandbox_mut().memory.hit = false;
        slot.store
            .set_epoch_deadline(self.deadline_ticks(self.limits.timeout));
        Ok(slot)
    }

    /// Keeps a Store whose call ended cleanly for the next call. A Store
    /// whose call trapped or timed out is dropped instead, never given back.
    pub(crate) fn give_back(&self, slot: Slot<W>) {
        if self.limits.reuse_instances
            && let Ok(mut idle) = self.idle.lock()
            && idle.len() < MAX_IDLE
        {
            idle.push(slot);
        }
    }

    async fn instantiate(&self) -> Result<Slot<W>, PluginError> {
        let mut store = Store::new(
            &self.engine.engine,
            W::Data::new(self.limits.memory_bytes(), self.config.clone()),
        );
        store.limiter(|s| &mut s.sandbox_mut().memory);
        store.epoch_deadline_trap();
        // Start-up code (a Python interpreter's, say) gets ten call budgets.
        store.set_epoch_deadline(self.deadline_ticks(self.limits.timeout.saturating_mul(10)));
        self.metrics.instantiated();
        match W::instantiate(&self.pre, &mut store).await {
            Ok(bindings) => Ok(Slot { store, bindings }),
            Err(e) => {
                let hit = store.data().sandbox().memory.hit;
                self.drain_logs(&store);
                Err(match classify(e, hit, &self.limits) {
                    PluginError::Trap(m) => PluginError::Instantiate(m),
                    other => other,
                })
            }
        }
    }

    /// Passes what the guest printed to the log, within its budget.
    pub(crate) fn drain_logs(&self, store: &Store<W::Data>) {
        let data = store.data().sandbox();
        drain(&self.name, "stdout", &data.stdout, &self.log_budget);
        drain(&self.name, "stderr", &data.stderr, &self.log_budget);
    }
}

/// A core Wasm module starts with this version/layer word; a component
/// with `0d 00 01 00`.
const COMPONENT_LAYER: [u8; 4] = [0x0d, 0x00, 0x01, 0x00];

/// The first check of any plugin file, before it is compiled: is it a
/// component at all.
pub fn check_is_component(wasm: &[u8]) -> Result<(), String> {
    if wasm.len() < 8 || &wasm[..4] != b"\0asm" {
        return Err("not a WebAssembly file (no \\0asm header)".into());
    }
    if wasm[4..8] != COMPONENT_LAYER {
        return Err(
            "a core Wasm module, not a component; build for wasm32-wasip2 (or run `wasm-tools component new`)"
                .into(),
        );
    }
    Ok(())
}
