//! The state changes an operator makes: activate a version, roll back to
//! the previous one, retire one, run a candidate in shadow. Each is one
//! transaction, announced on [`Channel::Plugins`](crate::store::Channel::Plugins).

use super::Registry;
use super::RegistryError;
use crate::store::registry as stored;
use crate::store::registry::PluginRecord;

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
        stored::activate(&self.db, name, version, by).await?;
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
        let previous = stored::previously_active(&self.db, name, current.version).await?;
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
        stored::retire(&self.db, name, version).await?;
        self.get(name, version).await
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
        stored::set_shadow(&self.db, name, version, on, auto_promote_after).await?;
        self.get(name, version).await
    }
}
