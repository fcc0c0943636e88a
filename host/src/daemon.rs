//! `outboxd run`: relay workers and consumers over one store and one
//! transport, until a shutdown signal.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::broker::Publisher;
use crate::broker::embedded::{EmbeddedConsumer, EmbeddedConsumerConfig, EmbeddedPublisher};
use crate::clock::SystemClock;
use crate::config::{Config, TransportKind};
use crate::consumer::{Consumer, ConsumerConfig, ConsumerStats};
use crate::domain::billing::{self, BillingHandler};
use crate::fault::Faults;
use crate::relay::worker::{self, WorkerConfig};
use crate::relay::{Chains, Relay, Router, build_chains};
use crate::store::postgres::{PgStore, listen_for_events};
use crate::store::sqlite::SqliteStore;
use crate::store::{Db, OutboxStore, migrate};

/// What a running pipeline exposes to its caller (the demo reads it).
#[derive(Default)]
pub struct PipelineHandles {
    pub consumer_stats: Vec<(String, Arc<ConsumerStats>)>,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Plugin(String),
    #[error("a worker stopped: {0}")]
    Worker(String),
}

/// Connects, migrates (when allowed) and runs until `shutdown` turns true.
pub async fn run(
    config: Config,
    faults: Faults,
    shutdown: watch::Receiver<bool>,
) -> Result<(), DaemonError> {
    let db = Db::connect(&config.database.url, config.database.max_connections).await?;
    if config.database.migrate_on_start {
        let report = migrate(&db).await?;
        if !report.applied.is_empty() {
            tracing::info!(applied = ?report.applied, "migrations applied");
        }
    }
    let (set, _handles) = spawn_pipeline(&config, &db, faults, shutdown).await?;
    let result = join_all_workers(set).await;
    db.close().await;
    result
}

/// Waits for every task; the first failure is returned after all stop.
pub async fn join_all_workers(mut set: JoinSet<Result<(), String>>) -> Result<(), DaemonError> {
    let mut first_error = None;
    while let Some(joined) = set.join_next().await {
        let outcome = joined.map_err(|e| e.to_string()).and_then(|r| r);
        if let Err(e) = outcome {
            tracing::error!(error = %e, "worker stopped with an error");
            first_error.get_or_insert(e);
        }
    }
    match first_error {
        Some(e) => Err(DaemonError::Worker(e)),
        None => Ok(()),
    }
}

/// Spawns relay workers and consumers; they stop when `shutdown` turns true.
pub async fn spawn_pipeline(
    config: &Config,
    db: &Db,
    faults: Faults,
    shutdown: watch::Receiver<bool>,
) -> Result<(JoinSet<Result<(), String>>, PipelineHandles), DaemonError> {
    let mut set = JoinSet::new();
    let mut handles = PipelineHandles::default();
    if config.transport.kind == TransportKind::Kafka {
        return Err(DaemonError::Unsupported(
            "transport.kind = \"kafka\" is not available in this build yet; use \"embedded\""
                .into(),
        ));
    }
    let publisher = Arc::new(EmbeddedPublisher::new(
        db.clone(),
        config.transport.partitions,
    ));
    let parts = RelayParts {
        faults: faults.clone(),
        chains: load_chains(config)?,
    };
    match db {
        Db::Postgres(pool) => {
            let wake = listen_for_events(pool).await.ok();
            spawn_relays(
                &mut set,
                config,
                PgStore::new(pool.clone()),
                publisher,
                wake,
                &parts,
                shutdown.clone(),
            );
        }
        Db::Sqlite(pool) => {
            let store =
                SqliteStore::new(pool.clone(), Duration::from_millis(config.relay.lease_ms));
            spawn_relays(
                &mut set,
                config,
                store,
                publisher,
                None,
                &parts,
                shutdown.clone(),
            );
        }
    }
    for c in &config.consumers {
        billing::create_schema(db).await?;
        let source = EmbeddedConsumer::new(
            db.clone(),
            EmbeddedConsumerConfig {
                group: c.name.clone(),
                topics: c.topics.clone(),
                partitions: config.transport.partitions,
                lease: Duration::from_secs(15),
            },
        );
        let mut consumer = Consumer::new(
            db.clone(),
            source,
            Arc::new(BillingHandler),
            ConsumerConfig {
                name: c.name.clone(),
                ..ConsumerConfig::default()
            },
        )
        .with_faults(faults.clone());
        handles
            .consumer_stats
            .push((c.name.clone(), consumer.stats()));
        let shutdown = shutdown.clone();
        set.spawn(async move {
            let result = consumer.run(shutdown).await.map_err(|e| e.to_string());
            let _ = consumer.source_mut().release().await;
            result
        });
    }
    Ok((set, handles))
}

/// What every relay task of the process shares besides store and publisher.
struct RelayParts {
    faults: Faults,
    chains: Chains,
}

/// Loads the transformer plugins the routes name; none loaded means no
/// engine is created at all.
fn load_chains(config: &Config) -> Result<Chains, DaemonError> {
    if config.routes.iter().all(|r| r.transformers.is_empty()) {
        return Ok(Chains::default());
    }
    let engine = crate::plugin::PluginEngine::new(config.plugin_engine_config())
        .map_err(|e| DaemonError::Plugin(e.to_string()))?;
    build_chains(&engine, &config.plugins, &config.routes).map_err(DaemonError::Plugin)
}

fn spawn_relays<S: OutboxStore, P: Publisher + Clone>(
    set: &mut JoinSet<Result<(), String>>,
    config: &Config,
    store: S,
    publisher: P,
    wake: Option<watch::Receiver<u64>>,
    parts: &RelayParts,
    shutdown: watch::Receiver<bool>,
) {
    let RelayParts { faults, chains } = parts;
    let router = Router::new(config.routes.clone());
    let chains = chains.clone();
    let worker_cfg = WorkerConfig {
        poll_interval: Duration::from_millis(config.relay.poll_interval_ms),
        ..WorkerConfig::default()
    };
    for _ in 0..config.relay.workers {
        let relay = Relay::new(
            store.clone(),
            publisher.clone(),
            router.clone(),
            config.relay_config(),
            Arc::new(SystemClock),
        )
        .with_faults(faults.clone())
        .with_chains(chains.clone());
        let wake = wake.clone();
        let shutdown = shutdown.clone();
        let worker_cfg = worker_cfg.clone();
        set.spawn(async move {
            worker::run(&relay, &worker_cfg, wake, shutdown)
                .await
                .map_err(|e| e.to_string())
        });
    }
}
