//! RabbitMQ (AMQP 0.9.1): the only module that links lapin.
//!
//! A route topic is a durable direct exchange of the same name with one
//! quorum queue per partition, `TOPIC.PARTITION`, bound with the partition
//! number as routing key; the partition comes from the key's hash as on
//! the other transports. The queues are declared with single-active-
//! consumer, so one member of a group reads a partition at a time, in
//! order. The relay publishes persistent messages with the mandatory flag
//! on a channel in confirm mode and waits for each confirm: a message no
//! queue takes comes back inside its confirm and is an error, never a
//! silent drop. Consumers ([`consumer`]) acknowledge after the inbox commit.

pub mod consumer;

use std::collections::BTreeSet;
use std::time::Duration;

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
};
use tokio::sync::Mutex;

use super::{PublishError, Publisher};
use crate::broker::embedded::partition_for;
use crate::message::OutgoingMessage;
use outboxd_core::config::RabbitSection;
use outboxd_core::config::rabbitmq::{exchange_name, queue_name, topic_problem};

pub use consumer::{RabbitConsumer, RabbitConsumerConfig, messages_behind};

/// The header that carries a message's key (AMQP has no key).
pub const KEY_HEADER: &str = "outboxd-key";

/// Why RabbitMQ could not be set up; each names the setting to fix.
#[derive(Debug, thiserror::Error)]
pub enum RabbitSetupError {
    #[error(
        "cannot connect to RabbitMQ at {url}: {reason}; check transport.rabbitmq.url, that \
         RabbitMQ runs there, and the credentials and TLS settings"
    )]
    Connect {
        /// The URL without its password.
        url: String,
        reason: String,
        /// The server did not answer (refused, timed out): worth another
        /// try at start. A refused login or TLS handshake is not.
        transient: bool,
    },
    #[error(
        "transport.rabbitmq.ca_file `{path}`: {reason}; point it at a PEM file of CA certificates"
    )]
    CaFile { path: String, reason: String },
    #[error(
        "RabbitMQ exchange `{exchange}` (topic `{topic}`) does not exist; declare it (durable, \
         direct) or start outboxd with [transport.topics] create = true"
    )]
    ExchangeMissing { exchange: String, topic: String },
    #[error(
        "RabbitMQ queue `{queue}` (topic `{topic}`) does not exist; declare it (durable, \
         x-queue-type = quorum, x-single-active-consumer = true) or start outboxd with \
         [transport.topics] create = true"
    )]
    QueueMissing { queue: String, topic: String },
    #[error(
        "RabbitMQ {what} `{name}` exists with other settings than outboxd needs: {reason}; \
         delete it and let outboxd declare it ([transport.topics] create = true), or declare it \
         {needs}"
    )]
    Mismatch {
        what: &'static str,
        name: String,
        reason: String,
        needs: &'static str,
    },
    #[error("RabbitMQ {what} `{name}`: {reason}")]
    Topology {
        what: &'static str,
        name: String,
        reason: String,
        /// The connection broke during the check (the node stopped):
        /// worth another try at start.
        transient: bool,
    },
    #[error("{0}")]
    Config(String),
}

impl RabbitSetupError {
    /// Whether `outboxd run` tries the start again (the server did not
    /// answer yet).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            RabbitSetupError::Connect {
                transient: true,
                ..
            } | RabbitSetupError::Topology {
                transient: true,
                ..
            }
        )
    }
}

