//! The `[[consumers]]` of `outboxd run`: each one's handler (a registered
//! native handler, a file plugin or a registry plugin's rollout slot) and its
//! source (the embedded transport, a Kafka consumer group, statically
//! assigned Kafka partitions, NATS JetStream, RabbitMQ or Redis Streams).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{DaemonError, PipelineHandles};
use crate::broker::embedded::{EmbeddedConsumer, EmbeddedConsumerConfig};
use crate::broker::kafka::{GroupLag, KafkaConsumer, KafkaConsumerConfig, KafkaPublisher};
use crate::broker::{AnySource, MessageSource, Publisher};
use crate::config::{Config, ConsumerSection, TransportKind};
use crate::consumer::Consumer;
use crate::consumer::ConsumerConfig;
use crate::consumer::ConsumerHandler;
use crate::consumer::NativeHandlers;
use crate::consumer::PluginHandler;
use crate::consumer::dead_letter::DeadLetterTopic;
use crate::consumer::runner::OnHandled;
use crate::fault::Faults;
use crate::metrics::Metrics;
use crate::plugin::lifecycle::slot::ActiveConsumer;
use crate::plugin::metrics::PluginReport;
use crate::plugin::{ConsumerPlugin, PluginEngine};
use crate::settings::ConfigExt;
use crate::store::plugin_sql::roles::{PluginRoles, RoleCheckError};
use crate::store::{Channel, Db};

/// How long an idle embedded consumer waits for a publish notification
/// before it looks again anyway (and renews its leases).
const EMBEDDED_FETCH_WAIT: Duration = Duration::from_millis(500);

/// Where consumers' handlers come from: the binary's native handlers (and
/// its `on_handled` hook), and the rollout's slots for registry plugins.
pub(super) struct HandlerSources<'a> {
    pub daemon: &'a super::Daemon,
    pub registry: &'a [ActiveConsumer],
}

