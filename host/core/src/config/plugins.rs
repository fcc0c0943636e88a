//! `[[plugins]]`: where a plugin's component comes from, its version and
//! settings, and the sandbox limits every call of it runs under.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

/// Where a plugin's component comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginSource {
    /// The `path` file, loaded once at start.
    #[default]
    File,
    /// The active version in the database's plugin registry, swapped while
    /// running (`outboxd plugin deploy|activate|rollback`).
    Registry,
}

/// A `[[plugins]]` entry of the config file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSpec {
    /// The name routes use in `transformers = [...]`; for a registry plugin
    /// also its name in the registry.
    pub name: String,
    #[serde(default)]
    pub source: PluginSource,
    /// The component file (`.wasm`); empty for a registry plugin.
    #[serde(default)]
    pub path: PathBuf,
    /// Recorded with every event the plugin touches; defaults to
    /// `sha256:<first 12 hex digits of the file>`.
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub limits: Limits,
    /// Settings the plugin reads through the `config` import.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// Consumer plugins only: the hosts `wasi:http` may reach,
    /// `scheme://host[:port]`. Empty (the default): no network at all.
    #[serde(default)]
    pub allowed_outbound_hosts: Vec<String>,
    /// Limits of those requests (`[plugins.http]`).
    #[serde(default)]
    pub http: super::HttpLimits,
}

impl PluginSpec {
    pub fn new(name: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            source: PluginSource::File,
            path: path.into(),
            version: None,
            limits: Limits::default(),
            config: BTreeMap::new(),
            allowed_outbound_hosts: Vec::new(),
            http: super::HttpLimits::default(),
        }
    }
}

/// The sandbox of one plugin; every field has a safe default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Wall-clock deadline of one call, enforced by epoch interruption.
    #[serde(
        rename = "timeout",
        alias = "timeout_ms",
        deserialize_with = "super::duration::keys::plugin_timeout"
    )]
    pub timeout: std::time::Duration,
    /// Linear memory the plugin may grow to, across all its memories.
    pub memory_mib: u64,
    /// Total bytes (payloads, keys, headers) one call may return.
    pub max_output_bytes: usize,
    /// Messages one call may return.
    pub max_outputs: usize,
    /// Reuse a Store and instance across calls until a failure (faster);
    /// `false` instantiates for every call (no state survives an event).
    pub reuse_instances: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            timeout: std::time::Duration::from_millis(50),
            memory_mib: 64,
            max_output_bytes: 1 << 20,
            max_outputs: 100,
            reuse_instances: true,
        }
    }
}

impl Limits {
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib.saturating_mul(1 << 20)
    }
}
