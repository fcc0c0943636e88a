//! What hosts follow: every version that is not retired ([`Desired`],
//! cheap enough to poll every second) and the bytes of one version.

use super::Registry;
use super::RegistryError;
use crate::store::registry as stored;
use crate::store::registry::DesiredRow;

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
        let rows = stored::desired_versions(&self.db).await?;
        Ok(Desired { rows })
    }

    /// The bytes of one version.
    pub async fn component(&self, name: &str, version: i64) -> Result<Vec<u8>, RegistryError> {
        let row = stored::component(&self.db, name, version).await?;
        row.ok_or_else(|| RegistryError::NoSuchVersion {
            name: name.into(),
            version,
        })
    }
}
