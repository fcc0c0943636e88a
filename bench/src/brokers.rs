//! The external brokers the benchmarks compare: where each one is
//! (`--kafka`, `--nats`, `--rabbitmq`, `--redis`), a publisher to a topic emptied
//! first, and a consumer group member reading it.

use std::collections::BTreeSet;
use std::time::Duration;

use super::BenchError;
use outboxd::broker::embedded::{EmbeddedConsumer, EmbeddedConsumerConfig, EmbeddedPublisher};
use outboxd::broker::kafka::{KafkaConsumer, KafkaConsumerConfig, KafkaPublisher};
use outboxd::broker::nats::{NatsConsumer, NatsConsumerConfig, NatsPublisher};
use outboxd::broker::rabbitmq::{RabbitConsumer, RabbitConsumerConfig, RabbitPublisher};
use outboxd::broker::redis::{RedisConsumer, RedisConsumerConfig, RedisPublisher};
use outboxd::broker::{AnyPublisher, AnySource};
use outboxd::config::{NatsSection, RabbitSection, RabbitUrl, RedisSection, RedisUrl};
use outboxd::store::Db;

/// Where the external brokers are.
#[derive(Debug, Clone, clap::Args)]
pub struct BrokerArgs {
    /// Kafka bootstrap servers (`kafka` in a transport list).
    #[arg(long = "brokers", default_value = "127.0.0.1:9092")]
    pub kafka: String,
    /// NATS server (`nats`).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub nats: String,
    /// RabbitMQ (`rabbitmq`).
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub rabbitmq: String,
    /// Redis (`redis`).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis: String,
}

/// How long one publish may wait for its acknowledgement.
const ACK_TIMEOUT: Duration = Duration::from_secs(8);

impl BrokerArgs {
    fn kafka_props(&self) -> std::collections::BTreeMap<String, String> {
        std::collections::BTreeMap::from([
            ("bootstrap.servers".to_string(), self.kafka.clone()),
            ("enable.idempotence".to_string(), "true".to_string()),
            ("acks".to_string(), "all".to_string()),
            ("linger.ms".to_string(), "1".to_string()),
        ])
    }

    fn nats(&self) -> NatsSection {
        NatsSection {
            url: self.nats.clone(),
            fetch_wait: Duration::from_millis(100),
            ..NatsSection::default()
        }
    }

    fn rabbitmq(&self) -> RabbitSection {
        RabbitSection {
            url: RabbitUrl(self.rabbitmq.clone()),
            fetch_wait: Duration::from_millis(100),
            ..RabbitSection::default()
        }
    }

    fn redis(&self) -> RedisSection {
        RedisSection {
            url: RedisUrl(self.redis.clone()),
            fetch_wait: Duration::from_millis(100),
            ..RedisSection::default()
        }
    }

    /// A publisher of `transport` to `topic` with `partitions`, the topic
    /// holding nothing: NATS, RabbitMQ and Redis topics are deleted and
    /// created again; Kafka topics cannot be emptied, so callers give Kafka a
    /// topic of its own per run.
    pub async fn fresh_publisher(
        &self,
        transport: &str,
        db: &Db,
        topic: &str,
        partitions: i32,
    ) -> Result<AnyPublisher, BenchError> {
        let refused = |e: String| BenchError::Refused(format!("{transport}: {e}"));
        let topics = BTreeSet::from([topic.to_string()]);
        Ok(match transport {
            "embedded" => AnyPublisher::Embedded(EmbeddedPublisher::new(db.clone(), partitions)),
            "kafka" => {
                let props = self.kafka_props();
                outboxd::broker::kafka::ensure_topics(&props, &[topic.to_string()], partitions)
                    .await
                    .map_err(|e| refused(format!("--brokers {}: {e}", self.kafka)))?;
                AnyPublisher::Kafka(std::sync::Arc::new(
                    KafkaPublisher::new(&props, ACK_TIMEOUT).map_err(|e| refused(e.to_string()))?,
                ))
            }
            "nats" => {
                let client = outboxd::broker::nats::connect(&self.nats())
                    .await
                    .map_err(|e| refused(e.to_string()))?;
                outboxd::broker::nats::delete_streams(&client, &[topic.to_string()])
                    .await
                    .map_err(|e| refused(e.to_string()))?;
                outboxd::broker::nats::check_streams(
                    &client,
                    &topics,
                    Some(1),
                    Duration::from_secs(120),
                )
                .await
                .map_err(|e| refused(e.to_string()))?;
                AnyPublisher::Nats(NatsPublisher::new(client, partitions, ACK_TIMEOUT))
            }
            "rabbitmq" => {
                let section = self.rabbitmq();
                let conn = outboxd::broker::rabbitmq::connect(&section)
                    .await
                    .map_err(|e| refused(e.to_string()))?;
                outboxd::broker::rabbitmq::delete_topology(&conn, &[topic.to_string()], partitions)
                    .await
                    .map_err(|e| refused(e.to_string()))?;
                outboxd::broker::rabbitmq::check_topology(&conn, &topics, partitions, Some(1))
                    .await
                    .map_err(|e| refused(e.to_string()))?;
                AnyPublisher::Rabbitmq(std::sync::Arc::new(
                    RabbitPublisher::new(&section, Some(conn), partitions, ACK_TIMEOUT)
                        .await
                        .map_err(|e| refused(e.to_string()))?,
                ))
            }
            "redis" => {
                let section = self.redis();
                let client =
                    outboxd::broker::redis::client(&section).map_err(|e| refused(e.to_string()))?;
                let mut conn = client
                    .connect(ACK_TIMEOUT)
                    .await
                    .map_err(|e| refused(e.to_string()))?;
                outboxd::broker::redis::delete_streams(&mut conn, &[topic.to_string()], partitions)
                    .await
                    .map_err(|e| refused(e.to_string()))?;
                outboxd::broker::redis::check_streams(&mut conn, &topics, partitions, true)
                    .await
                    .map_err(|e| refused(e.to_string()))?;
                AnyPublisher::Redis(
                    RedisPublisher::new(&client, partitions, section.maxlen, ACK_TIMEOUT)
                        .await
                        .map_err(|e| refused(e.to_string()))?,
                )
            }
            other => {
                return Err(BenchError::Refused(format!(
                    "unknown transport `{other}`; use embedded, kafka, nats, rabbitmq or redis"
                )));
            }
        })
    }

