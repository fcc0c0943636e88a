//! The slot a consumer plugin runs from: the versions one message runs on
//! (the active one, and a shadow candidate with its counters). A file
//! plugin's slot never changes; the rollout swaps a registry plugin's slot
//! whole, and each message reads it once.

use std::sync::{Arc, RwLock};

use crate::plugin::lifecycle::chains::PinError;
use crate::plugin::lifecycle::registry::RegistryError;
use crate::plugin::lifecycle::shadow::ShadowStats;
use crate::plugin::lifecycle::versions::{RegistryVersions, VersionLabel};
use crate::plugin::runtime::consumer::ConsumerPlugin;

/// What a consumer runs: its active version and, while a candidate is in
/// shadow, that candidate with its counters.
#[derive(Debug, Clone)]
pub struct ConsumerVersions {
    pub active: Option<Arc<ConsumerPlugin>>,
    pub shadow: Option<(Arc<ConsumerPlugin>, Arc<ShadowStats>)>,
}

/// The version slot of one consumer plugin, shared by the consumer and the
/// rollout. A swap replaces the whole value behind a lock held only for the
/// swap; calls in flight keep the `Arc` they started with.
#[derive(Debug, Clone)]
pub struct ActiveConsumer {
    name: String,
    slot: Arc<RwLock<Arc<ConsumerVersions>>>,
    /// Where a registry plugin's other versions come from, for a message
    /// redriven through one of them (`None` for a file plugin).
    versions: Option<Arc<RegistryVersions>>,
}

impl ActiveConsumer {
    /// A slot with no version yet: messages wait (retryable) until the
    /// rollout fills it.
    pub fn empty(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            slot: Arc::new(RwLock::new(Arc::new(ConsumerVersions {
                active: None,
                shadow: None,
            }))),
            versions: None,
        }
    }

    /// Lets this slot's plugin run any registry version on demand
    /// ([`pinned`](Self::pinned)); the rollout's slots have it.
    pub fn with_versions(mut self, versions: Arc<RegistryVersions>) -> Self {
        self.versions = Some(versions);
        self
    }

    /// Registry version `label` of this slot's plugin (a candidate
    /// included) as the one active version for a single message, loaded on
    /// demand and kept for the next, without touching what the slot holds
    /// for live traffic.
    pub async fn pinned(&self, label: &VersionLabel) -> Result<ConsumerVersions, PinError> {
        let fail = |permanent: bool, reason: String| PinError {
            label: label.to_string(),
            reason,
            permanent,
        };
        if label.name != self.name {
            return Err(fail(
                true,
                format!(
                    "this consumer runs plugin `{}`, not `{}`; pick a version of `{}` (`outboxd plugin list`)",
                    self.name, label.name, self.name
                ),
            ));
        }
        let Some(versions) = &self.versions else {
            return Err(fail(
                true,
                format!(
                    "plugin `{}` is loaded from a file (plugins[].source = \"file\"), so it has no registry versions to run; deploy it to the registry and set source = \"registry\", or redrive without a version",
                    self.name
                ),
            ));
        };
        let plugin = versions.pinned_consumer(label).await.map_err(|e| {
            let permanent = !matches!(e, RegistryError::Database(_));
            fail(permanent, e.to_string())
        })?;
        Ok(ConsumerVersions {
            active: Some(plugin),
            shadow: None,
        })
    }

    /// A slot holding one version for good (a file plugin).
    pub fn fixed(name: impl Into<String>, plugin: Arc<ConsumerPlugin>) -> Self {
        let slot = Self::empty(name);
        slot.replace(ConsumerVersions {
            active: Some(plugin),
            shadow: None,
        });
        slot
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The current versions; hold them for one message.
    pub fn snapshot(&self) -> Arc<ConsumerVersions> {
        match self.slot.read() {
            Ok(v) => v.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Swaps in new versions for every later message.
    pub fn replace(&self, versions: ConsumerVersions) {
        let versions = Arc::new(versions);
        match self.slot.write() {
            Ok(mut v) => *v = versions,
            Err(poisoned) => *poisoned.into_inner() = versions,
        }
    }

    /// `name@version` of the active version, if there is one.
    pub fn label(&self) -> Option<String> {
        self.snapshot().active.as_ref().map(|p| p.label())
    }
}