/// The AMQP error a server sent, if `e` is one.
fn soft_error(e: &lapin::Error) -> Option<AMQPSoftError> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => match amqp.kind() {
            AMQPErrorKind::Soft(soft) => Some(soft.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// Opens a connection with the section's URL, password and TLS roots. No
/// error text holds the password.
pub async fn connect(cfg: &RabbitSection) -> Result<Connection, RabbitSetupError> {
    let shown = cfg.redacted_url();
    let mut uri: lapin::uri::AMQPUri = cfg.url.0.trim().parse().map_err(|e: String| {
        RabbitSetupError::Config(format!(
            "transport.rabbitmq.url `{shown}` is not an AMQP URL ({}); write \
                 amqp://user@host:5672/%2f",
            scrub(&e, cfg)
        ))
    })?;
    if let Some(password) = &cfg.password {
        uri.authority.userinfo.password = password.0.clone();
    }
    if uri.query.connection_timeout.is_none() {
        uri.query.connection_timeout = Some(5_000);
    }
    let mut tls = lapin::tcp::OwnedTLSConfig::default();
    if let Some(path) = &cfg.ca_file {
        let pem = std::fs::read_to_string(path).map_err(|e| RabbitSetupError::CaFile {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if !pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err(RabbitSetupError::CaFile {
                path: path.clone(),
                reason: "holds no PEM certificate".into(),
            });
        }
        tls.cert_chain = Some(pem);
    }
    let runtime = lapin::runtime::default_runtime().map_err(|e| RabbitSetupError::Connect {
        url: shown.clone(),
        reason: e.to_string(),
        transient: false,
    })?;
    let props = ConnectionProperties::default().with_connection_name("outboxd".into());
    Connection::connect_uri_with_config(uri, props, tls, runtime)
        .await
        .map_err(|e| {
            let text = scrub(&e.to_string(), cfg);
            let lower = text.to_ascii_lowercase();
            let refused_login = matches!(soft_error(&e), Some(AMQPSoftError::ACCESSREFUSED))
                || lower.contains("access_refused")
                || lower.contains("access-refused")
                || lower.contains("authentication");
            let tls_failed = lower.contains("certificate") || lower.contains("tls");
            let reason = if refused_login {
                "the server refused the credentials (ACCESS_REFUSED); check the user in \
                 transport.rabbitmq.url and the password (password_env / password_file)"
                    .to_string()
            } else if tls_failed {
                format!(
                    "TLS failed ({text}); check transport.rabbitmq.ca_file and that the server's \
                     certificate names the host in transport.rabbitmq.url"
                )
            } else if lower.contains("vhost") || lower.contains("not_allowed") {
                format!("{text}; check the virtual host at the end of transport.rabbitmq.url")
            } else {
                text
            };
            RabbitSetupError::Connect {
                url: shown.clone(),
                transient: e.is_io_error() && !refused_login && !tls_failed,
                reason,
            }
        })
}

/// `text` with any password of the section replaced.
fn scrub(text: &str, cfg: &RabbitSection) -> String {
    let mut out = text.to_string();
    if let Some(p) = &cfg.password
        && !p.0.is_empty()
    {
        out = out.replace(&p.0, "***");
    }
    if let Ok(uri) = cfg.url.0.trim().parse::<lapin::uri::AMQPUri>()
        && !uri.authority.userinfo.password.is_empty()
    {
        out = out.replace(&uri.authority.userinfo.password, "***");
    }
    out
}

/// The arguments of a partition queue: quorum (replicated, fsynced), one
/// active consumer at a time.
fn queue_arguments(replicas: Option<usize>) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    args.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
    if let Some(n) = replicas {
        args.insert(
            "x-quorum-initial-group-size".into(),
            AMQPValue::LongInt(i32::try_from(n).unwrap_or(i32::MAX)),
        );
    }
    args
}

/// Checks at start that each topic's exchange and partition queues exist
/// with the settings outboxd relies on (a direct exchange; durable quorum
/// queues with single-active-consumer), binds each queue to its partition's
/// routing key, and creates what is missing when `create` (with that many
/// quorum members).
pub async fn check_topology(
    conn: &Connection,
    topics: &BTreeSet<String>,
    partitions: i32,
    create: Option<usize>,
) -> Result<(), RabbitSetupError> {
    for topic in topics {
        if let Some(why) = topic_problem(topic) {
            return Err(RabbitSetupError::Config(format!(
                "topic `{topic}` {why}; rename it for RabbitMQ"
            )));
        }
        let exchange = exchange_name(topic);
        // A failed declare closes its channel: each check has its own.
        let passive = channel(conn, "exchange", &exchange).await?;
        let exists = match passive
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
        {
            Ok(()) => true,
            Err(e) if soft_error(&e) == Some(AMQPSoftError::NOTFOUND) => false,
            Err(e) => return Err(topology("exchange", &exchange, &e)),
        };
        if !exists && create.is_none() {
            return Err(RabbitSetupError::ExchangeMissing {
                exchange,
                topic: topic.clone(),
            });
        }
        let ch = channel(conn, "exchange", &exchange).await?;
        ch.exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| mismatch_or("exchange", &exchange, &e, "durable, of type direct"))?;
        if !exists {
            tracing::info!(%exchange, %topic, "created the RabbitMQ exchange");
        }
        for partition in 0..partitions.max(1) {
            let queue = queue_name(topic, partition);
            let passive = channel(conn, "queue", &queue).await?;
            let exists = match passive
                .queue_declare(
                    queue.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
            {
                Ok(_) => true,
                Err(e) if soft_error(&e) == Some(AMQPSoftError::NOTFOUND) => false,
                Err(e) => return Err(topology("queue", &queue, &e)),
            };
            if !exists && create.is_none() {
                return Err(RabbitSetupError::QueueMissing {
                    queue,
                    topic: topic.clone(),
                });
            }
            declare_queue(conn, &queue, if exists { None } else { create }).await?;
            let ch = channel(conn, "queue", &queue).await?;
            ch.queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                partition.to_string().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| topology("queue", &queue, &e))?;
            if !exists {
                tracing::info!(%queue, %topic, "created the RabbitMQ quorum queue");
            }
        }
    }
    Ok(())
}

/// Declares `queue` as outboxd needs it; on an existing queue this checks
/// its settings, which RabbitMQ compares argument by argument. The initial
/// group size of a quorum queue is among them and cannot be read without
/// the management API: when the server names the size the queue was
/// created with, the check is made again with that size.
async fn declare_queue(
    conn: &Connection,
    queue: &str,
    replicas: Option<usize>,
) -> Result<(), RabbitSetupError> {
    let needs = "durable with x-queue-type = quorum and x-single-active-consumer = true";
    let e = match try_declare(conn, queue, replicas).await? {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    if replicas.is_none()
        && soft_error(&e) == Some(AMQPSoftError::PRECONDITIONFAILED)
        && let Some(size) = created_group_size(&e.to_string())
    {
        return try_declare(conn, queue, Some(size))
            .await?
            .map_err(|e| mismatch_or("queue", queue, &e, needs));
    }
    Err(mismatch_or("queue", queue, &e, needs))
}

/// One declare of `queue` on a channel of its own (a refusal closes it):
/// the outer error is the channel's, the inner the declare's.
async fn try_declare(
    conn: &Connection,
    queue: &str,
    replicas: Option<usize>,
) -> Result<lapin::Result<()>, RabbitSetupError> {
    let ch = channel(conn, "queue", queue).await?;
    Ok(ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            queue_arguments(replicas),
        )
        .await
        .map(|_| ()))
}

/// The initial group size an inequivalence error says a queue has, from
/// RabbitMQ's text: `inequivalent arg 'x-quorum-initial-group-size' ...
/// current is the value '3' ...`.
fn created_group_size(text: &str) -> Option<usize> {
    let rest = text.split("'x-quorum-initial-group-size'").nth(1)?;
    let value = rest.split("current is the value '").nth(1)?;
    value.split('\'').next()?.parse().ok()
}

async fn channel(
    conn: &Connection,
    what: &'static str,
    name: &str,
) -> Result<Channel, RabbitSetupError> {
    conn.create_channel()
        .await
        .map_err(|e| topology(what, name, &e))
}

fn topology(what: &'static str, name: &str, e: &lapin::Error) -> RabbitSetupError {
    let reason = match soft_error(e) {
        Some(AMQPSoftError::ACCESSREFUSED) => format!(
            "{e}; the user needs configure, write and read permissions on it in this virtual host"
        ),
        _ => e.to_string(),
    };
    RabbitSetupError::Topology {
        what,
        name: name.to_string(),
        reason,
        transient: e.is_io_error()
            || matches!(
                e.kind(),
                lapin::ErrorKind::InvalidConnectionState(_)
                    | lapin::ErrorKind::InvalidChannelState(..)
                    | lapin::ErrorKind::MissingHeartbeatError
            ),
    }
}

fn mismatch_or(
    what: &'static str,
    name: &str,
    e: &lapin::Error,
    needs: &'static str,
) -> RabbitSetupError {
    if soft_error(e) == Some(AMQPSoftError::PRECONDITIONFAILED) {
        RabbitSetupError::Mismatch {
            what,
            name: name.to_string(),
            reason: e.to_string(),
            needs,
        }
    } else {
        topology(what, name, e)
    }
}

/// Deletes each topic's exchange and partition queues, and the messages in
/// them (tests and benchmarks start from nothing; outboxd itself never
/// deletes one).
pub async fn delete_topology(
    conn: &Connection,
    topics: &[String],
    partitions: i32,
) -> Result<(), RabbitSetupError> {
    use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
    for topic in topics {
        for partition in 0..partitions.max(1) {
            let queue = queue_name(topic, partition);
            let ch = channel(conn, "queue", &queue).await?;
            ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await
                .map_err(|e| topology("queue", &queue, &e))?;
        }
        let exchange = exchange_name(topic);
        let ch = channel(conn, "exchange", &exchange).await?;
        ch.exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
            .await
            .map_err(|e| topology("exchange", &exchange, &e))?;
    }
    Ok(())
}

/// Connects, then checks (or creates) every topic's exchange and queues:
/// what `outboxd run` does before it starts.
pub async fn start(
    cfg: &RabbitSection,
    topics: &BTreeSet<String>,
    partitions: i32,
    create: Option<usize>,
) -> Result<Connection, RabbitSetupError> {
    let conn = connect(cfg).await?;
    check_topology(&conn, topics, partitions, create).await?;
    Ok(conn)
}

/// The AMQP headers of `msg`: its own (each a long string, which carries
/// any bytes) and the key.
pub fn headers_of(msg: &OutgoingMessage) -> FieldTable {
    let mut h = FieldTable::default();
    for (k, v) in &msg.headers {
        h.insert(
            ShortString::from(k.as_str()),
            AMQPValue::LongString(LongString::from(v.clone())),
        );
    }
    h.insert(
        KEY_HEADER.into(),
        AMQPValue::LongString(LongString::from(msg.key.clone())),
    );
    h
}

/// Publishes on one confirm-mode channel and waits for each confirm. A
/// channel the server closed (a missing exchange, an oversized message) or
/// a lost connection is opened again on the next publish.
pub struct RabbitPublisher {
    cfg: RabbitSection,
    partitions: i32,
    ack_timeout: Duration,
    link: Mutex<Option<(Connection, Channel)>>,
}

impl std::fmt::Debug for RabbitPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitPublisher")
            .field("url", &self.cfg.redacted_url())
            .field("partitions", &self.partitions)
            .finish()
    }
}