/// Spawns one task per configured consumer; they stop when `shutdown` turns
/// true.
pub(super) async fn spawn_consumers(
    set: &mut JoinSet<Result<(), String>>,
    config: &Config,
    db: &Db,
    faults: &Faults,
    sources: HandlerSources<'_>,
    handles: &mut PipelineHandles,
    shutdown: &watch::Receiver<bool>,
) -> Result<(), DaemonError> {
    let mut file_plugins = FilePlugins::default();
    if db.writes_in_parallel() && !config.consumers.is_empty() {
        tracing::info!(
            partitions = config.consumer_parallel_partitions(),
            max_connections = config.database.max_connections,
            "each consumer handles up to this many partitions at once (its share of database.max_connections)"
        );
    }
    for (i, c) in config.consumers.iter().enumerate() {
        // The database's wall around plugin SQL: refuse to start a plugin
        // consumer whose role could reach more than its tables.
        if let (Some(_), Some(roles)) = (c.plugin_name(), PluginRoles::of(db)) {
            roles.check(i, c).await.map_err(|e| match e {
                // Kept as a database error, so that start-up can tell a
                // lost connection from an unsafe role.
                RoleCheckError::Database(e) => DaemonError::Database(e),
                RoleCheckError::Refused(why) => DaemonError::Plugin(why),
            })?;
        }
        let handler = Arc::new(consumer_handler(
            config,
            (db, faults),
            &handles.metrics,
            (i, c),
            &sources.daemon.handlers,
            sources.registry,
            &mut file_plugins,
        )?);
        let consumer_cfg = ConsumerConfig {
            name: c.name.clone(),
            handler_id: handler.id(),
            batch_in_transaction: c.batch_in_transaction,
            max_attempts: c.max_attempts,
            on_dead: c.on_dead,
            max_parallel_partitions: config.consumer_parallel_partitions(),
            ..ConsumerConfig::default()
        };
        let consumer_metrics = handles.metrics.consumer(&c.name);
        // Each broker gives its source; one consumer loop runs any of them.
        let (source, dlq) = match config.transport.kind {
            TransportKind::Embedded => {
                let mut source = EmbeddedConsumer::new(
                    db.clone(),
                    EmbeddedConsumerConfig {
                        group: c.name.clone(),
                        topics: c.topics.clone(),
                        partitions: config.transport.partitions,
                        lease: config.transport.consumer_lease,
                    },
                );
                // An idle consumer waits for publishes instead of polling:
                // Postgres notifies at commit, and on SQLite the change
                // watcher ticks (polling stays the fallback).
                match db.listen(Channel::Transport).await {
                    Ok(Some(wake)) => source = source.with_wake(wake, EMBEDDED_FETCH_WAIT),
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(consumer = %c.name, error = %e, "cannot LISTEN for published messages; polling instead")
                    }
                }
                (AnySource::Embedded(source), None)
            }
            TransportKind::Nats => {
                let client = crate::broker::nats::connect(&config.transport.nats)
                    .await
                    .map_err(crate::broker::BrokerSetupError::from)?;
                let source = crate::broker::nats::NatsConsumer::new(
                    db.clone(),
                    client,
                    crate::broker::nats::NatsConsumerConfig {
                        group: c.name.clone(),
                        topics: c.topics.clone(),
                        partitions: config.transport.partitions,
                        lease: config.transport.consumer_lease,
                        ack_wait: config.transport.nats.ack_wait,
                        fetch_wait: config.transport.nats.fetch_wait,
                        batch: consumer_cfg.fetch_max,
                    },
                );
                (AnySource::Nats(source), None)
            }
            TransportKind::Rabbitmq => {
                let rabbit = &config.transport.rabbitmq;
                let source = crate::broker::rabbitmq::RabbitConsumer::new(
                    rabbit.clone(),
                    crate::broker::rabbitmq::RabbitConsumerConfig {
                        group: c.name.clone(),
                        topics: c.topics.clone(),
                        partitions: config.transport.partitions,
                        // No more unacknowledged deliveries than one fetch takes.
                        prefetch: rabbit
                            .prefetch
                            .min(u16::try_from(consumer_cfg.fetch_max).unwrap_or(u16::MAX)),
                        fetch_wait: rabbit.fetch_wait,
                    },
                );
                (AnySource::Rabbitmq(source), None)
            }
            TransportKind::Redis => {
                let redis = &config.transport.redis;
                let source = crate::broker::redis::RedisConsumer::new(
                    db.clone(),
                    crate::broker::redis::client(redis)
                        .map_err(crate::broker::BrokerSetupError::from)?,
                    crate::broker::redis::RedisConsumerConfig {
                        group: c.name.clone(),
                        topics: c.topics.clone(),
                        partitions: config.transport.partitions,
                        lease: config.transport.consumer_lease,
                        fetch_wait: redis.fetch_wait,
                        batch: redis.batch,
                    },
                );
                (AnySource::Redis(source), None)
            }
            TransportKind::Kafka => {
                // The consumer group is the consumer's name, as in the inbox.
                let mut kafka_cfg = KafkaConsumerConfig::new(c.name.clone(), c.topics.clone());
                kafka_cfg.stall_timeout = Some(c.kafka_stall_timeout);
                kafka_cfg.instance_id = c.instance_id.clone();
                let source = match &c.kafka_partitions {
                    // Static assignment: no group, offsets in the database.
                    Some(parts) => {
                        kafka_cfg.partitions = Some(parts.clone());
                        KafkaConsumer::assigned(&config.transport.kafka, kafka_cfg, db.clone())
                            .await?
                    }
                    None => KafkaConsumer::new(&config.transport.kafka, kafka_cfg)?
                        .with_metrics(consumer_metrics.clone()),
                };
                let dlq = Arc::new(KafkaPublisher::new(
                    &config.transport.kafka,
                    Duration::from_secs(10),
                )?);
                let to_dlq: DeadLetterTopic = Arc::new(move |m| {
                    let dlq = dlq.clone();
                    Box::pin(async move { dlq.publish(m).await })
                });
                (AnySource::Kafka(source), Some(to_dlq))
            }
        };
        let mut consumer = Consumer::new(db.clone(), source, handler, consumer_cfg)
            .with_faults(faults.clone())
            .with_metrics(consumer_metrics);
        if let Some(dlq) = dlq {
            consumer = consumer.with_dead_letter_topic(dlq);
        }
        run_consumer(
            set,
            handles,
            sources.daemon.on_handled.as_ref(),
            &c.name,
            consumer,
            shutdown,
        );
    }
    Ok(())
}

