//! Registry rollout on one host: keeps the relay's chains and the consumer
//! plugin slots on the registry's active (and shadow) versions.
//! [`Rollout::refresh`] is one step — read what should run, load what is
//! new, swap the chain table and each consumer's slot — and [`Rollout::run`]
//! drives it on every Postgres notification and on a polling interval.
//!
//! This file holds the refresh and the loading of versions;
//! `rollout/table.rs` builds the chain table and the consumer slots from
//! them, and `rollout/run.rs` is the loop, the shadow counters and
//! auto-promotion.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::chains::Chains;
use super::route::Route;
use crate::consumer::ActiveConsumer;
use crate::plugin::registry::{Desired, Registry, RegistryError};
use crate::plugin::shadow::ShadowStats;
use crate::plugin::{
    ConsumerPlugin, PluginEngine, PluginError, PluginSource, PluginSpec, TransformerPlugin,
};

mod run;
mod table;

use table::labels_of;

/// What a refresh changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refreshed {
    Unchanged,
    /// The table was swapped; the labels now active, e.g. `["pii@3"]`.
    Swapped(Vec<String>),
}

pub struct Rollout {
    registry: Registry,
    engine: PluginEngine,
    specs: Vec<PluginSpec>,
    routes: Vec<Route>,
    files: BTreeMap<String, Arc<TransformerPlugin>>,
    /// Registry versions loaded so far, by (name, version); versions are
    /// immutable, so a reactivation reuses the compiled plugin.
    loaded: Mutex<BTreeMap<(String, i64), Arc<TransformerPlugin>>>,
    /// Registry plugins run by consumers (world `consumer`), by name.
    consumers: BTreeMap<String, ActiveConsumer>,
    /// Consumer versions loaded so far, like `loaded`.
    loaded_consumers: Mutex<BTreeMap<(String, i64), Arc<ConsumerPlugin>>>,
    stats: Mutex<BTreeMap<(String, i64), Arc<ShadowStats>>>,
    applied: Mutex<Option<Desired>>,
    chains: Chains,
    host: String,
}