impl RabbitPublisher {
    /// A publisher that uses `conn` first (the one the start checks used,
    /// if given) and connects again from `cfg` when it is lost.
    pub async fn new(
        cfg: &RabbitSection,
        conn: Option<Connection>,
        partitions: i32,
        ack_timeout: Duration,
    ) -> Result<Self, RabbitSetupError> {
        let conn = match conn {
            Some(c) => c,
            None => connect(cfg).await?,
        };
        let ch = confirm_channel(&conn)
            .await
            .map_err(|e| topology("channel", "publisher", &e))?;
        Ok(Self {
            cfg: cfg.clone(),
            partitions: partitions.max(1),
            ack_timeout,
            link: Mutex::new(Some((conn, ch))),
        })
    }

    /// The channel to publish on, opening a connection or a channel again
    /// when the last one was closed.
    async fn channel(&self) -> Result<Channel, PublishError> {
        let mut link = self.link.lock().await;
        if let Some((conn, ch)) = link.as_mut() {
            if ch.status().connected() {
                return Ok(ch.clone());
            }
            if conn.status().connected() {
                match confirm_channel(conn).await {
                    Ok(fresh) => {
                        *ch = fresh.clone();
                        return Ok(fresh);
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot open a RabbitMQ channel; reconnecting")
                    }
                }
            }
        }
        *link = None;
        let conn = connect(&self.cfg)
            .await
            .map_err(|e| PublishError::Retryable(e.to_string()))?;
        let ch = confirm_channel(&conn)
            .await
            .map_err(|e| PublishError::Retryable(format!("RabbitMQ channel: {e}")))?;
        *link = Some((conn, ch.clone()));
        Ok(ch)
    }

