//! The typed configuration lives in `outboxd-core` ([`outboxd_core::config`],
//! `outboxd::config` at the crate root); this turns it into the settings of
//! the host's own components, which core does not know.

use crate::config::Config;

/// The settings of host components, read from a [`Config`].
pub trait ConfigExt {
    fn relay_config(&self) -> crate::relay::RelayConfig;
    fn plugin_engine_config(&self) -> crate::plugin::EngineConfig;
}

impl ConfigExt for Config {
    fn relay_config(&self) -> crate::relay::RelayConfig {
        crate::relay::RelayConfig {
            batch_size: self.relay.batch_size,
            backoff: self.relay.backoff,
            max_attempts: self.relay.max_attempts,
            publish_timeout: self.relay.publish_timeout,
        }
    }

    fn plugin_engine_config(&self) -> crate::plugin::EngineConfig {
        crate::plugin::EngineConfig {
            cache_dir: self.plugin_runtime.cache_dir.resolve(&self.database.url),
            pooling: self.plugin_runtime.pooling,
        }
    }
}
