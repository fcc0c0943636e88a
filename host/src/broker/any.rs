//! The configured broker, chosen once from `[transport] kind`: the one
//! place that lists the brokers, so the daemon, the demo and the tools hold
//! an [`AnyPublisher`] and never match on the kind themselves.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::embedded::EmbeddedPublisher;
use super::kafka::{KafkaPublisher, KafkaSetupError};
use super::nats::{NatsPublisher, NatsSetupError};
use super::rabbitmq::{RabbitPublisher, RabbitSetupError};
use super::redis::{RedisPublisher, RedisSetupError};
use super::{PublishError, Publisher};
use crate::config::{Config, TransportKind};
use crate::message::OutgoingMessage;
use crate::store::Db;

/// Why the configured broker could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BrokerSetupError {
    #[error(transparent)]
    Kafka(#[from] KafkaSetupError),
    #[error(transparent)]
    Nats(#[from] NatsSetupError),
    #[error(transparent)]
    Rabbitmq(#[from] RabbitSetupError),
    #[error(transparent)]
    Redis(#[from] RedisSetupError),
}

impl BrokerSetupError {
    /// Whether a start should be tried again (the broker did not answer).
    pub fn is_transient(&self) -> bool {
        match self {
            BrokerSetupError::Kafka(e) => e.is_transient(),
            BrokerSetupError::Nats(e) => e.is_transient(),
            BrokerSetupError::Rabbitmq(e) => e.is_transient(),
            BrokerSetupError::Redis(e) => e.is_transient(),
        }
    }
}

/// The publisher of `[transport] kind`.
#[derive(Clone)]
pub enum AnyPublisher {
    Embedded(EmbeddedPublisher),
    Kafka(Arc<KafkaPublisher>),
    Nats(NatsPublisher),
    Rabbitmq(Arc<RabbitPublisher>),
    Redis(RedisPublisher),
}

/// How long one start attempt waits for a Kafka broker to answer.
const KAFKA_START_WAIT: Duration = Duration::from_secs(10);

impl AnyPublisher {
    /// Connects the configured broker's publisher; `ack_timeout` bounds
    /// the wait for one acknowledgement.
    pub async fn connect(
        config: &Config,
        db: &Db,
        ack_timeout: Duration,
    ) -> Result<Self, BrokerSetupError> {
        Ok(match config.transport.kind {
            TransportKind::Embedded => AnyPublisher::Embedded(EmbeddedPublisher::new(
                db.clone(),
                config.transport.partitions,
            )),
            TransportKind::Kafka => AnyPublisher::Kafka(Arc::new(KafkaPublisher::new(
                &config.transport.kafka,
                ack_timeout,
            )?)),
            TransportKind::Nats => AnyPublisher::Nats(NatsPublisher::new(
                super::nats::connect(&config.transport.nats).await?,
                config.transport.partitions,
                ack_timeout,
            )),
            TransportKind::Rabbitmq => AnyPublisher::Rabbitmq(Arc::new(
                RabbitPublisher::new(
                    &config.transport.rabbitmq,
                    None,
                    config.transport.partitions,
                    ack_timeout,
                )
                .await?,
            )),
            TransportKind::Redis => AnyPublisher::Redis(
                RedisPublisher::new(
                    &super::redis::client(&config.transport.redis)?,
                    config.transport.partitions,
                    config.transport.redis.maxlen,
                    ack_timeout,
                )
                .await?,
            ),
        })
    }

    /// What `outboxd run` does before it publishes: checks that the broker
    /// takes the login and has what `topics` need (Kafka topics, NATS
    /// streams, RabbitMQ exchanges and partition queues, Redis partition
    /// streams), creating what is
    /// missing when `[transport.topics] create = true`, then connects the
    /// publisher. `publish_timeout` bounds one acknowledgement.
    pub async fn start(
        config: &Config,
        db: &Db,
        topics: &BTreeSet<String>,
        publish_timeout: Duration,
    ) -> Result<Self, BrokerSetupError> {
        let t = &config.transport;
        let replicas = t
            .topics
            .create
            .then(|| usize::try_from(t.topics.replication.unwrap_or(1)).unwrap_or(1));
        Ok(match t.kind {
            TransportKind::Kafka => {
                super::kafka::check_at_start(
                    &t.kafka,
                    topics,
                    t.topics.new_topics(),
                    KAFKA_START_WAIT,
                )
                .await?;
                tracing::info!(properties = ?config.redacted_kafka(), "publishing to kafka");
                // librdkafka checks timeouts about once a second; a quarter
                // of slack lets a broker report first, as
                // KafkaPublisher::new asks.
                Self::connect(config, db, publish_timeout * 3 / 4).await?
            }
            TransportKind::Nats => {
                let client = super::nats::start(&t.nats, topics, replicas).await?;
                tracing::info!(url = %t.nats.url, "publishing to NATS JetStream");
                AnyPublisher::Nats(NatsPublisher::new(client, t.partitions, publish_timeout))
            }
            TransportKind::Rabbitmq => {
                let conn =
                    super::rabbitmq::start(&t.rabbitmq, topics, t.partitions, replicas).await?;
                tracing::info!(url = %t.rabbitmq.redacted_url(), "publishing to RabbitMQ");
                AnyPublisher::Rabbitmq(Arc::new(
                    RabbitPublisher::new(&t.rabbitmq, Some(conn), t.partitions, publish_timeout)
                        .await?,
                ))
            }
            TransportKind::Redis => {
                let client =
                    super::redis::start(&t.redis, topics, t.partitions, t.topics.create).await?;
                tracing::info!(url = %t.redis.url, "publishing to Redis Streams");
                AnyPublisher::Redis(
                    RedisPublisher::new(&client, t.partitions, t.redis.maxlen, publish_timeout)
                        .await?,
                )
            }
            TransportKind::Embedded => Self::connect(config, db, publish_timeout).await?,
        })
    }

    /// Whether the broker answers now, for the readiness probe; `None` for
    /// the embedded transport (the database check covers it).
    pub async fn check(&self) -> Option<Result<(), String>> {
        match self {
            AnyPublisher::Embedded(_) => None,
            AnyPublisher::Kafka(p) => Some(p.check(Duration::from_secs(3)).await),
            AnyPublisher::Nats(p) => Some(p.check().await),
            AnyPublisher::Rabbitmq(p) => Some(p.check().await),
            AnyPublisher::Redis(p) => Some(p.check().await),
        }
    }
}

impl Publisher for AnyPublisher {
    async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        match self {
            AnyPublisher::Embedded(p) => p.publish(msg).await,
            AnyPublisher::Kafka(p) => p.publish(msg).await,
            AnyPublisher::Nats(p) => p.publish(msg).await,
            AnyPublisher::Rabbitmq(p) => p.publish(msg).await,
            AnyPublisher::Redis(p) => p.publish(msg).await,
        }
    }
}

/// A consumer group member of any broker, for code that picks the broker
/// at run time (the benchmarks); `outboxd run` builds each kind's source
/// with its own settings.
pub enum AnySource {
    Embedded(super::embedded::EmbeddedConsumer),
    Kafka(super::kafka::KafkaConsumer),
    Nats(super::nats::NatsConsumer),
    Rabbitmq(super::rabbitmq::RabbitConsumer),
    Redis(super::redis::RedisConsumer),
}

impl super::MessageSource for AnySource {
    async fn fetch(
        &mut self,
        max: usize,
    ) -> Result<Vec<crate::message::Delivery>, super::ConsumeError> {
        match self {
            AnySource::Embedded(s) => s.fetch(max).await,
            AnySource::Kafka(s) => s.fetch(max).await,
            AnySource::Nats(s) => s.fetch(max).await,
            AnySource::Rabbitmq(s) => s.fetch(max).await,
            AnySource::Redis(s) => s.fetch(max).await,
        }
    }

    async fn commit(
        &mut self,
        delivery: &crate::message::Delivery,
    ) -> Result<(), super::ConsumeError> {
        match self {
            AnySource::Embedded(s) => s.commit(delivery).await,
            AnySource::Kafka(s) => s.commit(delivery).await,
            AnySource::Nats(s) => s.commit(delivery).await,
            AnySource::Rabbitmq(s) => s.commit(delivery).await,
            AnySource::Redis(s) => s.commit(delivery).await,
        }
    }

    async fn commit_all(
        &mut self,
        deliveries: Vec<crate::message::Delivery>,
    ) -> Result<(), super::ConsumeError> {
        match self {
            AnySource::Embedded(s) => s.commit_all(deliveries).await,
            AnySource::Kafka(s) => s.commit_all(deliveries).await,
            AnySource::Nats(s) => s.commit_all(deliveries).await,
            AnySource::Rabbitmq(s) => s.commit_all(deliveries).await,
            AnySource::Redis(s) => s.commit_all(deliveries).await,
        }
    }

    fn waits_for_messages(&self) -> bool {
        match self {
            AnySource::Embedded(s) => s.waits_for_messages(),
            AnySource::Kafka(s) => s.waits_for_messages(),
            AnySource::Nats(s) => s.waits_for_messages(),
            AnySource::Rabbitmq(s) => s.waits_for_messages(),
            AnySource::Redis(s) => s.waits_for_messages(),
        }
    }

    async fn release(&mut self) -> Result<(), super::ConsumeError> {
        match self {
            AnySource::Embedded(s) => s.release().await,
            AnySource::Kafka(s) => s.release().await,
            AnySource::Nats(s) => s.release().await,
            AnySource::Rabbitmq(s) => s.release().await,
            AnySource::Redis(s) => s.release().await,
        }
    }
}
