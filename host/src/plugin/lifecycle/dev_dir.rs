//! Development mode: a directory whose `NAME.wasm` files are deployed to the
//! registry as plugin NAME and activated when they appear or change. It
//! feeds the same registry as `outboxd plugin deploy`, so the same checks
//! apply and a refused file leaves the active version running.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::config::PluginSpec;
use crate::plugin::lifecycle::registry::{Deployed, Registry};
use crate::plugin::runtime::engine::PluginEngine;

/// Scans `dir` once: deploys and activates every new or changed file.
/// `seen` remembers modification times between scans.
pub async fn scan(
    engine: &PluginEngine,
    registry: &Registry,
    specs: &[PluginSpec],
    dir: &Path,
    seen: &mut BTreeMap<PathBuf, SystemTime>,
) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        tracing::warn!(dir = %dir.display(), "plugin watch_dir cannot be read");
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let (Some(name), Some("wasm")) = (
            path.file_stem().and_then(|s| s.to_str()),
            path.extension().and_then(|s| s.to_str()),
        ) else {
            continue;
        };
        let Ok(modified) = entry.metadata().and_then(|m| m.modified()) else {
            continue;
        };
        if seen.get(&path) == Some(&modified) {
            continue;
        }
        seen.insert(path.clone(), modified);
        let Ok(wasm) = std::fs::read(&path) else {
            continue;
        };
        let spec = specs
            .iter()
            .find(|s| s.name == name)
            .cloned()
            .unwrap_or_else(|| PluginSpec::new(name, &path));
        let deployed = registry
            .deploy(engine, &spec, &wasm, &[], "watch_dir")
            .await;
        let version = match deployed {
            Ok(Deployed::Created(r) | Deployed::Unchanged(r)) if r.state == "active" => continue,
            Ok(d) => d.record().version,
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "plugin file refused");
                continue;
            }
        };
        match registry.activate(name, version, "watch_dir").await {
            Ok(r) => {
                tracing::info!(plugin = %r.label(), file = %path.display(), "plugin file deployed and activated")
            }
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "plugin file not activated")
            }
        }
    }
}

/// Scans every `every` until `shutdown` turns true.
pub async fn run(
    engine: PluginEngine,
    registry: Registry,
    specs: Vec<PluginSpec>,
    dir: PathBuf,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut seen = BTreeMap::new();
    loop {
        scan(&engine, &registry, &specs, &dir, &mut seen).await;
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return;
        }
    }
}
