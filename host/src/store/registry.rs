//! Plugin versions as stored: the `plugins` table (each version's bytes,
//! world and state), `plugin_activations` (what was active when, for a
//! rollback) and `plugin_shadow_stats` (each host's shadow counters).
//! `plugin/registry.rs` decides what may be stored and changed; the
//! statements are here. A state change is announced on
//! [`Channel::Plugins`] in its own transaction.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Row;

use super::{Channel, Db, in_announced_tx, on_pool};

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

/// One version a host may run, as [`desired_versions`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredRow {
    pub name: String,
    pub version: i64,
    /// `active` or `candidate`; retired versions are left out.
    pub state: String,
    pub shadow: bool,
    pub auto_promote_after: Option<i64>,
}

/// The version a deploy stored, or found stored already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredVersion {
    Created(i64),
    Existing(i64),
}

/// The world of `name`'s stored versions when it is not `world`: a name
/// keeps its world.
pub async fn other_world(db: &Db, name: &str, world: &str) -> Result<Option<String>, sqlx::Error> {
    Ok(on_pool!(db, |p| {
        sqlx::query("SELECT world FROM plugins WHERE name = $1 AND world <> $2 LIMIT 1")
            .bind(name)
            .bind(world)
            .fetch_optional(p)
            .await?
            .map(|r| r.get(0))
    }))
}

/// Stores `wasm` as the next version of `name`, a candidate, unless these
/// bytes (`sha256`) are stored under `name` already.
pub async fn store_version(
    db: &Db,
    name: &str,
    sha256: &str,
    world: &str,
    wit_version: &str,
    wasm: &[u8],
    deployed_by: &str,
) -> Result<StoredVersion, sqlx::Error> {
    Ok(in_announced_tx!(db, Channel::Plugins, name, |tx| {
        let existing = sqlx::query(
            "SELECT CAST(version AS BIGINT) FROM plugins WHERE name = $1 AND sha256 = $2",
        )
        .bind(name)
        .bind(sha256)
        .fetch_optional(&mut *tx)
        .await?;
        match existing {
            Some(row) => StoredVersion::Existing(row.get::<i64, _>(0)),
            None => {
                let next: i64 = sqlx::query(
                    "SELECT CAST(COALESCE(MAX(version), 0) + 1 AS BIGINT) FROM plugins WHERE name = $1",
                )
                .bind(name)
                .fetch_one(&mut *tx)
                .await?
                .get(0);
                sqlx::query(
                    "INSERT INTO plugins (name, version, sha256, world, wit_version, component, deployed_by) VALUES ($1, $2, $3, $7, $4, $5, $6)",
                )
                .bind(name)
                .bind(next as i32)
                .bind(sha256)
                .bind(wit_version)
                .bind(wasm)
                .bind(deployed_by)
                .bind(world)
                .execute(&mut *tx)
                .await?;
                StoredVersion::Created(next)
            }
        }
    }))
}

const RECORD_COLUMNS: &str = "name, CAST(version AS BIGINT) AS version, sha256, world, wit_version, CAST(length(component) AS BIGINT) AS size_bytes, deployed_by, state, shadow, auto_promote_after";

