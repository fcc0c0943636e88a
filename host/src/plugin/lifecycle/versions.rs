//! The registry versions one host has loaded, of both worlds, by name and
//! version: what the rollout swaps into the live chains and slots, and what
//! a fix-forward redrive runs one event or message on without activating
//! it. Versions are immutable, so a compiled version is kept and reused.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::config::PluginSpec;
use crate::plugin::ConsumerPlugin;
use crate::plugin::PluginEngine;
use crate::plugin::PluginError;
use crate::plugin::TransformerPlugin;
use crate::plugin::lifecycle::registry::{Registry, RegistryError};
use crate::plugin::metrics::{PluginReport, PluginVersions};

/// `NAME@VERSION`: one registry version of a plugin, as an operator names
/// it (`outboxd dead redrive --with pii@3`) and as the outbox records it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VersionLabel {
    pub name: String,
    pub version: i64,
}

impl std::fmt::Display for VersionLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.name, self.version)
    }
}

/// Why a text is not `NAME@VERSION`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not NAME@VERSION with a registry version number (for example `pii@3`); `outboxd plugin list` shows the versions"
)]
pub struct BadLabel(pub String);

impl std::str::FromStr for VersionLabel {
    type Err = BadLabel;

    fn from_str(text: &str) -> Result<Self, BadLabel> {
        let bad = || BadLabel(text.to_string());
        let (name, version) = text.rsplit_once('@').ok_or_else(bad)?;
        let version: i64 = version.parse().map_err(|_| bad())?;
        if name.is_empty() || version < 1 {
            return Err(bad());
        }
        Ok(VersionLabel {
            name: name.to_string(),
            version,
        })
    }
}

/// Loaded versions of one world, by (name, version).
type ByVersion<T> = Mutex<BTreeMap<(String, i64), Arc<T>>>;

/// Registry versions loaded on this host, shared by the rollout (which
/// fills the live chains and slots from it) and by everything that runs a
/// pinned version (the relay for a redriven event, a consumer's
/// `pin_version`). Loading a version here never makes it live.
pub struct RegistryVersions {
    registry: Registry,
    engine: PluginEngine,
    /// The configured plugins: a registry version runs with its name's
    /// limits and config.
    specs: Vec<PluginSpec>,
    transformers: ByVersion<TransformerPlugin>,
    consumers: ByVersion<ConsumerPlugin>,
    /// Where each version is reported once loaded, when set.
    metrics: OnceLock<PluginVersions>,
}

impl std::fmt::Debug for RegistryVersions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn keys<T>(m: &ByVersion<T>) -> Vec<String> {
            m.lock()
                .map(|m| m.keys().map(|(n, v)| format!("{n}@{v}")).collect())
                .unwrap_or_default()
        }
        f.debug_struct("RegistryVersions")
            .field("transformers", &keys(&self.transformers))
            .field("consumers", &keys(&self.consumers))
            .finish_non_exhaustive()
    }
}

impl RegistryVersions {
    pub fn new(engine: PluginEngine, registry: Registry, specs: Vec<PluginSpec>) -> Self {
        Self {
            registry,
            engine,
            specs,
            transformers: Mutex::default(),
            consumers: Mutex::default(),
            metrics: OnceLock::new(),
        }
    }

    /// Reports every version loaded here in `metrics` (`/metrics`, the
    /// admin API): those loaded so far now, each later one when it loads.
    pub fn report_to(&self, metrics: PluginVersions) {
        fn all<T: PluginReport + 'static>(m: &ByVersion<T>) -> Vec<Arc<dyn PluginReport>> {
            m.lock()
                .map(|m| {
                    m.values()
                        .map(|p| p.clone() as Arc<dyn PluginReport>)
                        .collect()
                })
                .unwrap_or_default()
        }
        metrics.report(all(&self.transformers));
        metrics.report(all(&self.consumers));
        let _ = self.metrics.set(metrics);
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// A transformer version loaded before, if it was.
    pub fn loaded_transformer(&self, name: &str, version: i64) -> Option<Arc<TransformerPlugin>> {
        get(&self.transformers, name, version)
    }

    /// A consumer version loaded before, if it was.
    pub fn loaded_consumer(&self, name: &str, version: i64) -> Option<Arc<ConsumerPlugin>> {
        get(&self.consumers, name, version)
    }

