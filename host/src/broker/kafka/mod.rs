//! The Kafka transport: [`KafkaPublisher`] for the relay and [`KafkaConsumer`]
//! for consumer groups. This is the only module that links rdkafka.
//!
//! The publisher is an idempotent producer with `acks=all`; a publish
//! resolves only with the delivery report. A fatal producer error or a
//! delivery timeout replaces the producer, because librdkafka cannot recover
//! by itself from a broker that lost its producer state.
//!
//! The consumer is in [`consumer`]; a group member's watch over its
//! group's progress, and why it rejoins, in [`liveness`].

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer, PurgeConfig};
use rdkafka::types::RDKafkaErrorCode;

mod broker_error;
mod client;
mod consumer;
mod lag;
mod liveness;
mod start_check;
pub use consumer::{DEFAULT_STALL_TIMEOUT, KafkaConsumer, KafkaConsumerConfig};
pub use lag::GroupLag;
pub use liveness::{LivenessFamilies, LivenessSink, Recoveries};
pub use start_check::{StartReport, check_at_start};

use super::PublishError;
use super::Publisher;
use crate::message::OutgoingMessage;
use broker_error::BrokerErrors;
use outboxd_core::config::is_secret;

/// How long a publish waits for room in librdkafka's local queue.
const QUEUE_FULL_WAIT: Duration = Duration::from_secs(1);

/// How long the answer to "does this topic exist?" is reused: a batch of
/// failed publishes to one topic asks the cluster once.
const TOPIC_CHECK_REUSE: Duration = Duration::from_secs(5);

/// Why a Kafka client could not be set up, or `outboxd run` refused to
/// start on Kafka.
#[derive(Debug, thiserror::Error)]
pub enum KafkaSetupError {
    #[error("transport.kafka.\"{key}\": {message}")]
    Property { key: String, message: String },
    #[error("cannot create the Kafka {role}: {message}")]
    Client { role: &'static str, message: String },
    /// The brokers refused the login.
    #[error(
        "transport.kafka: SASL authentication failed ({mechanism}): {reason}; check transport.kafka {check}"
    )]
    Authentication {
        mechanism: String,
        reason: String,
        check: &'static str,
    },
    /// The TLS handshake with the brokers failed.
    #[error(
        "transport.kafka: the TLS handshake with the brokers failed: {reason}; check \"ssl.ca.location\" \
         (the CA that signed the brokers' certificates) and that \"security.protocol\" (SSL or SASL_SSL) \
         matches the brokers' listener"
    )]
    Tls { reason: String },
    /// No broker answered yet: worth starting again.
    #[error(
        "transport.kafka: no broker at `{brokers}` answered within {waited:?} (last error: {last}); \
         check \"bootstrap.servers\", \"security.protocol\" and that the brokers are up"
    )]
    Unreachable {
        brokers: String,
        waited: Duration,
        last: String,
    },
    #[error(
        "transport.kafka: {} not exist on the cluster at `{brokers}`: create {} (e.g. `kafka-topics.sh \
         --bootstrap-server {brokers} --create --topic {} --partitions 8 --replication-factor 3`), \
         or set [transport.topics] create = true with partitions and replication, and outboxd run \
         creates {} at start",
        topic_list(topics), if topics.len() == 1 { "it" } else { "them" },
        topics.first().map_or("", String::as_str), if topics.len() == 1 { "it" } else { "them" }
    )]
    TopicsMissing {
        topics: Vec<String>,
        brokers: String,
    },
    #[error(
        "transport.topics: cannot create topic `{topic}`: {reason}; create it by hand, or check \
         that the principal may create topics and that replication is at most the number of brokers"
    )]
    CreateTopic { topic: String, reason: String },
}

fn topic_list(topics: &[String]) -> String {
    let names: Vec<String> = topics.iter().map(|t| format!("`{t}`")).collect();
    match names.len() {
        1 => format!("topic {} does", names[0]),
        _ => format!("topics {} do", names.join(", ")),
    }
}

impl KafkaSetupError {
    /// Whether starting again may succeed: no broker answered yet, while
    /// the configuration is not known to be at fault.
    pub fn is_transient(&self) -> bool {
        matches!(self, KafkaSetupError::Unreachable { .. })
    }
}

/// Whether a failed publish is worth another attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    Retryable,
    Permanent,
}

/// Classifies a librdkafka error code. Errors that no retry can fix because
/// the message itself is wrong (too large, invalid, an invalid topic name)
/// are permanent; anything about the broker's state, its metadata, the
/// credentials or the ACLs is retryable: the event is not at fault, it backs
/// off until `max_attempts` while the operator fixes the cluster.
pub fn classify(code: Option<RDKafkaErrorCode>) -> ErrorClass {
    use RDKafkaErrorCode as C;
    match code {
        Some(
            C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::MessageBatchTooLarge
            | C::InvalidMessage
            | C::InvalidRecord
            | C::InvalidTimestamp
            | C::InvalidTopic
            | C::UnsupportedForMessageFormat
            | C::UnsupportedCompressionType
            | C::PolicyViolation
            | C::InvalidArgument
            | C::KeySerialization
            | C::ValueSerialization,
        ) => ErrorClass::Permanent,
        _ => ErrorClass::Retryable,
    }
}

