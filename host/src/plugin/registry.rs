//! The plugin registry: versions of each plugin stored in the database, so
//! every host that shares it runs the same active version. Deploying runs
//! the checks of `outboxd plugin validate` plus the shipped sample events;
//! a refused version never reaches the table and the active one stays.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::Row;

use super::harness::SampleEvent;
use super::transformer::PluginSpec;
use super::{PluginEngine, deploy_check};
use crate::store::Db;

pub use super::deploy_check::MAX_COMPONENT_BYTES;

/// The channel a state change is announced on, in its own transaction.
pub const NOTIFY_CHANNEL: &str = "outboxd_plugins";

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

/// One version a host may run, as [`Registry::desired`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredRow {
    pub name: String,
    pub version: i64,
    /// `active` or `candidate`; retired versions are left out.
    pub state: String,
    pub shadow: bool,
    pub auto_promote_after: Option<i64>,
}

/// What hosts should run: each plugin's active version and shadow
/// candidate, plus the other candidates, which hosts compile ahead so that
/// activating one is only a swap.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Desired {
    pub rows: Vec<DesiredRow>,
}

impl Desired {
    pub fn active(&self, name: &str) -> Option<i64> {
        self.rows
            .iter()
            .find(|r| r.name == name && r.state == "active")
            .map(|r| r.version)
    }

    pub fn shadow(&self, name: &str) -> Option<(i64, Option<i64>)> {
        self.rows
            .iter()
            .find(|r| r.name == name && r.shadow)
            .map(|r| (r.version, r.auto_promote_after))
    }
}

/// Runs the same statements on either database in one transaction; on
/// Postgres the change is announced on [`NOTIFY_CHANNEL`] in that same
/// transaction, so no host hears of a change it cannot read yet.
macro_rules! in_tx {
    ($db:expr, notify = $name:expr, |$tx:ident| $body:block) => {
        match $db {
            Db::Postgres(pool) => {
                let mut $tx = pool.begin().await?;
                let out = $body;
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(NOTIFY_CHANNEL)
                    .bind($name)
                    .execute(&mut *$tx)
                    .await?;
                $tx.commit().await?;
                out
            }
            Db::Sqlite(pool) => {
                let mut $tx = pool.begin().await?;
                let out = $body;
                $tx.commit().await?;
                out
            }
        }
    };
}

