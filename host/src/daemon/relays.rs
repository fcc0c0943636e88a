//! The relay workers of `outboxd run`, over the store that matches the
//! database and the configured publisher.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::broker::Publisher;
use crate::clock::SystemClock;
use crate::config::Config;
use crate::config::RelaySource;
use crate::fault::Faults;
use crate::metrics::Metrics;
use crate::plugin::lifecycle::chains::Chains;
use crate::relay::Relay;
use crate::relay::wal::{WalParts, WalRelay};
use crate::relay::worker::{self, WorkerConfig};
use crate::route::Router;
use crate::settings::ConfigExt;
use crate::store::outbox::wal::{self as wal_store, HandedStore, WalFeed};
use crate::store::{AnyStore, Channel, Db, OutboxStore};

/// Spawns the relay workers over the store that matches `db`, or, with
/// `relay.source = "wal"`, the process's WAL reader (after creating or
/// checking its slot and publication: a setup problem stops the start).
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
) -> Result<(), super::DaemonError> {
    if config.relay.workers == 0 {
        tracing::info!("relay.workers = 0: this process only consumes");
        return Ok(());
    }
    // Without a wake-up the relays poll: a failed LISTEN is no reason not
    // to start.
    let wake = db.listen(Channel::Outbox).await.ok().flatten();
    if config.relay.source == RelaySource::Wal {
        let report = wal_store::ensure(db, &config.relay.wal).await?;
        if report.created_publication || report.created_slot {
            tracing::info!(slot = %config.relay.wal.slot, publication = %config.relay.wal.publication, ?report, "WAL relay: created what was missing");
        }
        let wal = wal_relay(config, db, publisher, wake, faults, chains, metrics)?;
        let shutdown = shutdown.clone();
        set.spawn(async move { wal.run(shutdown).await });
        return Ok(());
    }
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
    Ok(())
}

/// The WAL reader of this process: relays over the stream, over the
/// aggregates it hands to polling, and over the whole outbox for a
/// fallback, each with the process's router, chains, faults and metrics.
fn wal_relay<P: Publisher + Clone>(
    config: &Config,
    db: &Db,
    publisher: P,
    wake: Option<watch::Receiver<u64>>,
    faults: &Faults,
    chains: &Chains,
    metrics: &Arc<Metrics>,
) -> Result<WalRelay<P>, super::DaemonError> {
    let router = Router::new(config.routes.clone());
    let parts = (&publisher, &router, faults, chains, metrics);
    let feed = WalFeed::new(db)?;
    let handed_store = HandedStore::new(&feed);
    let fallback = (0..config.relay.workers)
        .map(|_| relay_over(config, parts, AnyStore::new(db, config.relay.lease)))
        .collect();
    WalRelay::new(WalParts {
        database_url: config.database.url.clone(),
        wal: config.relay.wal.clone(),
        batch_size: config.relay.batch_size,
        poll_interval: config.relay.poll_interval,
        pipeline: config.relay.pipeline,
        relay: relay_over(config, parts, feed.clone()),
        handed_relay: relay_over(config, parts, handed_store.clone()),
        feed,
        handed_store,
        fallback,
        fallback_worker: WorkerConfig {
            poll_interval: config.relay.poll_interval,
            pipeline: config.relay.pipeline,
            ..WorkerConfig::default()
        },
        wake,
        metrics: metrics.wal.clone(),
        faults: faults.clone(),
    })
    .map_err(super::DaemonError::WalRelay)
}

type RelayParts<'a, P> = (&'a P, &'a Router, &'a Faults, &'a Chains, &'a Arc<Metrics>);

/// A relay over `store` with the process's router, config, chains, faults
/// and metrics.
fn relay_over<S: OutboxStore, P: Publisher + Clone>(
    config: &Config,
    (publisher, router, faults, chains, metrics): RelayParts<'_, P>,
    store: S,
) -> Relay<S, P> {
    Relay::new(
        store,
        publisher.clone(),
        router.clone(),
        config.relay_config(),
        Arc::new(SystemClock),
    )
    .with_faults(faults.clone())
    .with_metrics(metrics.relay.clone())
    .with_chains(chains.clone())
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
        let relay = relay_over(
            config,
            (&publisher, &router, &faults, &chains, &metrics),
            store.clone(),
        );
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