    /// Loads one transformer version unless it is loaded already.
    pub async fn transformer(
        &self,
        name: &str,
        version: i64,
    ) -> Result<Arc<TransformerPlugin>, RegistryError> {
        self.load_into(
            &self.transformers,
            name,
            version,
            TransformerPlugin::from_bytes,
        )
        .await
    }

    /// Loads one consumer version unless it is loaded already; a version of
    /// the other world fails here.
    pub async fn consumer(
        &self,
        name: &str,
        version: i64,
    ) -> Result<Arc<ConsumerPlugin>, RegistryError> {
        self.load_into(&self.consumers, name, version, ConsumerPlugin::from_bytes)
            .await
    }

    /// A transformer version an operator picked for redriven events: as
    /// [`transformer`](Self::transformer), refusing a retired version
    /// (retired versions never run again) or a consumer the first time it
    /// is asked for.
    pub async fn pinned_transformer(
        &self,
        label: &VersionLabel,
    ) -> Result<Arc<TransformerPlugin>, RegistryError> {
        if let Some(p) = self.loaded_transformer(&label.name, label.version) {
            return Ok(p);
        }
        self.check_pinnable(label, "transformer").await?;
        self.transformer(&label.name, label.version).await
    }

    /// [`pinned_transformer`](Self::pinned_transformer) for a consumer
    /// plugin.
    pub async fn pinned_consumer(
        &self,
        label: &VersionLabel,
    ) -> Result<Arc<ConsumerPlugin>, RegistryError> {
        if let Some(p) = self.loaded_consumer(&label.name, label.version) {
            return Ok(p);
        }
        self.check_pinnable(label, "consumer").await?;
        self.consumer(&label.name, label.version).await
    }

    /// Refuses a version that is retired or of the other world.
    async fn check_pinnable(&self, label: &VersionLabel, world: &str) -> Result<(), RegistryError> {
        let record = self.registry.get(&label.name, label.version).await?;
        if record.world != world {
            return Err(RegistryError::Conflict {
                name: label.name.clone(),
                reason: format!(
                    "version {} is a {} plugin, and only a {world} can run here",
                    label.version, record.world
                ),
            });
        }
        if record.state == "retired" {
            return Err(RegistryError::Conflict {
                name: label.name.clone(),
                reason: format!(
                    "version {} is retired and never runs again; deploy the fix as a new version (`outboxd plugin deploy`)",
                    label.version
                ),
            });
        }
        Ok(())
    }

    /// Fetches, compiles and prepares `name` version `version` with `build`
    /// into `loaded`, unless it is there already.
    async fn load_into<T: PluginReport + 'static>(
        &self,
        loaded: &ByVersion<T>,
        name: &str,
        version: i64,
        build: fn(&PluginEngine, &PluginSpec, &[u8]) -> Result<T, PluginError>,
    ) -> Result<Arc<T>, RegistryError> {
        if let Some(p) = get(loaded, name, version) {
            return Ok(p);
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
        let mut plugin = Arc::new(plugin);
        if let Ok(mut l) = loaded.lock() {
            // Two loads of one version may race; the first one stored wins,
            // so everyone shares one plugin (and its counters).
            plugin = l
                .entry((name.to_string(), version))
                .or_insert(plugin)
                .clone();
        }
        if let Some(metrics) = self.metrics.get() {
            metrics.report([plugin.clone() as Arc<dyn PluginReport>]);
        }
        Ok(plugin)
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

fn get<T>(loaded: &ByVersion<T>, name: &str, version: i64) -> Option<Arc<T>> {
    loaded
        .lock()
        .ok()?
        .get(&(name.to_string(), version))
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_is_a_name_and_a_version_number() {
        let l: VersionLabel = "pii@3".parse().expect("label");
        assert_eq!((l.name.as_str(), l.version), ("pii", 3));
        assert_eq!(l.to_string(), "pii@3");
        // The last `@` separates the version: a name may contain one.
        let l: VersionLabel = "team@pii@12".parse().expect("label");
        assert_eq!((l.name.as_str(), l.version), ("team@pii", 12));
        for bad in ["pii", "pii@", "@3", "pii@v3", "pii@0", "pii@-1", "pii@3.1"] {
            let e = bad.parse::<VersionLabel>().expect_err(bad);
            assert!(e.to_string().contains("outboxd plugin list"), "{e}");
        }
    }
}