    /// A member of consumer group `group` reading `topic` on `transport`.
    /// Cursors and leases live in `db`.
    pub async fn source(
        &self,
        transport: &str,
        db: &Db,
        group: &str,
        topic: &str,
        partitions: i32,
        prefetch: u16,
    ) -> Result<AnySource, BenchError> {
        let refused = |e: String| BenchError::Refused(format!("{transport}: {e}"));
        Ok(match transport {
            "embedded" => AnySource::Embedded(EmbeddedConsumer::new(
                db.clone(),
                EmbeddedConsumerConfig {
                    group: group.into(),
                    topics: vec![topic.into()],
                    partitions,
                    lease: Duration::from_secs(30),
                },
            )),
            "kafka" => AnySource::Kafka(
                KafkaConsumer::new(
                    &self.kafka_props_consumer(),
                    KafkaConsumerConfig::new(group, vec![topic.into()]),
                )
                .map_err(|e| refused(e.to_string()))?,
            ),
            "nats" => {
                let section = self.nats();
                let client = outboxd::broker::nats::connect(&section)
                    .await
                    .map_err(|e| refused(e.to_string()))?;
                AnySource::Nats(NatsConsumer::new(
                    db.clone(),
                    client,
                    NatsConsumerConfig {
                        group: group.into(),
                        topics: vec![topic.into()],
                        partitions,
                        lease: Duration::from_secs(30),
                        ack_wait: section.ack_wait,
                        fetch_wait: section.fetch_wait,
                        batch: usize::from(prefetch),
                    },
                ))
            }
            "rabbitmq" => {
                let section = self.rabbitmq();
                AnySource::Rabbitmq(RabbitConsumer::new(
                    section.clone(),
                    RabbitConsumerConfig {
                        group: group.into(),
                        topics: vec![topic.into()],
                        partitions,
                        prefetch,
                        fetch_wait: section.fetch_wait,
                    },
                ))
            }
            "redis" => {
                let section = self.redis();
                AnySource::Redis(RedisConsumer::new(
                    db.clone(),
                    outboxd::broker::redis::client(&section).map_err(|e| refused(e.to_string()))?,
                    RedisConsumerConfig {
                        group: group.into(),
                        topics: vec![topic.into()],
                        partitions,
                        lease: Duration::from_secs(30),
                        fetch_wait: section.fetch_wait,
                        batch: usize::from(prefetch),
                    },
                ))
            }
            other => {
                return Err(BenchError::Refused(format!(
                    "unknown transport `{other}`; use embedded, kafka, nats, rabbitmq or redis"
                )));
            }
        })
    }

    fn kafka_props_consumer(&self) -> std::collections::BTreeMap<String, String> {
        std::collections::BTreeMap::from([("bootstrap.servers".to_string(), self.kafka.clone())])
    }
}