impl Rollout {
    /// Loads the file plugins the routes use; registry plugins start
    /// unavailable until the first [`refresh`](Self::refresh).
    pub fn new(
        engine: PluginEngine,
        registry: Registry,
        specs: Vec<PluginSpec>,
        routes: Vec<Route>,
    ) -> Result<Self, String> {
        let mut files = BTreeMap::new();
        for (i, spec) in specs.iter().enumerate() {
            let used = routes.iter().any(|r| r.transformers.contains(&spec.name));
            if spec.source == PluginSource::File && used {
                let p = TransformerPlugin::load(&engine, spec)
                    .map_err(|e| format!("config key `plugins[{i}]`: {e}"))?;
                files.insert(spec.name.clone(), Arc::new(p));
            }
        }
        let rollout = Self {
            registry,
            engine,
            specs,
            routes,
            files,
            loaded: Mutex::default(),
            consumers: BTreeMap::new(),
            loaded_consumers: Mutex::default(),
            stats: Mutex::default(),
            applied: Mutex::default(),
            chains: Chains::default(),
            host: format!("host-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
        };
        rollout.chains.replace(rollout.table(&Desired::default()));
        Ok(rollout)
    }

    /// Also keeps these registry plugins' consumer slots (world `consumer`)
    /// on their active versions; [`consumer`](Self::consumer) hands a slot
    /// to its consumer. Slots are empty until the first refresh.
    pub fn with_consumers<I: IntoIterator<Item = String>>(mut self, names: I) -> Self {
        for name in names {
            self.consumers
                .insert(name.clone(), ActiveConsumer::empty(name));
        }
        self
    }

    /// The slot of a registry consumer plugin named in
    /// [`with_consumers`](Self::with_consumers).
    pub fn consumer(&self, name: &str) -> Option<ActiveConsumer> {
        self.consumers.get(name).cloned()
    }

    /// The chains to give every relay worker of this host.
    pub fn chains(&self) -> Chains {
        self.chains.clone()
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Reads the registry and, when it changed, loads the new versions and
    /// swaps the chains. A version that fails to load leaves the previous
    /// table in place.
    pub async fn refresh(&self) -> Result<Refreshed, RegistryError> {
        self.save_stats_and_promote().await?;
        let desired = self.registry.desired().await?;
        if self.applied.lock().ok().and_then(|a| a.clone()).as_ref() == Some(&desired) {
            return Ok(Refreshed::Unchanged);
        }
        let used = |name: &str| {
            self.routes
                .iter()
                .any(|r| r.transformers.iter().any(|t| t == name))
        };
        let (needed, ahead): (Vec<_>, Vec<_>) = desired
            .rows
            .iter()
            .filter(|r| used(&r.name) && !self.files.contains_key(&r.name))
            .partition(|r| r.state == "active" || r.shadow);
        let consumer_rows = desired
            .rows
            .iter()
            .filter(|r| self.consumers.contains_key(&r.name));
        let (consumer_needed, consumer_ahead): (Vec<_>, Vec<_>) =
            consumer_rows.partition(|r| r.state == "active" || r.shadow);
        // Load everything first: a version that fails to load leaves both
        // the chains and the consumer slots as they were.
        for r in &needed {
            self.load(&r.name, r.version).await?;
        }
        for r in &consumer_needed {
            self.load_consumer(&r.name, r.version).await?;
        }
        let table = self.table(&desired);
        let before = self.chains.snapshot();
        self.chains.replace(table);
        let consumers_swapped = self.swap_consumers(&desired);
        let labels: Vec<String> = needed
            .iter()
            .chain(&consumer_needed)
            .filter(|r| r.state == "active")
            .map(|r| format!("{}@{}", r.name, r.version))
            .collect();
        if consumers_swapped || labels_of(&before) != labels_of(&self.chains.snapshot()) {
            tracing::info!(?labels, "registry plugins swapped in");
        }
        if let Ok(mut a) = self.applied.lock() {
            *a = Some(desired.clone());
        }
        // Compile the other candidates now, so activating one is a swap.
        for r in ahead {
            if let Err(e) = self.load(&r.name, r.version).await {
                tracing::warn!(error = %e, "candidate cannot be prepared; activating it will fail");
            }
        }
        for r in consumer_ahead {
            if let Err(e) = self.load_consumer(&r.name, r.version).await {
                tracing::warn!(error = %e, "candidate cannot be prepared; activating it will fail");
            }
        }
        Ok(Refreshed::Swapped(labels))
    }

    /// Loads one registry version of a transformer unless it is loaded
    /// already.
    async fn load(&self, name: &str, version: i64) -> Result<(), RegistryError> {
        self.load_into(&self.loaded, name, version, TransformerPlugin::from_bytes)
            .await
    }

    /// Loads one registry version of a consumer plugin unless it is loaded
    /// already; a version of another world fails here.
    async fn load_consumer(&self, name: &str, version: i64) -> Result<(), RegistryError> {
        self.load_into(
            &self.loaded_consumers,
            name,
            version,
            ConsumerPlugin::from_bytes,
        )
        .await
    }

    /// Fetches, compiles and prepares `name` version `version` with
    /// `build` into `loaded`, unless it is there already.
    async fn load_into<T: Send + Sync + 'static>(
        &self,
        loaded: &Mutex<BTreeMap<(String, i64), Arc<T>>>,
        name: &str,
        version: i64,
        build: fn(&PluginEngine, &PluginSpec, &[u8]) -> Result<T, PluginError>,
    ) -> Result<(), RegistryError> {
        let key = (name.to_string(), version);
        if loaded.lock().map(|l| l.contains_key(&key)).unwrap_or(false) {
            return Ok(());
        }
        let wasm = self.registry.component(name, version).await?;
        let spec = self.registry_spec(name, version);
        let engine = self.engine.clone();
        // Compiling is CPU work: keep it off the relay's async threads.
        let plugin = tokio::task::spawn_blocking(move || build(&engine, &spec, &wasm))
            .await
            .map_err(|e| RegistryError::Conflict {
                name: name.into(),
                reason: format!("loading version {version} panicked: {e}"),
            })?
            .map_err(|e| RegistryError::Refused {
                name: name.into(),
                reason: e.to_string(),
            })?;
        if let Ok(mut l) = loaded.lock() {
            l.insert(key, Arc::new(plugin));
        }
        Ok(())
    }

    /// The configured spec of `name` (limits, config), as version `version`.
    fn registry_spec(&self, name: &str, version: i64) -> PluginSpec {
        let mut spec = self
            .specs
            .iter()
            .find(|s| s.name == name)
            .cloned()
            .unwrap_or_else(|| PluginSpec::new(name, ""));
        spec.version = Some(version.to_string());
        spec.path = format!("registry:{name}@{version}").into();
        spec
    }
}
