//! The relay workers of `outboxd run`, over the store that matches the
//! database and the configured publisher.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::broker::Publisher;
use crate::clock::SystemClock;
use crate::config::{Config, ConfigExt};
use crate::fault::Faults;
use crate::metrics::Metrics;
use crate::relay::worker::{self, WorkerConfig};
use crate::relay::{Chains, Relay, Router};
use crate::store::{AnyStore, Channel, Db, OutboxStore};

/// Spawns the relay workers over the store that matches `db`.
#[allow(clippy::too_many_arguments)] // Distinct handles; a struct would only rename them.
pub(super) async fn spawn_relays_for<P: Publisher + Clone>(
    set: &mut JoinSet<Result<(), String>>,
    config: &Config,
    db: &Db,
    publisher: P,
    faults: &Faults,
    chains: &Chains,
    metrics: &Arc<Metrics>,
    shutdown: &watch::Receiver<bool>,
) {
    if config.relay.workers == 0 {
        tracing::info!("relay.workers = 0: this process only consumes");
        return;
    }
    // Without a wake-up the relays poll: a failed LISTEN is no reason not
    // to start.
    let wake = db.listen(Channel::Outbox).await.ok().flatten();
    spawn_relays(
        set,
        config,
        AnyStore::new(db, config.relay.lease),
        publisher,
        wake,
        (faults.clone(), chains.clone()),
        metrics.clone(),
        shutdown.clone(),
    );
}

#[allow(clippy::too_many_arguments)] // Each argument is a distinct handle; a struct would only rename them.
fn spawn_relays<S: OutboxStore, P: Publisher + Clone>(
    set: &mut JoinSet<Result<(), String>>,
    config: &Config,
    store: S,
    publisher: P,
    wake: Option<watch::Receiver<u64>>,
    (faults, chains): (Faults, Chains),
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) {
    let router = Router::new(config.routes.clone());
    let worker_cfg = WorkerConfig {
        poll_interval: config.relay.poll_interval,
        pipeline: config.relay.pipeline,
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
        .with_metrics(metrics.clone())
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
