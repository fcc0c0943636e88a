//! Registry rollout on one host: keeps the relay's chains and the consumer
//! plugin slots on the registry's active (and shadow) versions.
//! [`Rollout::refresh`] is one step (read what should run, load what is
//! new, swap the chain table and each consumer's slot) and [`Rollout::run`]
//! drives it on every Postgres notification and on a polling interval,
//! saving this host's shadow counters and promoting a clean candidate with
//! each refresh.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outboxd_core::route::Route;
use tokio::sync::watch;

use crate::config::PluginSource;
use crate::config::PluginSpec;
use crate::plugin::Chain;
use crate::plugin::PluginEngine;
use crate::plugin::TopicPolicy;
use crate::plugin::TransformerPlugin;
use crate::plugin::lifecycle::chains::{ChainTable, Chains, RouteChain, Shadow};
use crate::plugin::lifecycle::registry::{Desired, Registry, RegistryError};
use crate::plugin::lifecycle::shadow::ShadowStats;
use crate::plugin::lifecycle::slot::{ActiveConsumer, ConsumerVersions};
use crate::plugin::lifecycle::versions::RegistryVersions;
use crate::store::Channel;

/// What a refresh changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refreshed {
    Unchanged,
    /// The table was swapped; the labels now active, e.g. `["pii@3"]`.
    Swapped(Vec<String>),
}

pub struct Rollout {
    registry: Registry,
    routes: Vec<Route>,
    files: BTreeMap<String, Arc<TransformerPlugin>>,
    /// Registry versions loaded so far, of both worlds; versions are
    /// immutable, so a reactivation reuses the compiled plugin. The chains
    /// and the consumer slots share it, to load a pinned version on demand.
    versions: Arc<RegistryVersions>,
    /// Registry plugins run by consumers (world `consumer`), by name.
    consumers: BTreeMap<String, ActiveConsumer>,
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
        let versions = Arc::new(RegistryVersions::new(engine, registry.clone(), specs));
        let rollout = Self {
            registry,
            routes,
            files,
            versions: versions.clone(),
            consumers: BTreeMap::new(),
            stats: Mutex::default(),
            applied: Mutex::default(),
            chains: Chains::default().with_versions(versions),
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
            let slot = ActiveConsumer::empty(name.clone()).with_versions(self.versions.clone());
            self.consumers.insert(name, slot);
        }
        self
    }

    /// Reports every version this host loads in `metrics`: the file
    /// plugins now, and each registry version (of either world, a shadow
    /// candidate or a version pinned for a redrive included) when it is
    /// loaded, so a version activated after start has its series from its
    /// first call.
    pub fn with_metrics(self, metrics: crate::plugin::metrics::PluginVersions) -> Self {
        metrics.report(
            self.files
                .values()
                .map(|p| p.clone() as Arc<dyn crate::plugin::metrics::PluginReport>),
        );
        self.versions.report_to(metrics);
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

    /// The registry versions this host has loaded, live or not.
    pub fn versions(&self) -> &Arc<RegistryVersions> {
        &self.versions
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
        self.versions.transformer(name, version).await.map(drop)
    }

    /// Loads one registry version of a consumer plugin unless it is loaded
    /// already; a version of another world fails here.
    async fn load_consumer(&self, name: &str, version: i64) -> Result<(), RegistryError> {
        self.versions.consumer(name, version).await.map(drop)
    }
}

impl Rollout {
    /// Points every consumer slot at the active (and shadow) version of
    /// `desired`; returns whether any active version changed. Each slot is
    /// replaced whole, so a message sees the old or the new versions, never
    /// a mix.
    pub(super) fn swap_consumers(&self, desired: &Desired) -> bool {
        let loaded = |name: &str, v: i64| self.versions.loaded_consumer(name, v);
        let mut changed = false;
        for (name, slot) in &self.consumers {
            let active = desired.active(name).and_then(|v| loaded(name, v));
            let shadow = desired
                .shadow(name)
                .and_then(|(v, _)| loaded(name, v).map(|p| (p, self.stats_for(name, v))));
            let before = slot.label();
            slot.replace(ConsumerVersions { active, shadow });
            changed |= slot.label() != before;
        }
        changed
    }

    fn loaded(&self, name: &str, version: i64) -> Option<Arc<TransformerPlugin>> {
        self.versions.loaded_transformer(name, version)
    }

    fn stats_for(&self, name: &str, version: i64) -> Arc<ShadowStats> {
        match self.stats.lock() {
            Ok(mut s) => s.entry((name.to_string(), version)).or_default().clone(),
            Err(_) => Arc::default(),
        }
    }

