//! What one process holds of its database pool at once. The config refuses
//! a `database.max_connections` below it, and the daemon bounds how many
//! partitions a consumer handles side by side by what the pool has left, so
//! no worker waits for a connection that the others hold while they wait.
//!
//! The holders, as the host runs them:
//! - a relay worker holds its claim for a batch's round trip (on Postgres
//!   the claim is a transaction), and a pipelined worker holds two batches;
//! - the embedded transport's group-commit writer holds one transaction at a
//!   time for every relay worker of the process; on Postgres a claim waits
//!   for that writer while holding its own connection, so the writer must
//!   always find one;
//! - on Postgres, each LISTEN holds a pool connection for good: the relays'
//!   (one for all workers), each embedded consumer's, and the plugin
//!   registry's when a registry plugin or `watch_dir` is configured;
//! - a consumer holds one transaction per partition it handles at once (one
//!   at a time on SQLite, which writes one transaction at a time);
//! - retention, reconciliation, the admin API, dead letters and lease
//!   renewals take one briefly: one connection is kept for them.

use super::{Config, PluginSource, TransportKind};
use crate::db_url::DbKind;

/// How many connections each kind of holder needs at least.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolBudget {
    /// `relay.workers`, twice with `relay.pipeline`.
    pub relay: u32,
    /// The embedded transport's group-commit writer.
    pub group_writer: u32,
    /// Postgres LISTEN connections.
    pub listeners: u32,
    /// One per consumer: each needs a connection for its first partition.
    pub consumers: u32,
    /// Retention, reconciliation, the admin API and other short uses.
    pub spare: u32,
}

impl PoolBudget {
    /// Everything but the consumers' extra partitions.
    pub fn minimum(&self) -> u32 {
        self.relay + self.group_writer + self.listeners + self.consumers + self.spare
    }
}

impl Config {
    /// What this process holds of its pool at once, at least.
    pub fn pool_budget(&self) -> PoolBudget {
        let postgres = DbKind::from_url(&self.database.url).ok() == Some(DbKind::Postgres);
        let embedded = self.transport.kind == TransportKind::Embedded;
        let workers = u32::try_from(self.relay.workers).unwrap_or(u32::MAX);
        let consumers = u32::try_from(self.consumers.len()).unwrap_or(u32::MAX);
        let relays = workers > 0;
        let listeners = if postgres {
            u32::from(relays)
                + if embedded { consumers } else { 0 }
                + u32::from(self.uses_plugin_registry())
        } else {
            0
        };
        PoolBudget {
            relay: workers.saturating_mul(if self.relay.pipeline { 2 } else { 1 }),
            group_writer: u32::from(embedded && relays),
            listeners,
            consumers,
            spare: 1,
        }
    }

    /// How many partitions each consumer may handle side by side: an equal
    /// share of what the pool has beyond [`Config::pool_budget`]'s other
    /// holders, at least one. SQLite handles them one at a time anyway.
    pub fn consumer_parallel_partitions(&self) -> usize {
        let budget = self.pool_budget();
        if budget.consumers == 0 {
            return 1;
        }
        let others = budget.minimum() - budget.consumers;
        let free = self.database.max_connections.saturating_sub(others);
        usize::try_from((free / budget.consumers).max(1)).unwrap_or(1)
    }

    /// Whether the daemon runs the plugin registry's rollout (and, on
    /// Postgres, its LISTEN): a route or a consumer names a registry plugin,
    /// or `plugin_runtime.watch_dir` is set.
    fn uses_plugin_registry(&self) -> bool {
        let registry = |name: &str| {
            self.plugins
                .iter()
                .any(|p| p.name == name && p.source == PluginSource::Registry)
        };
        self.plugin_runtime.watch_dir.is_some()
            || self
                .routes
                .iter()
                .flat_map(|r| &r.transformers)
                .any(|t| registry(t))
            || self
                .consumers
                .iter()
                .filter_map(|c| c.plugin_name())
                .any(registry)
    }
}

#[cfg(test)]
mod tests {
    use super::PoolBudget;
    use crate::config::Config;

    fn config(toml: &str) -> Config {
        Config::from_toml("t.toml", toml, std::iter::empty()).expect("valid")
    }

    const PG: &str = "[database]\nurl = \"postgres://app@db/orders\"\nmax_connections = 16\n";
    const CONSUMER: &str =
        "[[consumers]]\nname = \"c\"\ntopics = [\"orders\"]\nhandler = \"builtin:billing\"\n";

    #[test]
    fn the_default_sqlite_process_needs_the_relays_the_writer_and_a_spare() {
        let c = config("");
        assert_eq!(
            c.pool_budget(),
            PoolBudget {
                relay: 2,
                group_writer: 1,
                listeners: 0,
                consumers: 0,
                spare: 1
            }
        );
        assert_eq!(c.pool_budget().minimum(), 4);
    }

    #[test]
    fn postgres_adds_its_listen_connections_and_pipelining_doubles_the_relays() {
        let c = config(&format!(
            "{PG}[relay]\npipeline = true\n{CONSUMER}{}",
            CONSUMER.replace("\"c\"", "\"d\"")
        ));
        let b = c.pool_budget();
        assert_eq!(
            (b.relay, b.group_writer, b.listeners, b.consumers),
            (4, 1, 3, 2)
        );
        assert_eq!(b.minimum(), 11);
        // 16 - (4 + 1 + 3 + 1) = 7 connections for 2 consumers.
        assert_eq!(c.consumer_parallel_partitions(), 3);
    }

    #[test]
    fn kafka_has_no_group_writer_and_consumers_no_listen() {
        let c = config(&format!(
            "{PG}[transport]\nkind = \"kafka\"\n[transport.kafka]\n\"bootstrap.servers\" = \"k:9092\"\n{CONSUMER}"
        ));
        let b = c.pool_budget();
        assert_eq!((b.group_writer, b.listeners, b.consumers), (0, 1, 1));
    }

    #[test]
    fn a_registry_plugin_adds_the_registrys_listen() {
        let c = config(&format!(
            "{PG}[[plugins]]\nname = \"p\"\nsource = \"registry\"\n[[routes]]\nevent_type = \"*\"\ntopic = \"t\"\ntransformers = [\"p\"]\n"
        ));
        assert_eq!(c.pool_budget().listeners, 2);
    }
}