/// Runs `consumer` as a task until `shutdown`, then gives back what its
/// source holds of the group ([`MessageSource::release`]), whatever the
/// broker.
fn run_consumer<S: MessageSource + Send + Sync + 'static>(
    set: &mut JoinSet<Result<(), String>>,
    handles: &mut PipelineHandles,
    on_handled: Option<&OnHandled>,
    name: &str,
    mut consumer: Consumer<S, ConsumerHandler>,
    shutdown: &watch::Receiver<bool>,
) {
    if let Some(hook) = on_handled {
        consumer = consumer.with_on_handled(hook.clone());
    }
    handles
        .consumer_stats
        .push((name.to_string(), consumer.stats()));
    let shutdown = shutdown.clone();
    set.spawn(async move {
        let result = consumer.run(shutdown).await.map_err(|e| e.to_string());
        let _ = consumer.source_mut().release().await;
        result
    });
}

/// The file consumer plugins of this process: each loaded once, on an
/// engine created on first use, and shared by every consumer that names it,
/// so `/metrics` has one series per version.
#[derive(Default)]
struct FilePlugins {
    engine: Option<PluginEngine>,
    loaded: BTreeMap<String, Arc<ConsumerPlugin>>,
}

/// Resolves `consumers[].handler`: a native handler from the binary's
/// registry (`native`); a registry plugin gets its rollout slot
/// (`registry`), a file plugin is loaded here (once) and reported in
/// `metrics`.
fn consumer_handler(
    config: &Config,
    (db, faults): (&Db, &Faults),
    metrics: &Metrics,
    (i, c): (usize, &ConsumerSection),
    native: &NativeHandlers,
    registry: &[ActiveConsumer],
    files: &mut FilePlugins,
) -> Result<ConsumerHandler, DaemonError> {
    let name = match &c.handler {
        crate::config::HandlerRef::Plugin(name) => name.as_str(),
        crate::config::HandlerRef::Builtin(name) => {
            return native
                .get(&format!("consumers[{i}].handler"), name)
                .map(ConsumerHandler::Native)
                .map_err(DaemonError::Handler);
        }
    };
    if let Some(slot) = registry.iter().find(|s| s.name() == name) {
        return Ok(ConsumerHandler::Plugin(
            PluginHandler::swappable(slot.clone(), c.txn_policy())
                .with_db(db)
                .with_faults(faults.clone()),
        ));
    }
    let spec = config
        .plugins
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| DaemonError::Plugin(format!("no [[plugins]] entry is named `{name}`")))?;
    let plugin = match files.loaded.get(name) {
        Some(p) => p.clone(),
        None => {
            let engine = match &mut files.engine {
                Some(e) => e,
                None => files.engine.insert(
                    PluginEngine::new(config.plugin_engine_config())
                        .map_err(|e| DaemonError::Plugin(e.to_string()))?,
                ),
            };
            let plugin = Arc::new(
                ConsumerPlugin::load(engine, spec)
                    .map_err(|e| DaemonError::Plugin(e.to_string()))?,
            );
            metrics.register_plugins([plugin.clone() as Arc<dyn PluginReport>]);
            files.loaded.insert(name.to_string(), plugin.clone());
            plugin
        }
    };
    Ok(ConsumerHandler::Plugin(
        PluginHandler::new(plugin, c.txn_policy())
            .with_db(db)
            .with_faults(faults.clone()),
    ))
}

/// How far each Kafka consumer group is behind, for `/api/consumers`: one
/// reader per consumer in group mode (a consumer with assigned partitions
/// keeps its offsets in the database and joins no group). `None` when no
/// consumer has one.
pub(super) fn kafka_lag(config: &Config) -> Option<crate::admin::ConsumerLag> {
    let readers: Vec<(String, Arc<GroupLag>)> = config
        .consumers
        .iter()
        .filter(|c| c.kafka_partitions.is_none())
        .filter_map(|c| {
            GroupLag::new(&config.transport.kafka, c.name.clone(), c.topics.clone())
                .inspect_err(|e| tracing::warn!(consumer = %c.name, error = %e, "cannot read this consumer's lag; /api/consumers shows none"))
                .ok()
                .map(|r| (c.name.clone(), Arc::new(r)))
        })
        .collect();
    if readers.is_empty() {
        return None;
    }
    let readers = Arc::new(readers);
    Some(Arc::new(move || {
        let readers = readers.clone();
        Box::pin(async move {
            // librdkafka's calls block: off the async threads, each bounded.
            tokio::task::spawn_blocking(move || {
                readers
                    .iter()
                    .map(|(name, r)| (name.clone(), r.messages_behind(LAG_TIMEOUT)))
                    .collect()
            })
            .await
            .unwrap_or_default()
        })
    }))
}