    /// Builds every route's chain from the file plugins and `desired`.
    pub(super) fn table(&self, desired: &Desired) -> ChainTable {
        let mut by_route = Vec::with_capacity(self.routes.len());
        for (ri, route) in self.routes.iter().enumerate() {
            if route.transformers.is_empty() {
                by_route.push(None);
                continue;
            }
            let topics = TopicPolicy::for_route(route, ri);
            let mut active = Vec::new();
            let mut missing = None;
            // At most one plugin of a chain runs in shadow at a time.
            let mut shadow: Option<(Vec<Arc<TransformerPlugin>>, String, i64)> = None;
            for name in &route.transformers {
                let plugin = match self.files.get(name) {
                    Some(p) => Some(p.clone()),
                    None => desired.active(name).and_then(|v| self.loaded(name, v)),
                };
                let Some(plugin) = plugin else {
                    missing.get_or_insert(name.clone());
                    continue;
                };
                let candidate = desired
                    .shadow(name)
                    .and_then(|(v, _)| self.loaded(name, v).map(|p| (p, v)));
                match (&mut shadow, candidate) {
                    (None, Some((c, v))) => {
                        let mut plugins = active.clone();
                        plugins.push(c);
                        shadow = Some((plugins, name.clone(), v));
                    }
                    (Some((plugins, _, _)), _) => plugins.push(plugin.clone()),
                    (None, None) => {}
                }
                active.push(plugin);
            }
            let route_chain = match missing {
                Some(name) => RouteChain {
                    active: Arc::new(Chain::unavailable(&name)),
                    shadow: None,
                },
                None => RouteChain {
                    active: Arc::new(Chain::new(active).with_topics(topics.clone())),
                    shadow: shadow.map(|(plugins, name, v)| Shadow {
                        chain: Arc::new(Chain::new(plugins).with_topics(topics)),
                        stats: self.stats_for(&name, v),
                    }),
                },
            };
            by_route.push(Some(route_chain));
        }
        ChainTable { by_route }
    }
}

/// The chain labels of a table, for logging real swaps only.
pub(super) fn labels_of(table: &ChainTable) -> Vec<String> {
    table
        .by_route
        .iter()
        .flatten()
        .map(|rc| rc.active.label())
        .collect()
}

impl Rollout {
    /// Stores this host's shadow counters and promotes a candidate whose
    /// `auto_promote_after` clean events have run.
    pub async fn save_stats_and_promote(&self) -> Result<(), RegistryError> {
        let stats: Vec<_> = match self.stats.lock() {
            Ok(s) => s.iter().map(|(k, v)| (k.clone(), v.totals())).collect(),
            Err(_) => Vec::new(),
        };
        let applied = self.applied.lock().ok().and_then(|a| a.clone());
        for ((name, version), totals) in stats {
            if totals == Default::default() {
                continue;
            }
            self.registry
                .save_shadow_stats(&self.host, &name, version, &totals)
                .await?;
            let threshold = applied
                .as_ref()
                .and_then(|d| d.shadow(&name))
                .filter(|(v, _)| *v == version)
                .and_then(|(_, n)| n);
            if let Some(n) = threshold {
                let all = self.registry.get(&name, version).await?.shadow_stats;
                if all.matches >= n && all.mismatches == 0 && all.errors == 0 {
                    tracing::info!(plugin = %name, version, matches = all.matches, "shadow clean: promoting");
                    self.registry
                        .activate(&name, version, "auto-promote")
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// Refreshes on every notification (Postgres) and every `poll`, until
    /// `shutdown` turns true. Errors are logged; the host keeps running the
    /// versions it has.
    pub async fn run(&self, poll: Duration, mut shutdown: watch::Receiver<bool>) {
        // Without notifications (SQLite, or a failed LISTEN) polling still
        // finds every change.
        let mut notified = self
            .registry
            .db()
            .listen(Channel::Plugins)
            .await
            .inspect_err(
                |e| tracing::warn!(error = %e, "cannot LISTEN for plugin changes; polling only"),
            )
            .ok()
            .flatten();
        loop {
            if let Err(e) = self.refresh().await {
                tracing::warn!(error = %e, "plugin registry refresh failed; keeping the running versions");
            }
            let wait_notify = async {
                match notified.as_mut() {
                    Some(rx) => {
                        if rx.changed().await.is_err() {
                            std::future::pending::<()>().await
                        }
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(poll) => {}
                _ = wait_notify => {}
                _ = shutdown.changed() => {}
            }
            if *shutdown.borrow() {
                return;
            }
        }
    }
}
