//! `outboxd run`: relay workers and consumers over one store and one
//! transport, until a shutdown signal.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

mod consumers;
mod relays;

use relays::spawn_relays_for;

use crate::broker::AnyPublisher;
use crate::broker::kafka::KafkaSetupError;
use crate::config::{Config, TransportKind};
use crate::consumer::ConsumerStats;
use crate::consumer::Handler;
use crate::consumer::NativeHandlers;
use crate::consumer::runner::OnHandled;
use crate::fault::Faults;
use crate::metrics::Metrics;
use crate::plugin::lifecycle::chains::Chains;
use crate::plugin::lifecycle::chains::build_chains;
use crate::plugin::lifecycle::slot::ActiveConsumer;
use crate::settings::ConfigExt;
use crate::store::{AnyStore, Db, migrate};

/// What a running pipeline exposes to its caller (examples and tests read it).
#[derive(Default)]
pub struct PipelineHandles {
    pub consumer_stats: Vec<(String, Arc<ConsumerStats>)>,
    pub metrics: Arc<Metrics>,
    /// Where the admin API listens, when enabled.
    pub admin_addr: Option<std::net::SocketAddr>,
    /// Where the metrics listener (the probes and `/metrics`, no token)
    /// listens, when `metrics.listen` is set.
    pub metrics_addr: Option<std::net::SocketAddr>,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("a worker stopped: {0}")]
    Worker(String),
    #[error(transparent)]
    Admin(#[from] crate::admin::AdminError),
    #[error(transparent)]
    Kafka(#[from] KafkaSetupError),
    /// A broker other than Kafka could not be set up; Kafka's own
    /// errors stay [`DaemonError::Kafka`] (see the `From` below).
    #[error(transparent)]
    Broker(crate::broker::BrokerSetupError),
    #[error(transparent)]
    Wal(#[from] crate::store::outbox::wal::WalSetupError),
    #[error(transparent)]
    Webhook(#[from] crate::broker::webhook::WebhookSetupError),
    #[error("{0}")]
    WalRelay(String),
    #[error("{0}")]
    Plugin(String),
    /// A `builtin:NAME` consumer whose name this binary did not register.
    #[error("{0}")]
    Handler(String),
}

impl From<crate::broker::BrokerSetupError> for DaemonError {
    fn from(e: crate::broker::BrokerSetupError) -> Self {
        match e {
            crate::broker::BrokerSetupError::Kafka(k) => DaemonError::Kafka(k),
            other => DaemonError::Broker(other),
        }
    }
}

impl DaemonError {
    /// Whether starting again may succeed: the database was briefly
    /// unavailable, the configuration is not at fault.
    pub fn is_transient(&self) -> bool {
        use crate::store::{StoreError, backend::problem::transient};
        match self {
            DaemonError::Database(e)
            | DaemonError::Store(StoreError::Database(e))
            | DaemonError::Store(StoreError::Migration { source: e, .. }) => transient(e),
            DaemonError::Kafka(e) => e.is_transient(),
            DaemonError::Broker(e) => e.is_transient(),
            _ => false,
        }
    }
}

/// How long `outboxd run` keeps trying to start while the database does
/// not answer or fails with transient errors.
pub const START_RETRY_WINDOW: Duration = Duration::from_secs(60);

/// A first connection that failed because the database did not answer in
/// time or is briefly unable to take it (57P03 starting up, 53300 too many
/// connections). A refused connection, an unknown host or wrong credentials
/// is the configuration's fault and is not retried.
fn unanswered(e: &crate::store::StoreError) -> bool {
    use crate::store::StoreError;
    match e {
        StoreError::Database(sqlx::Error::PoolTimedOut) => true,
        StoreError::Database(sqlx::Error::Database(db)) => {
            matches!(db.code().as_deref(), Some("57P03" | "53300"))
        }
        _ => false,
    }
}

/// Waits `delay` (or until shutdown), then doubles it up to 5 s.
async fn backoff(shutdown: &watch::Receiver<bool>, delay: &mut Duration) {
    let mut stop = shutdown.clone();
    tokio::select! {
        _ = tokio::time::sleep(*delay) => {}
        _ = stop.changed() => {}
    }
    *delay = (*delay * 2).min(Duration::from_secs(5));
}

/// `outboxd run` as a library: the pipeline a [`Config`] describes, with
/// the native handlers its `builtin:NAME` consumers may name.
///
/// ```no_run
/// # use outboxd::consumer::{Handler, HandlerError, InboxTx};
/// # use outboxd::broker::Delivery;
/// struct Audit;
/// impl Handler for Audit {
///     async fn handle(&self, _tx: &mut InboxTx, _d: &Delivery) -> Result<(), HandlerError> {
///         Ok(())
///     }
/// }
/// let daemon = outboxd::daemon::Daemon::builder().handler("audit", Audit).build();
/// # let _ = daemon;
/// ```
#[derive(Clone, Default)]
pub struct Daemon {
    handlers: NativeHandlers,
    on_handled: Option<OnHandled>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("handlers", &self.handlers)
            .field("on_handled", &self.on_handled.is_some())
            .finish()
    }
}

/// Builds a [`Daemon`]: `Daemon::builder().handler("billing", BillingHandler).build()`.
#[derive(Default)]
pub struct DaemonBuilder {
    daemon: Daemon,
}

impl std::fmt::Debug for DaemonBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.daemon.fmt(f)
    }
}

