//! The plugin registry: versions of each plugin stored in the database, so
//! every host that shares it runs the same active version. Deploying runs
//! the checks of `outboxd plugin validate` plus the shipped sample events;
//! a refused version never reaches the table and the active one stays.
//!
//! This file holds the records, deploying, listing and the shadow counters;
//! `registry/lifecycle.rs` the state changes (activate, rollback, retire,
//! shadow) and `registry/desired.rs` what a host reads to follow them.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::Row;

use super::harness::SampleEvent;
use super::transformer::PluginSpec;
use super::{PluginEngine, deploy_check};
use crate::store::{Channel, Db};

mod desired;
mod lifecycle;

pub use super::deploy_check::MAX_COMPONENT_BYTES;
pub use desired::{Desired, DesiredRow};

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

/// One stored version, without its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PluginRecord {
    pub name: String,
    pub version: i64,
    pub sha256: String,
    pub world: String,
    pub wit_version: String,
    pub size_bytes: i64,
    pub deployed_by: String,
    pub deployed_at: DateTime<Utc>,
    pub state: String,
    pub shadow: bool,
    pub auto_promote_after: Option<i64>,
    /// Shadow counters summed over hosts; zero when it never ran in shadow.
    pub shadow_stats: ShadowTotals,
}

impl PluginRecord {
    /// `name@version`, as recorded in the outbox's `transformed_by`.
    pub fn label(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ShadowTotals {
    pub matches: i64,
    pub mismatches: i64,
    pub errors: i64,
    pub shadow_micros: i64,
    pub active_micros: i64,
    /// A few mismatching events, as JSON strings, from each host.
    pub samples: Vec<String>,
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

use crate::store::{in_announced_tx, on_pool};

const RECORD_COLUMNS: &str = "name, CAST(version AS BIGINT) AS version, sha256, world, wit_version, CAST(length(component) AS BIGINT) AS size_bytes, deployed_by, state, shadow, auto_promote_after";

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
        let other_world: Option<String> = on_pool!(&self.db, |p| {
            sqlx::query("SELECT world FROM plugins WHERE name = $1 AND world <> $2 LIMIT 1")
                .bind(&name)
                .bind(world)
                .fetch_optional(p)
                .await?
                .map(|r| r.get(0))
        });
        if let Some(other) = other_world {
            return Err(refuse(format!(
                "implements the {world} world, but the stored versions of `{name}` are {other}s; deploy it under another name"
            )));
        }
        let created = in_announced_tx!(&self.db, Channel::Plugins, &name, |tx| {
            let existing =
                sqlx::query("SELECT version FROM plugins WHERE name = $1 AND sha256 = $2")
                    .bind(&name)
                    .bind(&sha256)
                    .fetch_optional(&mut *tx)
                    .await?;
            match existing {
                Some(row) => Err(row.get::<i64, _>(0)),
                None => {
                    let next: i64 = sqlx::query(
                        "SELECT CAST(COALESCE(MAX(version), 0) + 1 AS BIGINT) FROM plugins WHERE name = $1",
                    )
                    .bind(&name)
                    .fetch_one(&mut *tx)
                    .await?
                    .get(0);
                    sqlx::query(
                        "INSERT INTO plugins (name, version, sha256, world, wit_version, component, deployed_by) VALUES ($1, $2, $3, $7, $4, $5, $6)",
                    )
                    .bind(&name)
                    .bind(next as i32)
                    .bind(&sha256)
                    .bind(&wit_version)
                    .bind(wasm)
                    .bind(deployed_by)
                    .bind(world)
                    .execute(&mut *tx)
                    .await?;
                    Ok(next)
                }
            }
        });
        match created {
            Ok(v) => Ok(Deployed::Created(self.get(&name, v).await?)),
            Err(v) => Ok(Deployed::Unchanged(self.get(&name, v).await?)),
        }
    }

    /// Every version of every plugin, by name then version.
    pub async fn list(&self) -> Result<Vec<PluginRecord>, RegistryError> {
        let sql = format!(
            "SELECT {RECORD_COLUMNS}, {deployed_us} AS deployed_us FROM plugins ORDER BY name, version",
            deployed_us = self.db.epoch_micros("deployed_at"),
        );
        let mut records: Vec<PluginRecord> = on_pool!(&self.db, |p| {
            sqlx::query(&sql)
                .fetch_all(p)
                .await?
                .iter()
                .map(|r| record_from_row!(r))
                .collect()
        });
        let stats = self.shadow_totals().await?;
        for r in &mut records {
            if let Some((_, s)) = stats
                .iter()
                .find(|(k, _)| *k == (r.name.clone(), r.version))
            {
                r.shadow_stats = s.clone();
            }
        }
        Ok(records)
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
        let samples = serde_json::to_string(&s.samples).unwrap_or_else(|_| "[]".into());
        let sql = "INSERT INTO plugin_shadow_stats (name, version, host, matches, mismatches, errors, shadow_micros, active_micros, samples)
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                   ON CONFLICT (name, version, host) DO UPDATE SET matches = excluded.matches, mismatches = excluded.mismatches,
                     errors = excluded.errors, shadow_micros = excluded.shadow_micros, active_micros = excluded.active_micros, samples = excluded.samples";
        on_pool!(&self.db, |p| {
            sqlx::query(sql)
                .bind(name)
                .bind(version as i32)
                .bind(host)
                .bind(s.matches)
                .bind(s.mismatches)
                .bind(s.errors)
                .bind(s.shadow_micros)
                .bind(s.active_micros)
                .bind(&samples)
                .execute(p)
                .await
                .map(|_| ())?
        });
        Ok(())
    }

    async fn shadow_totals(&self) -> Result<Vec<((String, i64), ShadowTotals)>, RegistryError> {
        let sql = "SELECT name, CAST(version AS BIGINT), matches, mismatches, errors, shadow_micros, active_micros, samples FROM plugin_shadow_stats ORDER BY name, version, host";
        let rows: Vec<(String, i64, [i64; 5], String)> = on_pool!(&self.db, |p| {
            sqlx::query(sql)
                .fetch_all(p)
                .await?
                .iter()
                .map(|r| {
                    (
                        r.get(0),
                        r.get(1),
                        [r.get(2), r.get(3), r.get(4), r.get(5), r.get(6)],
                        r.get(7),
                    )
                })
                .collect()
        });
        let mut out: Vec<((String, i64), ShadowTotals)> = Vec::new();
        for (name, version, n, samples) in rows {
            let key = (name, version);
            let i = match out.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    out.push((key, ShadowTotals::default()));
                    out.len() - 1
                }
            };
            let t = &mut out[i].1;
            t.matches += n[0];
            t.mismatches += n[1];
            t.errors += n[2];
            t.shadow_micros += n[3];
            t.active_micros += n[4];
            t.samples
                .extend(serde_json::from_str::<Vec<String>>(&samples).unwrap_or_default());
        }
        Ok(out)
    }
}

/// A [`PluginRecord`] from a row of [`RECORD_COLUMNS`].
macro_rules! record_from_row {
    ($r:expr) => {{
        let r = $r;
        PluginRecord {
            name: r.get("name"),
            version: r.get("version"),
            sha256: r.get("sha256"),
            world: r.get("world"),
            wit_version: r.get("wit_version"),
            size_bytes: r.get("size_bytes"),
            deployed_by: r.get("deployed_by"),
            deployed_at: DateTime::from_timestamp_micros(r.get("deployed_us")).unwrap_or_default(),
            state: r.get("state"),
            shadow: r.get("shadow"),
            auto_promote_after: r.get("auto_promote_after"),
            shadow_stats: ShadowTotals::default(),
        }
    }};
}
use record_from_row;
