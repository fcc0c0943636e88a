//! What hosts follow: every version that is not retired ([`Desired`],
//! cheap enough to poll every second) and the bytes of one version.

use sqlx::Row;

use super::{Registry, RegistryError, on_pool};

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

impl Registry {
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
}
