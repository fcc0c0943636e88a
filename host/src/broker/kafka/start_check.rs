//! What `outboxd run` checks before any Kafka client of its own starts:
//! that a broker answers, accepts the TLS handshake and the credentials, and
//! that every topic the configuration names exists, or is created with
//! `[transport.topics] create = true`. A refused login or handshake and a
//! missing topic stop the start with the setting to fix, where the relay
//! alone would retry them for ever; a cluster that does not answer yet is
//! [`KafkaSetupError::is_transient`], so the start is tried again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};

use super::{KafkaSetupError, base_config, setup_error};
use outboxd_core::config::NewTopics;

/// How long one metadata request may wait before the check looks again at
/// what the client reported.
const ROUND: Duration = Duration::from_secs(1);

/// The first refusal librdkafka reported: a login or a TLS handshake the
/// brokers turned down. Every other client error is only logged.
#[derive(Clone, Default)]
struct Refusals(Arc<Mutex<Option<(RDKafkaErrorCode, String)>>>);

impl Refusals {
    fn take(&self) -> Option<(RDKafkaErrorCode, String)> {
        self.0.lock().ok()?.take()
    }
}

impl ClientContext for Refusals {
    fn error(&self, error: KafkaError, reason: &str) {
        let code = error.rdkafka_error_code();
        match code {
            Some(
                code @ (RDKafkaErrorCode::Authentication
                | RDKafkaErrorCode::SaslAuthenticationFailed
                | RDKafkaErrorCode::SSL),
            ) => {
                if let Ok(mut first) = self.0.lock() {
                    first.get_or_insert((code, reason.to_string()));
                }
            }
            _ => tracing::debug!(error = %error, reason, "kafka start check: client error"),
        }
    }
}

impl ProducerContext for Refusals {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

/// What the start check found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StartReport {
    /// Topics that were missing and are now created.
    pub created: Vec<String>,
}

/// Checks `topics` on the cluster `props` describes, creating the missing
/// ones when `create` says how. Waits up to `wait` for a broker to answer.
pub async fn check_at_start(
    props: &BTreeMap<String, String>,
    topics: &BTreeSet<String>,
    create: Option<NewTopics>,
    wait: Duration,
) -> Result<StartReport, KafkaSetupError> {
    let existing = existing_topics(props, wait).await?;
    let missing: Vec<String> = topics
        .iter()
        .filter(|t| !existing.contains(*t))
        .cloned()
        .collect();
    if missing.is_empty() {
        return Ok(StartReport::default());
    }
    let Some(new) = create else {
        return Err(KafkaSetupError::TopicsMissing {
            topics: missing,
            brokers: brokers(props),
        });
    };
    create_topics(props, &missing, new).await?;
    let existing = existing_topics(props, wait).await?;
    if let Some(topic) = missing.iter().find(|t| !existing.contains(*t)) {
        return Err(KafkaSetupError::CreateTopic {
            topic: topic.clone(),
            reason: "the cluster accepted the request, but its metadata does not list the \
                     topic yet"
                .into(),
        });
    }
    tracing::info!(topics = ?missing, partitions = new.partitions, replication = new.replication,
        "created the missing kafka topics ([transport.topics] create = true)");
    Ok(StartReport { created: missing })
}

fn brokers(props: &BTreeMap<String, String>) -> String {
    props
        .get("bootstrap.servers")
        .or_else(|| props.get("metadata.broker.list"))
        .cloned()
        .unwrap_or_default()
}

/// The names of every topic on the cluster. Asks for all topics, so that
/// no broker auto-creates one because it was asked about it.
async fn existing_topics(
    props: &BTreeMap<String, String>,
    wait: Duration,
) -> Result<BTreeSet<String>, KafkaSetupError> {
    let refusals = Refusals::default();
    let producer: BaseProducer<Refusals> = base_config(props)
        .create_with_context(refusals.clone())
        .map_err(|e| setup_error("start check client", e))?;
    let props = props.clone();
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + wait;
        loop {
            let answer = producer.client().fetch_metadata(None, ROUND);
            // Serves the error callbacks, which report refusals.
            producer.poll(Duration::ZERO);
            if let Some((code, reason)) = refusals.take() {
                return Err(refused(&props, code, reason));
            }
            match answer {
                Ok(metadata) => {
                    return Ok(metadata
                        .topics()
                        .iter()
                        .filter(|t| {
                            t.error()
                                != Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)
                        })
                        .map(|t| t.name().to_string())
                        .collect());
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(KafkaSetupError::Unreachable {
                        brokers: brokers(&props),
                        waited: wait,
                        last: e.to_string(),
                    });
                }
                Err(_) => producer.poll(Duration::from_millis(100)),
            }
        }
    })
    .await
    .map_err(|e| KafkaSetupError::Client {
        role: "start check client",
        message: format!("the check's task failed: {e}"),
    })?
}

/// The error for a refused login or TLS handshake, naming the settings.
fn refused(
    props: &BTreeMap<String, String>,
    code: RDKafkaErrorCode,
    reason: String,
) -> KafkaSetupError {
    if code == RDKafkaErrorCode::SSL {
        return KafkaSetupError::Tls { reason };
    }
    let mechanism = props
        .get("sasl.mechanism")
        .or_else(|| props.get("sasl.mechanisms"))
        .map_or_else(|| "GSSAPI".to_string(), |m| m.trim().to_ascii_uppercase());
    let check = match mechanism.as_str() {
        "OAUTHBEARER" => "\"sasl.oauthbearer.*\" (the token endpoint, client id and secret)",
        "GSSAPI" => {
            "\"sasl.kerberos.*\" (outboxd's librdkafka has no Kerberos; use PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER)"
        }
        _ => {
            "\"sasl.username\" and the password (\"sasl.password_env\", \"sasl.password_file\" or \"sasl.password\")"
        }
    };
    KafkaSetupError::Authentication {
        mechanism,
        reason,
        check,
    }
}

async fn create_topics(
    props: &BTreeMap<String, String>,
    topics: &[String],
    new: NewTopics,
) -> Result<(), KafkaSetupError> {
    let admin: AdminClient<DefaultClientContext> = base_config(props)
        .create()
        .map_err(|e| setup_error("admin client", e))?;
    let requests: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| {
            NewTopic::new(
                t,
                new.partitions,
                TopicReplication::Fixed(i32::from(new.replication)),
            )
        })
        .collect();
    let results = admin
        .create_topics(
            &requests,
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .map_err(|e| KafkaSetupError::CreateTopic {
            topic: topics.join(", "),
            reason: format!("the cluster did not answer the request: {e}"),
        })?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => {
                return Err(KafkaSetupError::CreateTopic {
                    topic,
                    reason: format!("{code:?} ({code})"),
                });
            }
        }
    }
    Ok(())
}
