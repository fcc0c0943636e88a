//! The transformer chains of a host's routes: which chain each route runs
//! (and its shadow candidate), the table a rollout swaps whole, and loading
//! the plugins the config names.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::config::PluginSpec;
use crate::plugin::lifecycle::registry::RegistryError;
use crate::plugin::lifecycle::shadow::ShadowStats;
use crate::plugin::lifecycle::versions::{BadLabel, RegistryVersions, VersionLabel};
use crate::plugin::runtime::chain::{Chain, TopicPolicy};
use crate::plugin::runtime::engine::PluginEngine;
use crate::plugin::runtime::transformer::TransformerPlugin;
use outboxd_core::route::{Route, Router};

/// What one route runs: its chain and, while a candidate is in shadow, the
/// same chain with the candidate in place of the active version.
#[derive(Debug, Clone)]
pub struct RouteChain {
    pub active: Arc<Chain>,
    pub shadow: Option<Shadow>,
}

#[derive(Debug, Clone)]
pub struct Shadow {
    pub chain: Arc<Chain>,
    pub stats: Arc<ShadowStats>,
}

/// The chain of each route, by route index; empty when no route has one,
/// which keeps the plain path to one `is_empty` check.
#[derive(Debug, Clone, Default)]
pub struct ChainTable {
    pub by_route: Vec<Option<RouteChain>>,
}

/// The chains every relay worker of a host shares. A registry rollout
/// replaces the whole table at once; a worker reads it once per event, so
/// each event runs entirely on one version and calls in flight finish on
/// the version they started with.
///
/// With the registry's versions ([`with_versions`](Self::with_versions)),
/// they also build the chain of a redriven event pinned to one version
/// ([`pinned_for_event`](Self::pinned_for_event)), which never enters the
/// table.
#[derive(Debug, Clone, Default)]
pub struct Chains {
    table: Arc<RwLock<Arc<ChainTable>>>,
    versions: Option<Arc<RegistryVersions>>,
}

/// Why a redriven event's pinned chain cannot run: `permanent` when no
/// retry can help (the event goes back to the dead events with this
/// reason), otherwise it is retried like any failed event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("redriven with {label}: {reason}")]
pub struct PinError {
    pub label: String,
    pub reason: String,
    pub permanent: bool,
}

impl Chains {
    pub fn new(table: ChainTable) -> Self {
        Self {
            table: Arc::new(RwLock::new(Arc::new(table))),
            versions: None,
        }
    }

    /// Lets these chains load registry versions on demand for redriven
    /// events (the rollout's loaded versions).
    pub fn with_versions(mut self, versions: Arc<RegistryVersions>) -> Self {
        self.versions = Some(versions);
        self
    }