/// The relay's reason for a failed send. A timeout gets the brokers' last
/// complaint (`broker`), which usually says why.
fn publish_error(topic: &str, err: &KafkaError, broker: Option<String>) -> PublishError {
    let text = match broker {
        Some(why) if err.rdkafka_error_code() == Some(RDKafkaErrorCode::MessageTimedOut) => {
            format!("topic `{topic}`: {err} (last broker error: {why})")
        }
        _ => format!("topic `{topic}`: {err}"),
    };
    match classify(err.rdkafka_error_code()) {
        ErrorClass::Permanent => PublishError::Permanent(text),
        ErrorClass::Retryable => PublishError::Retryable(text),
    }
}

/// A librdkafka configuration error, with the value hidden for secrets.
fn setup_error(role: &'static str, err: KafkaError) -> KafkaSetupError {
    match err {
        KafkaError::ClientConfig(_, desc, key, value) => KafkaSetupError::Property {
            message: if is_secret(&key) {
                format!("{desc} (value hidden)")
            } else {
                format!("{desc} (value `{value}`)")
            },
            key,
        },
        other => KafkaSetupError::Client {
            role,
            message: other.to_string(),
        },
    }
}

/// Refuses a user property that would weaken a guarantee outboxd relies on.
fn require(
    props: &BTreeMap<String, String>,
    key: &str,
    accepted: &[&str],
    why: &str,
) -> Result<(), KafkaSetupError> {
    match props.get(key) {
        Some(v) if !accepted.contains(&v.trim().to_ascii_lowercase().as_str()) => {
            Err(KafkaSetupError::Property {
                key: key.into(),
                message: format!("must be {} ({why}); remove it or set it so", accepted[0]),
            })
        }
        _ => Ok(()),
    }
}

fn base_config(props: &BTreeMap<String, String>) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (k, v) in props {
        config.set(k, v);
    }
    config
}

/// Publishes to Kafka with an idempotent, `acks=all` producer.
pub struct KafkaPublisher {
    config: ClientConfig,
    producer: RwLock<Arc<FutureProducer<BrokerErrors>>>,
    broker_errors: BrokerErrors,
    /// Per topic: when the cluster was last asked whether it exists, and
    /// whether it did.
    topic_checks: std::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, bool)>>,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The config may hold secrets, so it is left out.
        f.debug_struct("KafkaPublisher").finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// `props` are the user's librdkafka properties. `delivery_timeout` is
    /// the default `message.timeout.ms` (a user value wins); keep it under
    /// the relay's publish timeout, so that librdkafka reports a timeout,
    /// and the producer can be replaced, before the relay stops waiting.
    pub fn new(
        props: &BTreeMap<String, String>,
        delivery_timeout: Duration,
    ) -> Result<Self, KafkaSetupError> {
        let why = "a publish is acknowledged only once every in-sync replica has it, exactly once per send";
        require(props, "enable.idempotence", &["true"], why)?;
        require(props, "acks", &["all", "-1"], why)?;
        require(props, "request.required.acks", &["all", "-1"], why)?;
        let mut config = base_config(props);
        config.set("enable.idempotence", "true").set("acks", "all");
        if !props.contains_key("message.timeout.ms") && !props.contains_key("delivery.timeout.ms") {
            config.set(
                "message.timeout.ms",
                delivery_timeout.as_millis().max(1).to_string(),
            );
        }
        let broker_errors = BrokerErrors::default();
        let producer = config
            .create_with_context(broker_errors.clone())
            .map_err(|e| setup_error("producer", e))?;
        Ok(Self {
            config,
            producer: RwLock::new(Arc::new(producer)),
            broker_errors,
            topic_checks: Default::default(),
        })
    }

    /// Asks the cluster for its metadata: `Ok` when a broker answered
    /// within `timeout`. Meant for health checks.
    pub async fn check(&self, timeout: Duration) -> Result<(), String> {
        let producer = self.current().map_err(|e| e.to_string())?;
        tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(None, timeout)
                .map(|_| ())
                .map_err(|e| format!("kafka brokers did not answer within {timeout:?}: {e}"))
        })
        .await
        .map_err(|e| format!("kafka health check task failed: {e}"))?
    }

    /// Whether the cluster answered a metadata request without `topic`.
    /// Asks for every topic, so a broker that auto-creates topics does not
    /// create it because it was asked; the answer is reused for
    /// [`TOPIC_CHECK_REUSE`]. `false` when the cluster does not answer.
    async fn topic_is_missing(
        &self,
        producer: &Arc<FutureProducer<BrokerErrors>>,
        topic: &str,
    ) -> bool {
        let now = std::time::Instant::now();
        if let Ok(checks) = self.topic_checks.lock()
            && let Some((at, missing)) = checks.get(topic)
            && now.duration_since(*at) < TOPIC_CHECK_REUSE
        {
            return *missing;
        }
        let producer = producer.clone();
        let name = topic.to_string();
        let missing = tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(None, Duration::from_secs(1))
                .is_ok_and(|m| {
                    !m.topics().iter().any(|t| {
                        t.name() == name
                            && t.error()
                                != Some(rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)
                    })
                })
        })
        .await
        .unwrap_or(false);
        if let Ok(mut checks) = self.topic_checks.lock() {
            checks.insert(topic.to_string(), (now, missing));
        }
        missing
    }

    fn current(&self) -> Result<Arc<FutureProducer<BrokerErrors>>, PublishError> {
        self.producer
            .read()
            .map(|p| p.clone())
            .map_err(|_| PublishError::Retryable("kafka producer lock poisoned".into()))
    }

    /// Swaps in a fresh producer (once, by whichever publish notices first)
    /// and drops what the old one still queues, so nothing it held can land
    /// after what the new one sends.
    fn replace(&self, failed: &Arc<FutureProducer<BrokerErrors>>, why: &str) {
        let Ok(mut slot) = self.producer.write() else {
            return;
        };
        if !Arc::ptr_eq(&slot, failed) {
            return;
        }
        match self.config.create_with_context(self.broker_errors.clone()) {
            Ok(fresh) => {
                tracing::warn!(reason = why, "replacing the kafka producer");
                failed.purge(PurgeConfig::default().queue());
                *slot = Arc::new(fresh);
            }
            Err(e) => {
                tracing::error!(error = %setup_error("producer", e), "cannot replace the kafka producer");
            }
        }
    }
}