impl DaemonBuilder {
    /// Registers `handler` for the consumers whose `handler = "builtin:NAME"`.
    pub fn handler(mut self, name: impl Into<String>, handler: impl Handler) -> Self {
        self.daemon.handlers.register(name, handler);
        self
    }

    /// Calls `hook` with every message a consumer's effect committed, on
    /// every consumer: how the example and the benchmarks measure commit
    /// latency around the product.
    pub fn on_handled(mut self, hook: OnHandled) -> Self {
        self.daemon.on_handled = Some(hook);
        self
    }

    pub fn build(self) -> Daemon {
        self.daemon
    }
}

impl Daemon {
    pub fn builder() -> DaemonBuilder {
        DaemonBuilder::default()
    }

    /// Connects, migrates (when allowed) and runs until `shutdown` turns true.
    ///
    /// A database that refuses the connection, cannot be resolved or
    /// rejects the credentials is not waited for: the run fails with that
    /// error (a refusal once the pool's 10 s acquire timeout has passed).
    /// One that does not answer in time (a network partition, a server
    /// still starting or out of connections) is tried again, and once it has
    /// answered, a transient database error while starting (a connection
    /// terminated by the server or lost on the network, a pool that timed
    /// out) does not end the process either: what was started is stopped and
    /// the start is tried again. Both retry for up to [`START_RETRY_WINDOW`]
    /// from the first attempt, with backoff from 250 ms to 5 s.
    pub async fn run(
        &self,
        config: Config,
        faults: Faults,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), DaemonError> {
        let first_try = std::time::Instant::now();
        let mut delay = Duration::from_millis(250);
        let db = loop {
            let connected = Db::connect_with(
                &config.database.url,
                config.database.max_connections,
                config.database.sqlite_synchronous,
            )
            .await;
            let e = match connected {
                Ok(db) => break db,
                Err(e) => e,
            };
            let left = START_RETRY_WINDOW.saturating_sub(first_try.elapsed());
            if !unanswered(&e) || left.is_zero() || *shutdown.borrow() {
                return Err(e.into());
            }
            tracing::warn!(error = %e, retry_in = ?delay, gives_up_in = ?left,
                "outboxd could not connect: the database did not answer (a network partition, or a server starting or out of connections); connecting again");
            backoff(&shutdown, &mut delay).await;
        };
        let set = loop {
            let mut set = JoinSet::new();
            let attempt = self.start(&config, &db, &faults, &shutdown, &mut set).await;
            let e = match attempt {
                Ok(()) => break set,
                Err(e) => e,
            };
            set.shutdown().await;
            let left = START_RETRY_WINDOW.saturating_sub(first_try.elapsed());
            if !e.is_transient() || left.is_zero() || *shutdown.borrow() {
                db.close().await;
                return Err(e);
            }
            tracing::warn!(error = %e, retry_in = ?delay, gives_up_in = ?left,
                "outboxd could not start: the database or the broker was briefly unavailable; starting again");
            backoff(&shutdown, &mut delay).await;
        };
        let result = join_all_workers(set).await;
        db.close().await;
        result
    }