    /// The current table; hold it for one event.
    pub fn snapshot(&self) -> Arc<ChainTable> {
        match self.table.read() {
            Ok(t) => t.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Swaps in a new table for every worker sharing these chains.
    pub fn replace(&self, table: ChainTable) {
        let table = Arc::new(table);
        match self.table.write() {
            Ok(mut t) => *t = table,
            Err(poisoned) => *poisoned.into_inner() = table,
        }
    }

    pub fn for_event(&self, router: &Router, event_type: &str) -> Option<RouteChain> {
        let table = self.snapshot();
        if table.by_route.is_empty() {
            return None;
        }
        let i = router.route_index(event_type)?;
        table.by_route.get(i)?.clone()
    }

    /// The chain of `event_type`'s route as it runs now, with its plugin
    /// `label.name` replaced by registry version `label.version` (loaded on
    /// demand, a candidate included, and kept for the next event), for an
    /// event an operator redrove through that version. Nothing live
    /// changes: the table still runs the active version, and no shadow runs
    /// beside a pinned chain.
    pub async fn pinned_for_event(
        &self,
        router: &Router,
        event_type: &str,
        label: &str,
    ) -> Result<RouteChain, PinError> {
        let fail = |permanent: bool, reason: String| PinError {
            label: label.to_string(),
            reason,
            permanent,
        };
        let parsed: VersionLabel = label
            .parse()
            .map_err(|e: BadLabel| fail(true, e.to_string()))?;
        let Some(versions) = &self.versions else {
            return Err(fail(
                true,
                "this host runs no registry plugins, so it cannot load a version; run the relay with the route's plugin as `source = \"registry\"` in [[plugins]], or redrive without --with".into(),
            ));
        };
        let index = router.route_index(event_type);
        let route = index.and_then(|i| self.snapshot().by_route.get(i).cloned().flatten());
        let where_ = match index {
            Some(i) => format!("routes[{i}]"),
            None => format!("the default route of `{event_type}`"),
        };
        let Some(route) = route else {
            return Err(fail(
                true,
                format!("{where_} runs no plugin chain; redrive the event without --with"),
            ));
        };
        if !route.active.is_unavailable()
            && !route
                .active
                .plugins()
                .iter()
                .any(|p| p.name() == parsed.name)
        {
            return Err(fail(
                true,
                format!(
                    "{where_}'s chain `{}` does not run plugin `{}`; redrive the event with a plugin of {where_}.transformers, or without --with",
                    route.active.label(),
                    parsed.name
                ),
            ));
        }
        let plugin = versions.pinned_transformer(&parsed).await.map_err(|e| {
            let permanent = !matches!(e, RegistryError::Database(_));
            fail(permanent, e.to_string())
        })?;
        let chain = route.active.with_plugin_replaced(plugin).ok_or_else(|| {
            fail(
                true,
                format!("{where_} does not run plugin `{}`", parsed.name),
            )
        })?;
        Ok(RouteChain {
            active: Arc::new(chain),
            shadow: None,
        })
    }

    /// Every plugin loaded for these chains, once each.
    pub fn plugins(&self) -> Vec<Arc<TransformerPlugin>> {
        let table = self.snapshot();
        let mut seen: Vec<Arc<TransformerPlugin>> = Vec::new();
        for rc in table.by_route.iter().flatten() {
            for p in rc.active.plugins() {
                if !seen.iter().any(|s| Arc::ptr_eq(s, p)) {
                    seen.push(p.clone());
                }
            }
        }
        seen
    }
}

/// Loads every plugin some route uses (each once) and builds the chains.
/// Errors name the config key.
pub fn build_chains(
    engine: &PluginEngine,
    plugins: &[PluginSpec],
    routes: &[Route],
) -> Result<Chains, String> {
    if routes.iter().all(|r| r.transformers.is_empty()) {
        return Ok(Chains::default());
    }
    let mut loaded: BTreeMap<&str, Arc<TransformerPlugin>> = BTreeMap::new();
    let mut by_route = Vec::with_capacity(routes.len());
    for (ri, route) in routes.iter().enumerate() {
        if route.transformers.is_empty() {
            by_route.push(None);
            continue;
        }
        let mut chain = Vec::new();
        for (ti, name) in route.transformers.iter().enumerate() {
            let plugin = match loaded.get(name.as_str()) {
                Some(p) => p.clone(),
                None => {
                    let (pi, spec) = plugins
                        .iter()
                        .enumerate()
                        .find(|(_, p)| p.name == *name)
                        .ok_or_else(|| {
                            format!(
                                "config key `routes[{ri}].transformers[{ti}]`: no [[plugins]] entry is named `{name}`"
                            )
                        })?;
                    let p = Arc::new(
                        TransformerPlugin::load(engine, spec)
                            .map_err(|e| format!("config key `plugins[{pi}]`: {e}"))?,
                    );
                    tracing::info!(plugin = %p.label(), sha256 = %p.sha256(), "transformer plugin loaded");
                    loaded.insert(spec.name.as_str(), p.clone());
                    p
                }
            };
            chain.push(plugin);
        }
        by_route.push(Some(RouteChain {
            active: Arc::new(Chain::new(chain).with_topics(TopicPolicy::for_route(route, ri))),
            shadow: None,
        }));
    }
    Ok(Chains::new(ChainTable { by_route }))
}