/// Whether a producer that failed this way must be replaced. A fatal error
/// stops an idempotent producer for good. A message that timed out may mean
/// the broker forgot the producer id (a restart that lost its state):
/// librdkafka then bumps the epoch locally and retries with the same
/// unknown id forever, while a new producer asks the broker for a new id.
/// An authorization failure is remembered by librdkafka for the topic until
/// its next metadata refresh (minutes): a new producer asks again, so access
/// the operator grants counts from the next attempt.
fn needs_new_producer(err: &KafkaError, fatal: bool) -> bool {
    fatal
        || matches!(
            err.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::Fatal
                    | RDKafkaErrorCode::MessageTimedOut
                    | RDKafkaErrorCode::TopicAuthorizationFailed
                    | RDKafkaErrorCode::ClusterAuthorizationFailed
            )
        )
}

impl Publisher for KafkaPublisher {
    async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        let producer = self.current()?;
        let mut headers = OwnedHeaders::new_with_capacity(msg.headers.len());
        for (name, value) in &msg.headers {
            headers = headers.insert(Header {
                key: name,
                value: Some(value),
            });
        }
        let record = FutureRecord::to(&msg.topic)
            .key(&msg.key)
            .payload(&msg.payload)
            .headers(headers);
        match producer.send(record, QUEUE_FULL_WAIT).await {
            Ok(_) => Ok(()),
            Err((err, _)) => {
                let fatal = producer.client().fatal_error();
                if needs_new_producer(&err, fatal.is_some()) {
                    let why = match &fatal {
                        Some((code, reason)) => format!("fatal error {code:?}: {reason}"),
                        None => format!("{err}"),
                    };
                    self.replace(&producer, &why);
                }
                // A deleted topic shows as an unknown topic, or as a timeout
                // (librdkafka waits for the topic to come back) while the
                // brokers report nothing wrong.
                let broker = self.broker_errors.recent();
                let maybe_missing = match err.rdkafka_error_code() {
                    Some(
                        RDKafkaErrorCode::UnknownTopic | RDKafkaErrorCode::UnknownTopicOrPartition,
                    ) => true,
                    Some(RDKafkaErrorCode::MessageTimedOut) => broker.is_none(),
                    _ => false,
                };
                if maybe_missing && self.topic_is_missing(&producer, &msg.topic).await {
                    return Err(PublishError::TopicMissing { topic: msg.topic });
                }
                Err(publish_error(&msg.topic, &err, broker))
            }
        }
    }
}

/// Creates `topics` with `partitions` partitions where they do not exist
/// yet (an existing topic is left as it is). For the demo and first runs
/// against a broker that does not auto-create topics.
pub async fn ensure_topics(
    props: &BTreeMap<String, String>,
    topics: &[String],
    partitions: i32,
) -> Result<(), String> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = base_config(props)
        .create()
        .map_err(|e| format!("cannot create a kafka admin client: {e}"))?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
        .collect();
    let results = admin
        .create_topics(
            &new,
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .map_err(|e| format!("kafka did not answer the create-topics request: {e}"))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(format!("cannot create topic {topic}: {code:?}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