    /// Whether the server answers (for the readiness probe).
    pub async fn check(&self) -> Result<(), String> {
        self.channel()
            .await
            .map(|_| ())
            .map_err(|e| format!("RabbitMQ does not answer: {e}"))
    }
}

async fn confirm_channel(conn: &Connection) -> lapin::Result<Channel> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    Ok(ch)
}

impl Publisher for RabbitPublisher {
    async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        let partition = partition_for(&msg.key, self.partitions);
        let exchange = exchange_name(&msg.topic);
        let queue = queue_name(&msg.topic, partition);
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(msg.message_id.to_string().into())
            .with_timestamp(u64::try_from(msg.created_at.timestamp()).unwrap_or(0))
            .with_headers(headers_of(&msg));
        let ch = self.channel().await?;
        let confirm = ch
            .basic_publish(
                exchange.as_str().into(),
                partition.to_string().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                &msg.payload,
                properties,
            )
            .await
            .map_err(|e| publish_error(&e, &msg.topic, &queue))?;
        let confirmation = tokio::time::timeout(self.ack_timeout, confirm)
            .await
            .map_err(|_| {
                PublishError::Retryable(format!(
                    "RabbitMQ sent no confirm within {:?}",
                    self.ack_timeout
                ))
            })?
            .map_err(|e| publish_error(&e, &msg.topic, &queue))?;
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) => Err(PublishError::TopicMissing {
                topic: format!(
                    "{} (no queue took it: {} {}; queue `{queue}` must be bound to exchange \
                     `{exchange}` with routing key `{partition}`)",
                    msg.topic, returned.reply_code, returned.reply_text
                ),
            }),
            Confirmation::Nack(_) => Err(PublishError::Retryable(format!(
                "RabbitMQ refused the message (nack) on exchange `{exchange}`; the queue may be \
                 full or unavailable"
            ))),
            Confirmation::NotRequested => Err(PublishError::Retryable(
                "the channel was not in confirm mode".into(),
            )),
        }
    }
}