/// Every version of every plugin, by name then version, with its shadow
/// counters summed over hosts.
pub async fn list_versions(db: &Db) -> Result<Vec<PluginRecord>, sqlx::Error> {
    let sql = format!(
        "SELECT {RECORD_COLUMNS}, {deployed_us} AS deployed_us FROM plugins ORDER BY name, version",
        deployed_us = db.epoch_micros("deployed_at"),
    );
    let mut records: Vec<PluginRecord> = on_pool!(db, |p| {
        sqlx::query(&sql)
            .fetch_all(p)
            .await?
            .iter()
            .map(|r| PluginRecord {
                name: r.get("name"),
                version: r.get("version"),
                sha256: r.get("sha256"),
                world: r.get("world"),
                wit_version: r.get("wit_version"),
                size_bytes: r.get("size_bytes"),
                deployed_by: r.get("deployed_by"),
                deployed_at: DateTime::from_timestamp_micros(r.get("deployed_us"))
                    .unwrap_or_default(),
                state: r.get("state"),
                shadow: r.get("shadow"),
                auto_promote_after: r.get("auto_promote_after"),
                shadow_stats: ShadowTotals::default(),
            })
            .collect()
    });
    let stats = shadow_totals(db).await?;
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

/// Stores this host's shadow counters for one candidate (absolute values).
pub async fn save_shadow_stats(
    db: &Db,
    host: &str,
    name: &str,
    version: i64,
    s: &ShadowTotals,
) -> Result<(), sqlx::Error> {
    let samples = serde_json::to_string(&s.samples).unwrap_or_else(|_| "[]".into());
    let sql = "INSERT INTO plugin_shadow_stats (name, version, host, matches, mismatches, errors, shadow_micros, active_micros, samples)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
               ON CONFLICT (name, version, host) DO UPDATE SET matches = excluded.matches, mismatches = excluded.mismatches,
                 errors = excluded.errors, shadow_micros = excluded.shadow_micros, active_micros = excluded.active_micros, samples = excluded.samples";
    on_pool!(db, |p| {
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

async fn shadow_totals(db: &Db) -> Result<Vec<((String, i64), ShadowTotals)>, sqlx::Error> {
    let sql = "SELECT name, CAST(version AS BIGINT), matches, mismatches, errors, shadow_micros, active_micros, samples FROM plugin_shadow_stats ORDER BY name, version, host";
    let rows: Vec<(String, i64, [i64; 5], String)> = on_pool!(db, |p| {
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

/// Makes `version` the one active version of `name` and records who
/// activated it, in one announced transaction.
pub async fn activate(db: &Db, name: &str, version: i64, by: &str) -> Result<(), sqlx::Error> {
    set_state(db, name, version, "active", Some(by)).await
}

/// Retires `version` of `name` (and ends its shadow run), announced.
pub async fn retire(db: &Db, name: &str, version: i64) -> Result<(), sqlx::Error> {
    set_state(db, name, version, "retired", None).await
}

/// Gives `version` of `name` its new `state`, out of shadow; an activation
/// (`activated_by`) first makes the active version a candidate again and
/// is recorded for a later rollback.
async fn set_state(
    db: &Db,
    name: &str,
    version: i64,
    state: &str,
    activated_by: Option<&str>,
) -> Result<(), sqlx::Error> {
    in_announced_tx!(db, Channel::Plugins, name, |tx| {
        if activated_by.is_some() {
            sqlx::query(
                "UPDATE plugins SET state = 'candidate' WHERE name = $1 AND state = 'active'",
            )
            .bind(name)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("UPDATE plugins SET state = $3, shadow = $4 WHERE name = $1 AND version = $2")
            .bind(name)
            .bind(version as i32)
            .bind(state)
            .bind(false)
            .execute(&mut *tx)
            .await?;
        if let Some(by) = activated_by {
            sqlx::query(
                "INSERT INTO plugin_activations (name, version, activated_by) VALUES ($1, $2, $3)",
            )
            .bind(name)
            .bind(version as i32)
            .bind(by)
            .execute(&mut *tx)
            .await?;
        }
    });
    Ok(())
}

/// The version of `name` activated last before `current`, if one is left
/// that is not retired.
pub async fn previously_active(
    db: &Db,
    name: &str,
    current: i64,
) -> Result<Option<i64>, sqlx::Error> {
    Ok(on_pool!(db, |p| {
        sqlx::query(
            "SELECT CAST(a.version AS BIGINT) FROM plugin_activations a JOIN plugins p ON p.name = a.name AND p.version = a.version
              WHERE a.name = $1 AND a.version <> $2 AND p.state <> 'retired' ORDER BY a.id DESC LIMIT 1",
        )
        .bind(name)
        .bind(current as i32)
        .fetch_optional(p)
        .await?
        .map(|r| r.get(0))
    }))
}

/// Starts (`on`, ending any other shadow run of `name`) or stops
/// `version`'s shadow run, announced.
pub async fn set_shadow(
    db: &Db,
    name: &str,
    version: i64,
    on: bool,
    auto_promote_after: Option<i64>,
) -> Result<(), sqlx::Error> {
    in_announced_tx!(db, Channel::Plugins, name, |tx| {
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
    Ok(())
}

/// Every version that is not retired, without bytes, by name then version.
pub async fn desired_versions(db: &Db) -> Result<Vec<DesiredRow>, sqlx::Error> {
    let sql = "SELECT name, CAST(version AS BIGINT), state, shadow, auto_promote_after FROM plugins WHERE state <> 'retired' ORDER BY name, version";
    Ok(on_pool!(db, |p| {
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
    }))
}

/// The bytes of one version, if it is stored.
pub async fn component(db: &Db, name: &str, version: i64) -> Result<Option<Vec<u8>>, sqlx::Error> {
    let sql = "SELECT component FROM plugins WHERE name = $1 AND version = $2";
    Ok(on_pool!(db, |p| {
        sqlx::query(sql)
            .bind(name)
            .bind(version as i32)
            .fetch_optional(p)
            .await?
            .map(|r| r.get::<Vec<u8>, _>(0))
    }))
}
