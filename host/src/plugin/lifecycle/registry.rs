//! The plugin registry: versions of each plugin stored in the database, so
//! every host that shares it runs the same active version. Deploying runs
//! the checks of `outboxd plugin validate` plus the shipped sample events;
//! a refused version never reaches the table and the active one stays.
//!
//! This file holds deploying, listing and the shadow counters;
//! `registry/lifecycle.rs` the state changes (activate, rollback, retire,
//! shadow) and `registry/desired.rs` what a host reads to follow them. The
//! records and their statements are the store's (`store/registry.rs`).

use sha2::{Digest, Sha256};

use crate::config::PluginSpec;
use crate::plugin::PluginEngine;
use crate::plugin::harness::SampleEvent;
use crate::plugin::lifecycle::deploy_check;
use crate::store::Db;
use crate::store::registry::{self as stored, StoredVersion};

mod desired;
mod lifecycle;
use crate::store::registry::{PluginRecord, ShadowTotals};
pub use desired::Desired;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("plugin `{name}` refused, the active version is unchanged: {reason}")]
    Refused { name: String, reason: String },
    #[error("plugin `{name}` has no version {version}; `outboxd plugin list` shows the versions")]
    NoSuchVersion { name: String, version: i64 },
    #[error("plugin `{name}`: {reason}")]
    Conflict { name: String, reason: String },
    #[error("plugin registry: {0}")]
    Database(#[from] sqlx::Error),
}

/// What deploying did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deployed {
    /// A new version, stored as a candidate.
    Created(PluginRecord),
    /// These bytes were already stored under this name: nothing changed.
    Unchanged(PluginRecord),
}

impl Deployed {
    pub fn record(&self) -> &PluginRecord {
        match self {
            Deployed::Created(r) | Deployed::Unchanged(r) => r,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Registry {
    db: Db,
}

impl Registry {
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Checks `wasm` and stores it as the next version of `name`, as a
    /// candidate. `spec` supplies the limits and settings the samples run
    /// with; every sample must transform without an error.
    pub async fn deploy(
        &self,
        engine: &PluginEngine,
        spec: &PluginSpec,
        wasm: &[u8],
        samples: &[SampleEvent],
        deployed_by: &str,
    ) -> Result<Deployed, RegistryError> {
        self.deploy_as(engine, spec, wasm, samples, deployed_by, None)
            .await
    }

    /// [`deploy`](Self::deploy), also refusing a component that does not
    /// implement `expected_world` (`transformer` or `consumer`: how the
    /// config runs this name).
    pub async fn deploy_as(
        &self,
        engine: &PluginEngine,
        spec: &PluginSpec,
        wasm: &[u8],
        samples: &[SampleEvent],
        deployed_by: &str,
        expected_world: Option<&str>,
    ) -> Result<Deployed, RegistryError> {
        let name = spec.name.clone();
        let refuse = |reason: String| RegistryError::Refused {
            name: name.clone(),
            reason,
        };
        let (world, wit_version) = deploy_check::check(engine, spec, wasm, samples)
            .await
            .map_err(refuse)?;
        if let Some(expected) = expected_world.filter(|w| *w != world) {
            return Err(refuse(format!(
                "implements the {world} world, but the config runs `{name}` as a {expected}"
            )));
        }
        let sha256 = hex::encode(Sha256::digest(wasm));
        // A name keeps its world: hosts run it as a transformer or as a
        // consumer according to their config, never both.
        let other_world = stored::other_world(&self.db, &name, world).await?;
        if let Some(other) = other_world {
            return Err(refuse(format!(
                "implements the {world} world, but the stored versions of `{name}` are {other}s; deploy it under another name"
            )));
        }
        let version = stored::store_version(
            &self.db,
            &name,
            &sha256,
            world,
            &wit_version,
            wasm,
            deployed_by,
        )
        .await?;
        match version {
            StoredVersion::Created(v) => Ok(Deployed::Created(self.get(&name, v).await?)),
            StoredVersion::Existing(v) => Ok(Deployed::Unchanged(self.get(&name, v).await?)),
        }
    }

    /// Every version of every plugin, by name then version.
    pub async fn list(&self) -> Result<Vec<PluginRecord>, RegistryError> {
        Ok(stored::list_versions(&self.db).await?)
    }

    pub async fn get(&self, name: &str, version: i64) -> Result<PluginRecord, RegistryError> {
        self.list()
            .await?
            .into_iter()
            .find(|r| r.name == name && r.version == version)
            .ok_or_else(|| RegistryError::NoSuchVersion {
                name: name.into(),
                version,
            })
    }

    /// Stores this host's shadow counters for one candidate (absolute values).
    pub async fn save_shadow_stats(
        &self,
        host: &str,
        name: &str,
        version: i64,
        s: &ShadowTotals,
    ) -> Result<(), RegistryError> {
        Ok(stored::save_shadow_stats(&self.db, host, name, version, s).await?)
    }
}
