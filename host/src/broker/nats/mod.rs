//! NATS JetStream: the only module that links async-nats.
//!
//! A route topic is one JetStream stream ([`stream_name`]: `.` and other
//! characters stream names cannot hold become `_`) whose subjects are
//! `TOPIC.PARTITION`, the partition from the key's hash as on the embedded
//! transport. The relay waits for each message's PubAck and sets
//! `Nats-Msg-Id` to the message id, so JetStream's duplicate window drops a
//! re-publish after a relay crash. Consumers ([`consumer`]) read each
//! partition subject through a durable pull consumer, leased to one group
//! member at a time.

pub mod consumer;

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishErrorKind, stream};
use bytes::Bytes;

use super::{PublishError, Publisher};
use crate::broker::embedded::partition_for;
use crate::message::OutgoingMessage;
use outboxd_core::config::NatsSection;
use outboxd_core::config::nats::{stream_name, stream_names};

pub use consumer::{NatsConsumer, NatsConsumerConfig, messages_behind};

/// The header that carries a message's key (NATS messages have none).
pub const KEY_HEADER: &str = "outboxd-key";
/// JetStream's de-duplication header.
const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// Why NATS could not be set up; each names the setting to fix.
#[derive(Debug, thiserror::Error)]
pub enum NatsSetupError {
    #[error(
        "cannot connect to NATS at {url}: {reason}; check transport.nats.url, that nats-server \
         runs there with JetStream (-js), and the credentials and TLS settings"
    )]
    Connect {
        url: String,
        reason: String,
        /// The server did not answer (refused, timed out): worth another
        /// try at start. A refused login or TLS handshake is not.
        transient: bool,
    },
    #[error(
        "transport.nats.creds_file `{path}`: {reason}; point it at the .creds file `nsc` wrote"
    )]
    Creds { path: String, reason: String },
    #[error(
        "JetStream stream `{stream}` (topic `{topic}`) does not exist on the NATS server; \
         create it with subjects \"{topic}.*\", or start outboxd with [transport.topics] \
         create = true"
    )]
    StreamMissing { stream: String, topic: String },
    #[error(
        "JetStream stream `{stream}` exists but does not carry subjects \"{topic}.*\" (it has \
         {subjects:?}); add that subject to the stream, or rename the topic"
    )]
    StreamSubjects {
        stream: String,
        topic: String,
        subjects: Vec<String>,
    },
    #[error("JetStream stream `{stream}`: {reason}")]
    Stream { stream: String, reason: String },
    /// The server stopped answering during the start's checks: worth
    /// another try at start.
    #[error("JetStream stream `{stream}`: {reason}; the server stopped answering")]
    Unanswered { stream: String, reason: String },
    #[error("{0}")]
    Config(String),
}

/// A connection to NATS, shared by the publisher and the consumers of a
/// process (async-nats multiplexes one socket).
#[derive(Clone, Debug)]
pub struct Client(async_nats::Client);

impl Client {
    pub(super) fn jetstream(&self) -> jetstream::Context {
        jetstream::new(self.0.clone())
    }
}

/// Connects, then checks (or creates, with `create` replicas) the stream of
/// every topic in `topics`: what `outboxd run` does before it starts.
pub async fn start(
    cfg: &NatsSection,
    topics: &BTreeSet<String>,
    create: Option<usize>,
) -> Result<Client, NatsSetupError> {
    let client = connect(cfg).await?;
    check_streams(&client, topics, create, cfg.duplicate_window).await?;
    Ok(client)
}

/// Connects with the section's URL, credentials and TLS. No error text
/// holds a password or a token.
pub async fn connect(cfg: &NatsSection) -> Result<Client, NatsSetupError> {
    // async-nats's TLS takes rustls's process-wide provider, and the tree
    // compiles two (ring, and aws-lc-rs for the replication client), so
    // rustls cannot pick one by itself: without this a tls:// connection
    // panicked. ring, as every other TLS client here.
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    let mut opts = async_nats::ConnectOptions::new()
        .name("outboxd")
        .connection_timeout(Duration::from_secs(5))
        .require_tls(cfg.tls_required || cfg.url.starts_with("tls://"));
    if let (Some(user), Some(pass)) = (&cfg.user, &cfg.password) {
        opts = opts.user_and_password(user.clone(), pass.0.clone());
    }
    if let Some(token) = &cfg.token {
        opts = opts.token(token.0.clone());
    }
    if let Some(path) = &cfg.creds_file {
        opts = opts
            .credentials_file(path)
            .await
            .map_err(|e| NatsSetupError::Creds {
                path: path.clone(),
                reason: e.to_string(),
            })?;
    }
    if let Some(ca) = &cfg.ca_file {
        opts = opts.add_root_certificates(ca.into());
    }
    let client = opts.connect(cfg.url.as_str()).await.map_err(|e| {
        use async_nats::ConnectErrorKind as K;
        // A refused certificate comes back as an I/O error.
        let tls = e.kind() == K::Tls || {
            let t = e.to_string().to_ascii_lowercase();
            t.contains("certificate") || t.contains("handshake")
        };
        let reason = match e.kind() {
            _ if tls => format!(
                "TLS failed ({e}); check transport.nats.ca_file and that the server's \
                 certificate names the host in transport.nats.url"
            ),
            K::AuthorizationViolation | K::Authentication => {
                "the server refused the credentials (authorization violation); check \
                 transport.nats.user and password_env/password_file, token_env/token_file \
                 or creds_file"
                    .to_string()
            }
            _ => e.to_string(),
        };
        NatsSetupError::Connect {
            url: cfg.url.clone(),
            transient: !tls && matches!(e.kind(), K::Io | K::TimedOut | K::Dns),
            reason,
        }
    })?;
    Ok(Client(client))
}

