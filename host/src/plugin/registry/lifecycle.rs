//! The state changes an operator makes: activate a version, roll back to
//! the previous one, retire one, run a candidate in shadow. Each is one
//! transaction, announced on [`Channel::Plugins`](crate::store::Channel::Plugins).

use sqlx::Row;

use super::{PluginRecord, Registry, RegistryError};
use crate::store::{Channel, in_announced_tx, on_pool};

impl Registry {
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
        in_announced_tx!(&self.db, Channel::Plugins, name, |tx| {
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
        in_announced_tx!(&self.db, Channel::Plugins, name, |tx| {
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
        in_announced_tx!(&self.db, Channel::Plugins, name, |tx| {
            sqlx::query(sql)
                .bind(name)
                .bind(version as i32)
                .bind(shadow)
                .execute(&mut *tx)
                .await?;
        });
        self.get(name, version).await
    }
}
