//! The configured broker, chosen once from `[transport] kind`: the one
//! place that lists the brokers, so the daemon, the demo and the tools hold
//! an [`AnyPublisher`] and never match on the kind themselves.

use std::sync::Arc;
use std::time::Duration;

use super::embedded::EmbeddedPublisher;
use super::kafka::{KafkaPublisher, KafkaSetupError};
use super::nats::{NatsPublisher, NatsSetupError};
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
}

impl BrokerSetupError {
    /// Whether a start should be tried again (the broker did not answer).
    pub fn is_transient(&self) -> bool {
        match self {
            BrokerSetupError::Kafka(e) => e.is_transient(),
            BrokerSetupError::Nats(e) => e.is_transient(),
        }
    }
}

/// The publisher of `[transport] kind`.
#[derive(Clone)]
pub enum AnyPublisher {
    Embedded(EmbeddedPublisher),
    Kafka(Arc<KafkaPublisher>),
    Nats(NatsPublisher),
}

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
        })
    }

    /// Whether the broker answers now, for the readiness probe; `None` for
    /// the embedded transport (the database check covers it).
    pub async fn check(&self) -> Option<Result<(), String>> {
        match self {
            AnyPublisher::Embedded(_) => None,
            AnyPublisher::Kafka(p) => Some(p.check(Duration::from_secs(3)).await),
            AnyPublisher::Nats(p) => Some(p.check().await),
        }
    }
}

impl Publisher for AnyPublisher {
    async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        match self {
            AnyPublisher::Embedded(p) => p.publish(msg).await,
            AnyPublisher::Kafka(p) => p.publish(msg).await,
            AnyPublisher::Nats(p) => p.publish(msg).await,
        }
    }
}