impl NatsSetupError {
    /// Whether `outboxd run` tries the start again (the server did not
    /// answer yet).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            NatsSetupError::Connect {
                transient: true,
                ..
            } | NatsSetupError::Unanswered { .. }
        )
    }
}

/// Checks at start that each topic's stream exists and carries
/// `TOPIC.*`; creates the missing ones when `create` (with `replicas`).
pub async fn check_streams(
    client: &Client,
    topics: &BTreeSet<String>,
    create: Option<usize>,
    duplicate_window: Duration,
) -> Result<(), NatsSetupError> {
    let js = client.jetstream();
    let names = stream_names(topics.iter().map(String::as_str)).map_err(NatsSetupError::Config)?;
    for (topic, name) in names {
        let subject = format!("{topic}.*");
        match js.get_stream(&name).await {
            Ok(mut s) => {
                let info = s
                    .info()
                    .await
                    .map_err(|e| stream_error(&name, e.to_string()))?;
                let subjects = info.config.subjects.clone();
                if !subjects
                    .iter()
                    .any(|s| s == &subject || s == &format!("{topic}.>"))
                {
                    return Err(NatsSetupError::StreamSubjects {
                        stream: name,
                        topic,
                        subjects,
                    });
                }
            }
            Err(e) if is_not_found(&e.to_string()) => {
                let Some(replicas) = create else {
                    return Err(NatsSetupError::StreamMissing {
                        stream: name,
                        topic,
                    });
                };
                js.create_stream(stream::Config {
                    name: name.clone(),
                    subjects: vec![subject],
                    storage: stream::StorageType::File,
                    num_replicas: replicas,
                    duplicate_window,
                    ..Default::default()
                })
                .await
                .map_err(|e| stream_error(&name, format!("cannot create it: {e}")))?;
                tracing::info!(stream = %name, %topic, "created the JetStream stream");
            }
            Err(e) if unanswered(&e.to_string()) => {
                return Err(NatsSetupError::Unanswered {
                    stream: name,
                    reason: e.to_string(),
                });
            }
            Err(e) => {
                return Err(NatsSetupError::Stream {
                    stream: name,
                    reason: format!("{e}; is JetStream enabled on the server (nats-server -js)?"),
                });
            }
        }
    }
    Ok(())
}

/// Deletes the stream of each of `topics`, and everything in it (tests
/// and benchmarks start from nothing; outboxd itself never deletes one).
pub async fn delete_streams(client: &Client, topics: &[String]) -> Result<(), NatsSetupError> {
    let js = client.jetstream();
    for topic in topics {
        let name = stream_name(topic);
        match js.delete_stream(&name).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e.to_string()) => {}
            Err(e) => {
                return Err(NatsSetupError::Stream {
                    stream: name,
                    reason: format!("cannot delete it: {e}"),
                });
            }
        }
    }
    Ok(())
}

/// A stream check's failure: [`NatsSetupError::Unanswered`] when the
/// server did not answer, else [`NatsSetupError::Stream`].
fn stream_error(stream: &str, reason: String) -> NatsSetupError {
    if unanswered(&reason) {
        NatsSetupError::Unanswered {
            stream: stream.to_string(),
            reason,
        }
    } else {
        NatsSetupError::Stream {
            stream: stream.to_string(),
            reason,
        }
    }
}

/// Whether a JetStream call failed because the server did not answer
/// (a timeout, a broken connection) rather than refused.
fn unanswered(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    [
        "timed out",
        "timeout",
        "connection",
        "broken pipe",
        "no responders",
        "disconnected",
    ]
    .iter()
    .any(|w| t.contains(w))
}

fn is_not_found(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    t.contains("not found") || t.contains("10059")
}

