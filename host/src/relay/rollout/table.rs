//! What runs, built from the loaded versions and the registry's desired
//! state: each route's chain (with its shadow chain) and each consumer
//! plugin's slot.

use std::sync::Arc;

use super::Rollout;
use crate::consumer::ConsumerVersions;
use crate::plugin::registry::Desired;
use crate::plugin::shadow::ShadowStats;
use crate::plugin::{Chain, TopicPolicy, TransformerPlugin};
use crate::relay::chains::{ChainTable, RouteChain, Shadow};

impl Rollout {
    /// Points every consumer slot at the active (and shadow) version of
    /// `desired`; returns whether any active version changed. Each slot is
    /// replaced whole, so a message sees the old or the new versions, never
    /// a mix.
    pub(super) fn swap_consumers(&self, desired: &Desired) -> bool {
        let loaded = |name: &str, v: i64| {
            self.loaded_consumers
                .lock()
                .ok()?
                .get(&(name.to_string(), v))
                .cloned()
        };
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
        self.loaded
            .lock()
            .ok()?
            .get(&(name.to_string(), version))
            .cloned()
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
