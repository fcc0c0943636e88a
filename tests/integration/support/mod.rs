//! What the tests share, and the only module they import from: a fresh
//! database per test ([`db`]), [`eventually`] for every wait, the plugins
//! and processes they run, and stand-ins for the services around outboxd
//! (a broker, an HTTP server, a payment provider, private Kafka brokers).
//! No test module imports another.

pub mod admin;
pub mod brokers;
pub mod db;
pub mod eventually;
pub mod kafka;
pub mod ledger;
pub mod outbound_server;
pub mod payment_provider;
pub mod pipeline;
pub mod plugin_test;
pub mod plugins;
pub mod private_kafka;
pub mod process;
pub mod publisher;
pub mod swap;
pub mod tls;
pub mod wal;
pub mod webhook_receiver;

pub use db::{TestDb, WalTestDb, pg_admin_url};
pub use eventually::eventually;
pub use plugins::{plugin_policy, plugin_tables};
pub use publisher::ScriptedPublisher;
pub use wal::{wal_config, wal_config_toml};

/// Runs `$body(TestDb)` once on Postgres and once on SQLite, as two tests.
macro_rules! on_both {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name($crate::support::TestDb::postgres().await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name($crate::support::TestDb::sqlite().await).await
            }
        }
    };
}
pub(crate) use on_both;