/// Publishes to JetStream and waits for each message's PubAck.
#[derive(Clone, Debug)]
pub struct NatsPublisher {
    js: jetstream::Context,
    partitions: i32,
}

impl NatsPublisher {
    pub fn new(client: Client, partitions: i32, ack_timeout: Duration) -> Self {
        let mut js = client.jetstream();
        js.set_timeout(ack_timeout);
        Self {
            js,
            partitions: partitions.max(1),
        }
    }

    /// Whether the server answers (for the readiness probe).
    pub async fn check(&self) -> Result<(), String> {
        self.js
            .query_account()
            .await
            .map(|_| ())
            .map_err(|e| format!("NATS JetStream does not answer: {e}"))
    }
}

/// The NATS headers of `msg`: its own, the key, and the message id for
/// JetStream's duplicate window. A header NATS cannot carry (not ASCII
/// text, or a line break) is a permanent error naming it.
pub fn headers_of(msg: &OutgoingMessage) -> Result<HeaderMap, PublishError> {
    let mut h = HeaderMap::new();
    let text = |name: &str, v: &[u8]| -> Result<String, PublishError> {
        match std::str::from_utf8(v) {
            Ok(s) if !s.contains(['\r', '\n']) => Ok(s.to_string()),
            _ => Err(PublishError::Permanent(format!(
                "header `{name}` is not one line of UTF-8 text, which NATS headers must be"
            ))),
        }
    };
    for (k, v) in &msg.headers {
        if k.is_empty() || k.contains([':', ' ', '\r', '\n']) {
            return Err(PublishError::Permanent(format!(
                "header name `{k}` cannot be a NATS header name"
            )));
        }
        h.insert(k.as_str(), text(k, v)?.as_str());
    }
    h.insert(KEY_HEADER, text(KEY_HEADER, &msg.key)?.as_str());
    h.insert(MSG_ID_HEADER, msg.message_id.to_string().as_str());
    Ok(h)
}

impl Publisher for NatsPublisher {
    async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        let subject = format!("{}.{}", msg.topic, partition_for(&msg.key, self.partitions));
        let headers = headers_of(&msg)?;
        let topic = msg.topic.clone();
        let ack = self
            .js
            .publish_with_headers(subject, headers, Bytes::from(msg.payload))
            .await
            .map_err(|e| publish_error(e.kind(), &e.to_string(), &topic))?;
        ack.await
            .map_err(|e| publish_error(e.kind(), &e.to_string(), &topic))?;
        Ok(())
    }
}

fn publish_error(kind: PublishErrorKind, text: &str, topic: &str) -> PublishError {
    match kind {
        PublishErrorKind::StreamNotFound => PublishError::TopicMissing {
            topic: format!("{topic} (JetStream stream `{}`)", stream_name(topic)),
        },
        PublishErrorKind::MaxPayloadExceeded => PublishError::Permanent(format!(
            "the message is larger than the NATS server's max_payload: {text}"
        )),
        _ => PublishError::Retryable(format!("NATS publish: {text}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(key: &[u8], headers: Vec<(String, Vec<u8>)>) -> OutgoingMessage {
        OutgoingMessage {
            topic: "orders".into(),
            key: key.to_vec(),
            payload: b"{}".to_vec(),
            headers,
            message_id: uuid::Uuid::nil(),
            created_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn a_server_that_stops_answering_during_the_checks_is_retried_a_refusal_is_not() {
        assert!(stream_error("orders", "request timed out".into()).is_transient());
        assert!(stream_error("orders", "broken pipe: connection reset".into()).is_transient());
        let refused = stream_error("orders", "insufficient resources".into());
        assert!(!refused.is_transient(), "{refused}");
    }

    #[test]
    fn headers_carry_the_key_and_the_message_id_and_refuse_what_nats_cannot_carry() {
        let h = headers_of(&msg(
            b"o-1",
            vec![("traceparent".into(), b"00-a-b-01".to_vec())],
        ))
        .expect("headers");
        assert_eq!(h.get(KEY_HEADER).map(|v| v.as_str()), Some("o-1"));
        assert_eq!(
            h.get(MSG_ID_HEADER).map(|v| v.as_str()),
            Some("00000000-0000-0000-0000-000000000000")
        );
        assert_eq!(h.get("traceparent").map(|v| v.as_str()), Some("00-a-b-01"));
        let e = headers_of(&msg(b"o-1", vec![("x".into(), b"a\r\nb".to_vec())]))
            .expect_err("line break");
        assert!(e.is_permanent() && e.to_string().contains("`x`"), "{e}");
        let e = headers_of(&msg(&[0xff, 0xfe], vec![])).expect_err("binary key");
        assert!(e.to_string().contains(KEY_HEADER), "{e}");
    }
}