fn publish_error(e: &lapin::Error, topic: &str, queue: &str) -> PublishError {
    let text = e.to_string();
    match soft_error(e) {
        Some(AMQPSoftError::NOTFOUND) => PublishError::TopicMissing {
            topic: format!("{topic} (RabbitMQ exchange `{topic}`)"),
        },
        Some(AMQPSoftError::PRECONDITIONFAILED) if text.contains("max size") => {
            PublishError::Permanent(format!(
                "the message is larger than RabbitMQ's max_message_size: {text}"
            ))
        }
        _ => PublishError::Retryable(format!("RabbitMQ publish to queue `{queue}`: {text}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_group_size_a_queue_was_created_with_is_read_from_the_refusal() {
        let text = "PRECONDITION_FAILED - inequivalent arg 'x-quorum-initial-group-size' for \
                    queue 'o.0' in vhost '/': received none but current is the value '3' of \
                    type 'signedint'";
        assert_eq!(created_group_size(text), Some(3));
        assert_eq!(
            created_group_size("inequivalent arg 'x-queue-type' for queue 'o.0'"),
            None
        );
    }

    #[test]
    fn a_connection_lost_during_the_checks_is_retried_a_refusal_is_not() {
        let lost = lapin::Error::from(std::io::Error::other("connection aborted"));
        assert!(topology("queue", "orders.3", &lost).is_transient());
        let e = mismatch_or("queue", "orders.3", &lost, "durable");
        assert!(e.is_transient(), "{e}");
        let refused = RabbitSetupError::QueueMissing {
            queue: "orders.3".into(),
            topic: "orders".into(),
        };
        assert!(!refused.is_transient());
    }

    #[test]
    fn headers_carry_the_key_and_any_bytes() {
        let msg = OutgoingMessage {
            topic: "orders".into(),
            key: vec![0xff, b'k'],
            payload: b"{}".to_vec(),
            headers: vec![
                ("message-id".into(), b"m-1".to_vec()),
                ("bin".into(), vec![0, 1, 2]),
            ],
            message_id: uuid::Uuid::nil(),
            created_at: chrono::Utc::now(),
        };
        let h = headers_of(&msg);
        let get = |k: &str| match h.inner().get(k) {
            Some(AMQPValue::LongString(s)) => s.as_bytes().to_vec(),
            other => panic!("{k}: {other:?}"),
        };
        assert_eq!(get(KEY_HEADER), vec![0xff, b'k']);
        assert_eq!(get("bin"), vec![0, 1, 2]);
        assert_eq!(get("message-id"), b"m-1".to_vec());
    }
}