    /// One attempt at starting: the migrations (when allowed), then every
    /// worker, spawned into `set`.
    async fn start(
        &self,
        config: &Config,
        db: &Db,
        faults: &Faults,
        shutdown: &watch::Receiver<bool>,
        set: &mut JoinSet<Result<(), String>>,
    ) -> Result<(), DaemonError> {
        if config.database.migrate_on_start {
            let report = migrate(db).await?;
            if !report.applied.is_empty() {
                tracing::info!(applied = ?report.applied, "migrations applied");
            }
        }
        spawn_pipeline(set, config, db, faults.clone(), self, shutdown.clone()).await?;
        Ok(())
    }

    /// Spawns relay workers and consumers; they stop when `shutdown` turns true.
    pub async fn spawn_pipeline(
        &self,
        config: &Config,
        db: &Db,
        faults: Faults,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(JoinSet<Result<(), String>>, PipelineHandles), DaemonError> {
        let mut set = JoinSet::new();
        let handles = spawn_pipeline(&mut set, config, db, faults, self, shutdown).await?;
        Ok((set, handles))
    }
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

/// Every topic the routes publish to and the consumers read (a webhook
/// route's own destination is not a topic; the topics its transformers may
/// also send to are).
fn broker_topics(config: &Config) -> std::collections::BTreeSet<String> {
    config
        .routes
        .iter()
        .flat_map(|r| {
            std::iter::once(&r.topic)
                .filter(|_| r.webhook.is_none())
                .chain(&r.allowed_topics)
        })
        .chain(config.consumers.iter().flat_map(|c| &c.topics))
        .cloned()
        .collect()
}

async fn spawn_pipeline(
    set: &mut JoinSet<Result<(), String>>,
    config: &Config,
    db: &Db,
    faults: Faults,
    daemon: &Daemon,
    shutdown: watch::Receiver<bool>,
) -> Result<PipelineHandles, DaemonError> {
    // The broker's login and topology first: a missing topic, stream or
    // queue stops the start before anything else runs.
    let publisher = AnyPublisher::start(
        config,
        db,
        &broker_topics(config),
        config.relay.publish_timeout,
    )
    .await?;
    let mut handles = PipelineHandles::default();
    let metrics = handles.metrics.clone();
    // Whoever loads a plugin version reports it: the rollout each registry
    // version it loads, the static chains here, the consumers their file
    // plugins.
    let (chains, registry_consumers) =
        match start_rollout(config, db, &metrics, set, &shutdown).await? {
            Some(started) => started,
            None => {
                let chains = load_chains(config)?;
                metrics.register_plugins(
                    chains
                        .plugins()
                        .into_iter()
                        .map(|p| p as Arc<dyn crate::plugin::metrics::PluginReport>),
                );
                (chains, Vec::new())
            }
        };
    let broker_check: Option<crate::admin::BrokerCheck> = match &publisher {
        AnyPublisher::Embedded(_) => None,
        other => {
            let checker = other.clone();
            Some(Arc::new(move || {
                let checker = checker.clone();
                Box::pin(async move { checker.check().await.unwrap_or(Ok(())) })
            }))
        }
    };
    // Webhook routes go to their endpoints, everything else to the broker.
    let sinks = crate::broker::webhook::Sinks::start(
        Arc::new(publisher),
        &config.routes,
        db,
        &metrics.webhooks,
    )
    .await?;
    spawn_relays_for(
        set, config, db, sinks, &faults, &chains, &metrics, &shutdown,
    )
    .await?;
    spawn_jobs(set, config, db, metrics.clone(), shutdown.clone());
    let probes = crate::admin::Probes::new(db.clone(), metrics.clone(), broker_check);
    if let Some(listen) = &config.metrics.listen {
        let (addr, serve) =
            crate::admin::bind_metrics(listen, probes.clone(), shutdown.clone()).await?;
        tracing::info!(%addr, "probes and metrics listening (no token)");
        handles.metrics_addr = Some(addr);
        set.spawn(async move { serve.await.map_err(|e| e.to_string()) });
    }
    if config.admin.enabled {
        let history = Arc::new(crate::admin::History::default());
        let state = crate::admin::AdminState {
            db: db.clone(),
            token: config.admin.token.clone().unwrap_or_default().into(),
            metrics_token: config.admin.metrics_token.as_deref().map(Arc::from),
            metrics: metrics.clone(),
            history: history.clone(),
            probes,
            consumer_lag: match config.transport.kind {
                TransportKind::Kafka => consumers::kafka_lag(config),
                TransportKind::Nats => consumers::nats_lag(config),
                TransportKind::Rabbitmq => consumers::rabbitmq_lag(config),
                TransportKind::Redis => consumers::redis_lag(config),
                TransportKind::Embedded => None,
            },
            routes: Arc::new(config.routes.clone()),
            plugins: Arc::new(config.plugins.clone()),
            consumers: Arc::new(
                config
                    .consumers
                    .iter()
                    .map(|c| (c.name.clone(), c.plugin_name().map(str::to_string)))
                    .collect(),
            ),
        };
        let (addr, serve) =
            crate::admin::bind(&config.admin.listen, state, shutdown.clone()).await?;
        tracing::info!(%addr, "admin API and dashboard listening");
        handles.admin_addr = Some(addr);
        set.spawn(async move { serve.await.map_err(|e| e.to_string()) });
        let store = AnyStore::new(db, config.relay.lease);
        let every = Duration::from_secs(config.admin.sample_seconds.max(1));
        let stop = shutdown.clone();
        let sampler_metrics = metrics.clone();
        let slot = (config.relay.source == crate::config::RelaySource::Wal).then(|| {
            crate::admin::SlotSampler {
                db: db.clone(),
                slot: config.relay.wal.slot.clone(),
            }
        });
        set.spawn(async move {
            crate::admin::run_sampler(store, history, sampler_metrics, every, slot, stop).await;
            Ok(())
        });
    }
    consumers::spawn_consumers(
        set,
        config,
        db,
        &faults,
        consumers::HandlerSources {
            daemon,
            registry: &registry_consumers,
        },
        &mut handles,
        &shutdown,
    )
    .await?;
    Ok(handles)
}

/// Builds every route's transformer chain; no engine when no route has one.
fn load_chains(config: &Config) -> Result<Chains, DaemonError> {
    if config.routes.iter().all(|r| r.transformers.is_empty()) {
        return Ok(Chains::default());
    }
    let engine = crate::plugin::PluginEngine::new(config.plugin_engine_config())
        .map_err(|e| DaemonError::Plugin(e.to_string()))?;
    build_chains(&engine, &config.plugins, &config.routes).map_err(DaemonError::Plugin)
}

/// When a route or a consumer names a `source = "registry"` plugin (or
/// `watch_dir` is set), loads the registry's active versions and keeps them
/// current: the relay's chains and one slot per registry consumer plugin.
/// `None` leaves the static file chains to [`load_chains`].
async fn start_rollout(
    config: &Config,
    db: &Db,
    metrics: &Arc<Metrics>,
    set: &mut JoinSet<Result<(), String>>,
    shutdown: &watch::Receiver<bool>,
) -> Result<Option<(Chains, Vec<ActiveConsumer>)>, DaemonError> {
    use crate::config::PluginSource;
    use crate::plugin::Registry;
    let runtime = &config.plugin_runtime;
    let registry_plugin = |name: &str| {
        config
            .plugins
            .iter()
            .any(|p| p.name == name && p.source == PluginSource::Registry)
    };
    let in_routes = config
        .routes
        .iter()
        .flat_map(|r| &r.transformers)
        .any(|t| registry_plugin(t));
    let consumer_plugins: Vec<String> = config
        .consumers
        .iter()
        .filter_map(|c| c.plugin_name())
        .filter(|name| registry_plugin(name))
        .map(String::from)
        .collect();
    if !in_routes && consumer_plugins.is_empty() && runtime.watch_dir.is_none() {
        return Ok(None);
    }
    let engine = crate::plugin::PluginEngine::new(config.plugin_engine_config())
        .map_err(|e| DaemonError::Plugin(e.to_string()))?;
    let registry = Registry::new(db.clone());
    if let Some(dir) = runtime.watch_dir.clone() {
        let mut seen = Default::default();
        crate::plugin::lifecycle::dev_dir::scan(
            &engine,
            &registry,
            &config.plugins,
            &dir,
            &mut seen,
        )
        .await;
        let watch = crate::plugin::lifecycle::dev_dir::run(
            engine.clone(),
            registry.clone(),
            config.plugins.clone(),
            dir,
            runtime.registry_poll_every(),
            shutdown.clone(),
        );
        set.spawn(async move {
            watch.await;
            Ok(())
        });
    }
    let rollout = crate::plugin::lifecycle::rollout::Rollout::new(
        engine,
        registry,
        config.plugins.clone(),
        config.routes.clone(),
    )
    .map_err(DaemonError::Plugin)?
    .with_consumers(consumer_plugins.iter().cloned())
    .with_metrics(metrics.plugin_versions());
    rollout.refresh().await.map_err(|e| match e {
        // Kept as a database error, so that start-up can tell a lost
        // connection from a refused plugin.
        crate::plugin::RegistryError::Database(e) => DaemonError::Database(e),
        e => DaemonError::Plugin(e.to_string()),
    })?;
    let chains = rollout.chains();
    let slots = consumer_plugins
        .iter()
        .filter_map(|name| rollout.consumer(name))
        .collect();
    let (poll, stop) = (runtime.registry_poll_every(), shutdown.clone());
    set.spawn(async move {
        rollout.run(poll, stop).await;
        Ok(())
    });
    Ok(Some((chains, slots)))
}

/// Retention and reconciliation on their schedules.
fn spawn_jobs(
    set: &mut JoinSet<Result<(), String>>,
    config: &Config,
    db: &Db,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) {
    let retention = config.retention.clone();
    let (db1, m1, mut stop) = (db.clone(), metrics.clone(), shutdown.clone());
    set.spawn(async move {
        let every = Duration::from_secs(retention.interval_seconds.max(1));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.changed() => {}
            }
            if *stop.borrow() {
                return Ok(());
            }
            match crate::ops::retention::cleanup(&db1, &retention, chrono::Utc::now()).await {
                Ok(r) => {
                    for (table, n) in [
                        ("outbox", r.outbox_deleted),
                        ("inbox", r.inbox_deleted),
                        ("transport", r.transport_deleted),
                    ] {
                        m1.retention_deleted.add(table, n);
                    }
                    tracing::info!(?r, "retention run finished");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "retention run failed; will retry on schedule")
                }
            }
        }
    });
    if config.admin.reconcile_interval_seconds > 0 && !config.reconcile.is_empty() {
        let rules = config.reconcile.clone();
        let every = Duration::from_secs(config.admin.reconcile_interval_seconds);
        let (db2, mut stop) = (db.clone(), shutdown);
        set.spawn(async move {
            loop {
                for rule in &rules {
                    match crate::ops::reconcile::run_rule(&db2, rule, false).await {
                        Ok(r) => {
                            metrics.set_reconcile_missing(&r.name, r.missing as u64);
                            if r.missing > 0 {
                                tracing::warn!(rule = %r.name, missing = r.missing, samples = ?r.samples, "reconciliation found business rows without their event");
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "reconciliation failed"),
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = stop.changed() => {}
                }
                if *stop.borrow() {
                    return Ok(());
                }
            }
        });
    }
}