/// Runs one query on either pool.
macro_rules! on_pool {
    ($db:expr, |$pool:ident| $body:expr) => {
        match $db {
            Db::Postgres($pool) => $body,
            Db::Sqlite($pool) => $body,
        }
    };
}

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
        let created = in_tx!(&self.db, notify = &name, |tx| {
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
        let deployed_us = match self.db {
            Db::Postgres(_) => "CAST(EXTRACT(EPOCH FROM deployed_at) * 1000000 AS BIGINT)",
            Db::Sqlite(_) => "deployed_at",
        };
        let sql = format!(
            "SELECT {RECORD_COLUMNS}, {deployed_us} AS deployed_us FROM plugins ORDER BY name, version"
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

    /// Makes `version` the one active version of `name`, atomically, and
    /// tells every host.
    pub async fn activate(
        &self,
        name: &str,
        version: i64,
        by: &str,
    ) -> Result<PluginRecord, RegistryError> {
        let state = self.get(name, version).await?.state;
        if state == "retired" {
            return Err(RegistryError::Conflict {
                name: name.into(),
                reason: format!("version {version} is retired and cannot be activated"),
            });
        }
        in_tx!(&self.db, notify = name, |tx| {
            sqlx::query(
                "UPDATE plugins SET state = 'candidate' WHERE name = $1 AND state = 'active'",
            )
            .bind(name)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "UPDATE plugins SET state = 'active', shadow = $3 WHERE name = $1 AND version = $2",
            )
            .bind(name)
            .bind(version as i32)
            .bind(false)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO plugin_activations (name, version, activated_by) VALUES ($1, $2, $3)",
            )
            .bind(name)
            .bind(version as i32)
            .bind(by)
            .execute(&mut *tx)
            .await?;
        });
        self.get(name, version).await
    }

    /// Activates the version that was active before the current one.
    pub async fn rollback(&self, name: &str, by: &str) -> Result<PluginRecord, RegistryError> {
        let current = self
            .list()
            .await?
            .into_iter()
            .find(|r| r.name == name && r.state == "active");
        let Some(current) = current else {
            return Err(RegistryError::Conflict {
                name: name.into(),
                reason: "no version is active, so there is nothing to roll back".into(),
            });
        };
        let previous: Option<i64> = on_pool!(&self.db, |p| {
            sqlx::query(
                "SELECT CAST(a.version AS BIGINT) FROM plugin_activations a JOIN plugins p ON p.name = a.name AND p.version = a.version
                  WHERE a.name = $1 AND a.version <> $2 AND p.state <> 'retired' ORDER BY a.id DESC LIMIT 1",
            )
            .bind(name)
            .bind(current.version as i32)
            .fetch_optional(p)
            .await?
            .map(|r| r.get(0))
        });
        match previous {
            Some(v) => self.activate(name, v, by).await,
            None => Err(RegistryError::Conflict {
                name: name.into(),
                reason: format!(
                    "version {} is the only version ever active",
                    current.version
                ),
            }),
        }
    }

    /// Retires a version that is not active; it can never run again.
    pub async fn retire(&self, name: &str, version: i64) -> Result<PluginRecord, RegistryError> {
        if self.get(name, version).await?.state == "active" {
            return Err(RegistryError::Conflict {
                name: name.into(),
                reason: format!(
                    "version {version} is active; activate another version or roll back first"
                ),
            });
        }
        self.set_state(
            name,
            version,
            "UPDATE plugins SET state = 'retired', shadow = $3 WHERE name = $1 AND version = $2",
            false,
        )
        .await
    }

    /// Runs a candidate in shadow next to the active version (or stops it);
    /// `auto_promote_after` promotes it after that many clean events.
    pub async fn shadow(
        &self,
        name: &str,
        version: i64,
        on: bool,
        auto_promote_after: Option<i64>,
    ) -> Result<PluginRecord, RegistryError> {
        if on && self.get(name, version).await?.state != "candidate" {
            return Err(RegistryError::Conflict {
                name: name.into(),
                reason: format!("only a candidate can run in shadow; version {version} is not one"),
            });
        }
        in_tx!(&self.db, notify = name, |tx| {
            if on {
                sqlx::query("UPDATE plugins SET shadow = $2 WHERE name = $1")
                    .bind(name)
                    .bind(false)
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query("UPDATE plugins SET shadow = $3, auto_promote_after = $4 WHERE name = $1 AND version = $2")
                .bind(name)
                .bind(version as i32)
                .bind(on)
                .bind(auto_promote_after)
                .execute(&mut *tx)
                .await?;
        });
        self.get(name, version).await
    }

    async fn set_state(
        &self,
        name: &str,
        version: i64,
        sql: &str,
        shadow: bool,
    ) -> Result<PluginRecord, RegistryError> {
        in_tx!(&self.db, notify = name, |tx| {
            sqlx::query(sql)
                .bind(name)
                .bind(version as i32)
                .bind(shadow)
                .execute(&mut *tx)
                .await?;
        });
        self.get(name, version).await
    }

    /// Every version that is not retired, without bytes: what a host should
    /// be running or ready to run. Cheap enough to poll every second.
    pub async fn desired(&self) -> Result<Desired, RegistryError> {
        let sql = "SELECT name, CAST(version AS BIGINT), state, shadow, auto_promote_after FROM plugins WHERE state <> 'retired' ORDER BY name, version";
        let rows = on_pool!(&self.db, |p| {
            sqlx::query(sql)
                .fetch_all(p)
                .await?
                .iter()
                .map(|r| DesiredRow {
                    name: r.get(0),
                    version: r.get(1),
                    state: r.get(2),
                    shadow: r.get(3),
                    auto_promote_after: r.get(4),
                })
                .collect()
        });
        Ok(Desired { rows })
    }

    /// The bytes of one version.
    pub async fn component(&self, name: &str, version: i64) -> Result<Vec<u8>, RegistryError> {
        let sql = "SELECT component FROM plugins WHERE name = $1 AND version = $2";
        let row = on_pool!(&self.db, |p| {
            sqlx::query(sql)
                .bind(name)
                .bind(version as i32)
                .fetch_optional(p)
                .await?
                .map(|r| r.get::<Vec<u8>, _>(0))
        });
        row.ok_or_else(|| RegistryError::NoSuchVersion {
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