/// How far each consumer is behind on NATS, for `/api/consumers`: per
/// partition, what its durable consumer has pending or unacknowledged. One
/// connection, made at the first read.
pub(super) fn nats_lag(config: &Config) -> Option<crate::admin::ConsumerLag> {
    let section = config.transport.nats.clone();
    let partitions = config.transport.partitions;
    let client = Arc::new(tokio::sync::OnceCell::new());
    broker_lag(config, "NATS", move |consumers| {
        let (section, client) = (section.clone(), client.clone());
        Box::pin(async move {
            let client = client
                .get_or_try_init(|| crate::broker::nats::connect(&section))
                .await
                .map_err(|e| e.to_string())?;
            let mut out = BTreeMap::new();
            for (name, topics) in consumers.iter() {
                let behind =
                    crate::broker::nats::messages_behind(client, name, topics, partitions).await;
                out.insert(name.clone(), behind);
            }
            Ok(out)
        })
    })
}

/// How many messages wait for each consumer on RabbitMQ, for
/// `/api/consumers`: the ready messages of its topics' partition queues
/// (its own unacknowledged prefetch not counted). A connection per read.
pub(super) fn rabbitmq_lag(config: &Config) -> Option<crate::admin::ConsumerLag> {
    let section = config.transport.rabbitmq.clone();
    let partitions = config.transport.partitions;
    broker_lag(config, "RabbitMQ", move |consumers| {
        let section = section.clone();
        Box::pin(async move {
            let conn = crate::broker::rabbitmq::connect(&section)
                .await
                .map_err(|e| e.to_string())?;
            let mut out = BTreeMap::new();
            for (name, topics) in consumers.iter() {
                let behind =
                    crate::broker::rabbitmq::messages_behind(&conn, topics, partitions).await;
                out.insert(name.clone(), behind);
            }
            let _ = conn.close(200, "lag read".into()).await;
            Ok(out)
        })
    })
}

/// How far each consumer is behind on Redis, for `/api/consumers`: per
/// partition's stream, its group's lag plus its pending entries. One
/// connection, made at the first read.
pub(super) fn redis_lag(config: &Config) -> Option<crate::admin::ConsumerLag> {
    let section = config.transport.redis.clone();
    let partitions = config.transport.partitions;
    let conn = Arc::new(tokio::sync::OnceCell::new());
    broker_lag(config, "Redis", move |consumers| {
        let (section, conn) = (section.clone(), conn.clone());
        Box::pin(async move {
            let mut conn = conn
                .get_or_try_init(|| async {
                    crate::broker::redis::client(&section)?
                        .connect(LAG_TIMEOUT)
                        .await
                })
                .await
                .map_err(|e| e.to_string())?
                .clone();
            let mut out = BTreeMap::new();
            for (name, topics) in consumers.iter() {
                let behind =
                    crate::broker::redis::messages_behind(&mut conn, name, topics, partitions)
                        .await;
                out.insert(name.clone(), behind);
            }
            Ok(out)
        })
    })
}

/// Every consumer's name and topics.
type ConsumerTopics = Arc<Vec<(String, Vec<String>)>>;
/// One read of every consumer's lag, or why the broker could not be read.
type LagRead =
    futures_util::future::BoxFuture<'static, Result<BTreeMap<String, Result<i64, String>>, String>>;

/// A lag reader over `read`, bounded in time; when the broker cannot be
/// read every consumer shows why. `None` without consumers.
fn broker_lag(
    config: &Config,
    broker: &'static str,
    read: impl Fn(ConsumerTopics) -> LagRead + Send + Sync + 'static,
) -> Option<crate::admin::ConsumerLag> {
    if config.consumers.is_empty() {
        return None;
    }
    let consumers: ConsumerTopics = Arc::new(
        config
            .consumers
            .iter()
            .map(|c| (c.name.clone(), c.topics.clone()))
            .collect(),
    );
    let read = Arc::new(read);
    Some(Arc::new(move || {
        let (consumers, read) = (consumers.clone(), read.clone());
        Box::pin(async move {
            let failed = |why: String| {
                consumers
                    .iter()
                    .map(|(n, _)| (n.clone(), Err(why.clone())))
                    .collect()
            };
            match tokio::time::timeout(LAG_TIMEOUT * 2, read(consumers.clone())).await {
                Ok(Ok(out)) => out,
                Ok(Err(e)) => failed(e),
                Err(_) => failed(format!("{broker} did not answer in time")),
            }
        })
    }))
}

/// How long one lag read waits for the broker, per call.
const LAG_TIMEOUT: Duration = Duration::from_secs(2);
