//! Redis Streams: the only module that links redis (redis-rs).
//!
//! A route topic's partition is one stream, `TOPIC:PARTITION`
//! ([`stream_key`]), the partition from the key's hash as on the embedded
//! transport. The relay appends with `XADD … NOMKSTREAM MAXLEN ~ N`, fields
//! `id` (the message id), `key`, `payload` and one `h:NAME` per header
//! (Redis fields are binary, so a header or key may hold any bytes); the
//! XADD's reply is the acknowledgement. The relay publishes a batch
//! concurrently over one multiplexed connection, so its XADDs travel as one
//! pipeline. Redis has no duplicate window: a batch published again after a
//! relay crash is in the stream twice, and the consumers' inbox drops the
//! second copy by its message id. Consumers ([`consumer`]) read each
//! partition's stream through a consumer group, leased to one member at a
//! time.

pub mod consumer;

use std::collections::BTreeSet;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{RedisError, Value};

use super::{PublishError, Publisher};
use crate::broker::embedded::partition_for;
use crate::message::OutgoingMessage;
use outboxd_core::config::RedisSection;
use outboxd_core::config::redis::stream_key;

pub use consumer::{RedisConsumer, RedisConsumerConfig, messages_behind};

/// The entry field that carries the message id.
pub const ID_FIELD: &str = "id";
/// The entry field that carries the message's key.
pub const KEY_FIELD: &str = "key";
/// The entry field that carries the payload.
pub const PAYLOAD_FIELD: &str = "payload";
/// Each header is the field `h:NAME`.
pub const HEADER_PREFIX: &str = "h:";

/// Why Redis could not be set up; each names the setting to fix.
#[derive(Debug, thiserror::Error)]
pub enum RedisSetupError {
    #[error(
        "cannot connect to Redis at {url}: {reason}; check transport.redis.url and that \
         redis-server runs there"
    )]
    Connect {
        /// Shown with its password as `***`.
        url: String,
        reason: String,
        /// The server did not answer (refused, timed out, still loading its
        /// data): worth another try at start. A refused password or TLS
        /// handshake is not.
        transient: bool,
    },
    #[error(
        "Redis at {url} refused the login ({reason}); check the password in \
         transport.redis.password_env or password_file (or the URL's), and the ACL user in \
         transport.redis.url"
    )]
    Auth { url: String, reason: String },
    #[error(
        "transport.redis.ca_file `{path}`: {reason}; point it at the PEM file of the CA that \
         signed the server's certificate"
    )]
    CaFile { path: String, reason: String },
    #[error(
        "Redis stream `{stream}` (topic `{topic}`) does not exist; start outboxd with \
         [transport.topics] create = true, or create it (XGROUP CREATE {stream} outboxd $ \
         MKSTREAM)"
    )]
    StreamMissing { stream: String, topic: String },
    #[error(
        "Redis key `{stream}` (topic `{topic}`) is a {kind}, not a stream; delete the key or \
         rename the topic"
    )]
    NotAStream {
        stream: String,
        topic: String,
        kind: String,
    },
    #[error(
        "Redis stream `{stream}` (topic `{topic}`) holds entries outboxd did not write (entry \
         {entry} {why}); give the topic a stream of its own (rename the topic), or delete the \
         stream (DEL {stream}) if its entries are not needed"
    )]
    Foreign {
        stream: String,
        topic: String,
        entry: String,
        why: String,
    },
    #[error("Redis stream `{stream}`: {reason}")]
    Stream { stream: String, reason: String },
    /// The server stopped answering during the start's checks: worth
    /// another try at start.
    #[error("Redis stream `{stream}`: {reason}; the server stopped answering")]
    Unanswered { stream: String, reason: String },
}

impl RedisSetupError {
    /// Whether `outboxd run` tries the start again (the server did not
    /// answer yet).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            RedisSetupError::Connect {
                transient: true,
                ..
            } | RedisSetupError::Unanswered { .. }
        )
    }
}

/// Where a Redis server is and how to log in, shared by the publisher and
/// the consumers of a process; each [`Client::connect`] opens a connection
/// of its own (a consumer's blocking reads must not hold up the relay's
/// writes).
#[derive(Clone)]
pub struct Client {
    client: ::redis::Client,
    /// The URL as logs and errors show it.
    url: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("url", &self.url).finish()
    }
}

/// A connection that reconnects after a loss (the command that saw the loss
/// fails; the next one goes over a new connection).
pub type Connection = ConnectionManager;

impl Client {
    /// The server's URL with its password as `***`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A connection of its own whose replies may take `response_timeout`,
    /// checked with a PING (a refused login shows here).
    pub async fn connect(&self, response_timeout: Duration) -> Result<Connection, RedisSetupError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(response_timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let mut conn = ConnectionManager::new_with_config(self.client.clone(), config)
            .await
            .map_err(|e| self.connect_error(e))?;
        // A server that wants a password and got none answers the first
        // command with NOAUTH.
        ::redis::cmd("PING")
            .query_async::<Value>(&mut conn)
            .await
            .map_err(|e| self.connect_error(e))?;
        Ok(conn)
    }

    fn connect_error(&self, e: RedisError) -> RedisSetupError {
        let text = e.to_string();
        let lower = text.to_ascii_lowercase();
        let code = e.code().unwrap_or_default();
        if e.kind() == ::redis::ErrorKind::AuthenticationFailed
            || matches!(code, "WRONGPASS" | "NOAUTH" | "NOPERM")
            || lower.contains("authentication")
        {
            return RedisSetupError::Auth {
                url: self.url.clone(),
                reason: code_or(&e, "authentication failed"),
            };
        }
        let tls = lower.contains("certificate") || lower.contains("handshake");
        let reason = if tls {
            format!(
                "TLS failed ({text}); check transport.redis.ca_file and that the server's \
                 certificate names the host in transport.redis.url"
            )
        } else {
            text
        };
        RedisSetupError::Connect {
            url: self.url.clone(),
            transient: !tls && unanswered(&e),
            reason,
        }
    }
}

/// An error's code (`WRONGPASS`, …) or `fallback`, never the server's
/// detail text (a refused login's detail may echo the user).
fn code_or(e: &RedisError, fallback: &str) -> String {
    e.code()
        .map_or_else(|| fallback.to_string(), str::to_string)
}

/// Whether a call failed because the server did not answer (refused, timed
/// out, a lost connection, still loading its data after a restart) rather
/// than refused the command.
fn unanswered(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_connection_dropped()
        || matches!(
            e.code(),
            Some("LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "READONLY")
        )
}

/// The client of the section's URL, password and TLS roots. Opens no
/// connection; no error text holds the password.
pub fn client(cfg: &RedisSection) -> Result<Client, RedisSetupError> {
    // redis-rs builds its TLS config from rustls's process-wide provider,
    // and the tree compiles two (ring, and aws-lc-rs for the replication
    // client), so rustls cannot pick one by itself. ring, as every other
    // TLS client here.
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    let url = cfg.url.to_string();
    let bad_url = |e: RedisError| RedisSetupError::Connect {
        url: url.clone(),
        reason: format!(
            "the URL is not valid ({:?}); write redis://[user@]host:6379[/db] or rediss://…",
            e.kind()
        ),
        transient: false,
    };
    let mut info =
        ::redis::IntoConnectionInfo::into_connection_info(cfg.url.0.trim()).map_err(bad_url)?;
    if let Some(pw) = &cfg.password {
        let settings = info.redis_settings().clone().set_password(&pw.0);
        info = info.set_redis_settings(settings);
    }
    let client = match &cfg.ca_file {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| RedisSetupError::CaFile {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            ::redis::Client::build_with_tls(
                info,
                ::redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem),
                },
            )
            .map_err(|e| RedisSetupError::CaFile {
                path: path.clone(),
                reason: e.to_string(),
            })?
        }
        None => ::redis::Client::open(info).map_err(bad_url)?,
    };
    Ok(Client { client, url })
}

/// Checks that Redis takes the login, then checks (or creates, when
/// `create`) the stream of every partition of every topic in `topics`:
/// what `outboxd run` does before it starts.
pub async fn start(
    cfg: &RedisSection,
    topics: &BTreeSet<String>,
    partitions: i32,
    create: bool,
) -> Result<Client, RedisSetupError> {
    let client = client(cfg)?;
    let mut conn = client.connect(Duration::from_secs(10)).await?;
    check_streams(&mut conn, topics, partitions, create).await?;
    Ok(client)
}

/// Checks at start that each partition's stream of each topic exists and
/// holds only what outboxd writes (its first and last entries are looked
/// at); creates the missing ones, empty, when `create`.
pub async fn check_streams(
    conn: &mut Connection,
    topics: &BTreeSet<String>,
    partitions: i32,
    create: bool,
) -> Result<(), RedisSetupError> {
    let streams: Vec<(String, String)> = topics
        .iter()
        .flat_map(|t| (0..partitions.max(1)).map(move |p| (t.clone(), stream_key(t, p))))
        .collect();
    let first = |i: usize| streams.get(i).map_or(String::new(), |(_, s)| s.clone());
    let mut types = ::redis::pipe();
    for (_, stream) in &streams {
        types.cmd("TYPE").arg(stream);
    }
    let kinds: Vec<String> = types
        .query_async(conn)
        .await
        .map_err(|e| stream_error(&first(0), &e))?;
    let mut ends = ::redis::pipe();
    let mut present = Vec::new();
    for ((topic, stream), kind) in streams.iter().zip(kinds) {
        match kind.as_str() {
            "stream" => {
                ends.cmd("XRANGE")
                    .arg(stream)
                    .arg("-")
                    .arg("+")
                    .arg("COUNT")
                    .arg(1);
                ends.cmd("XREVRANGE")
                    .arg(stream)
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(1);
                present.push((topic, stream));
            }
            "none" if create => {
                // An empty stream: a group made with MKSTREAM, then dropped.
                let made: Result<(), RedisError> = ::redis::pipe()
                    .cmd("XGROUP")
                    .arg("CREATE")
                    .arg(stream)
                    .arg("outboxd-start")
                    .arg("$")
                    .arg("MKSTREAM")
                    .ignore()
                    .cmd("XGROUP")
                    .arg("DESTROY")
                    .arg(stream)
                    .arg("outboxd-start")
                    .ignore()
                    .query_async(conn)
                    .await;
                made.map_err(|e| stream_error(stream, &e))?;
                tracing::info!(%stream, %topic, "created the Redis stream");
            }
            "none" => {
                return Err(RedisSetupError::StreamMissing {
                    stream: stream.clone(),
                    topic: topic.clone(),
                });
            }
            other => {
                return Err(RedisSetupError::NotAStream {
                    stream: stream.clone(),
                    topic: topic.clone(),
                    kind: other.to_string(),
                });
            }
        }
    }
    if present.is_empty() {
        return Ok(());
    }
    let replies: Vec<Value> = ends
        .query_async(conn)
        .await
        .map_err(|e| stream_error(present[0].1, &e))?;
    for (i, reply) in replies.iter().enumerate() {
        let (topic, stream) = present[i / 2];
        for entry in consumer::entries_of(reply) {
            if let Some(why) = foreign(&entry) {
                return Err(RedisSetupError::Foreign {
                    stream: stream.clone(),
                    topic: topic.clone(),
                    entry: entry.id,
                    why,
                });
            }
        }
    }
    Ok(())
}

/// Why an entry is not one outboxd wrote, if it is not: it has no
/// `payload`, or no `id` that is a message id.
fn foreign(entry: &consumer::Entry) -> Option<String> {
    let Some(fields) = &entry.fields else {
        return None;
    };
    let field = |name: &str| fields.iter().find(|(k, _)| k == name.as_bytes());
    if field(PAYLOAD_FIELD).is_none() {
        return Some(format!("has no `{PAYLOAD_FIELD}` field"));
    }
    match field(ID_FIELD) {
        None => Some(format!("has no `{ID_FIELD}` field")),
        Some((_, v))
            if std::str::from_utf8(v)
                .ok()
                .and_then(|s| uuid::Uuid::parse_str(s).ok())
                .is_none() =>
        {
            Some(format!(
                "has an `{ID_FIELD}` field that is not a message id"
            ))
        }
        Some(_) => None,
    }
}

/// Deletes every partition's stream of each of `topics`, and everything in
/// it (tests and benchmarks start from nothing; outboxd itself never
/// deletes one).
pub async fn delete_streams(
    conn: &mut Connection,
    topics: &[String],
    partitions: i32,
) -> Result<(), RedisSetupError> {
    for topic in topics {
        for p in 0..partitions.max(1) {
            let stream = stream_key(topic, p);
            ::redis::cmd("DEL")
                .arg(&stream)
                .query_async::<()>(conn)
                .await
                .map_err(|e| stream_error(&stream, &e))?;
        }
    }
    Ok(())
}

/// A stream check's failure: [`RedisSetupError::Unanswered`] when the
/// server did not answer, else [`RedisSetupError::Stream`].
fn stream_error(stream: &str, e: &RedisError) -> RedisSetupError {
    if unanswered(e) {
        RedisSetupError::Unanswered {
            stream: stream.to_string(),
            reason: e.to_string(),
        }
    } else {
        RedisSetupError::Stream {
            stream: stream.to_string(),
            reason: e.to_string(),
        }
    }
}

/// Appends to each partition's stream and waits for each XADD's reply.
#[derive(Clone)]
pub struct RedisPublisher {
    conn: Connection,
    partitions: i32,
    maxlen: u64,
}

impl std::fmt::Debug for RedisPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPublisher")
            .field("partitions", &self.partitions)
            .field("maxlen", &self.maxlen)
            .finish()
    }
}

impl RedisPublisher {
    /// A publisher over a connection of its own; `ack_timeout` bounds the
    /// wait for one reply.
    pub async fn new(
        client: &Client,
        partitions: i32,
        maxlen: u64,
        ack_timeout: Duration,
    ) -> Result<Self, RedisSetupError> {
        Ok(Self {
            conn: client.connect(ack_timeout).await?,
            partitions: partitions.max(1),
            maxlen,
        })
    }

    /// Whether the server answers (for the readiness probe).
    pub async fn check(&self) -> Result<(), String> {
        let mut conn = self.conn.clone();
        ::redis::cmd("PING")
            .query_async::<Value>(&mut conn)
            .await
            .map(|_| ())
            .map_err(|e| format!("Redis does not answer: {e}"))
    }
}

/// The XADD of `msg` to `stream`: no stream is created (a missing one is
/// an error), the stream trimmed to about `maxlen` entries.
pub fn xadd_of(msg: &OutgoingMessage, stream: &str, maxlen: u64) -> ::redis::Cmd {
    let mut cmd = ::redis::cmd("XADD");
    cmd.arg(stream)
        .arg("NOMKSTREAM")
        .arg("MAXLEN")
        .arg("~")
        .arg(maxlen)
        .arg("*")
        .arg(ID_FIELD)
        .arg(msg.message_id.to_string())
        .arg(KEY_FIELD)
        .arg(&msg.key)
        .arg(PAYLOAD_FIELD)
        .arg(&msg.payload);
    for (k, v) in &msg.headers {
        cmd.arg(format!("{HEADER_PREFIX}{k}")).arg(v);
    }
    cmd
}

impl Publisher for RedisPublisher {
    async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        let stream = stream_key(&msg.topic, partition_for(&msg.key, self.partitions));
        let cmd = xadd_of(&msg, &stream, self.maxlen);
        let mut conn = self.conn.clone();
        let id: Option<String> = cmd
            .query_async(&mut conn)
            .await
            .map_err(|e| publish_error(&e, &msg.topic, &stream))?;
        match id {
            Some(_) => Ok(()),
            // NOMKSTREAM and no stream.
            None => Err(PublishError::TopicMissing {
                topic: format!("{} (Redis stream `{stream}`)", msg.topic),
            }),
        }
    }
}

fn publish_error(e: &RedisError, topic: &str, stream: &str) -> PublishError {
    match e.code() {
        Some("WRONGTYPE") => PublishError::Retryable(format!(
            "Redis key `{stream}` (topic `{topic}`) is not a stream; delete the key or rename \
             the topic"
        )),
        _ => PublishError::Retryable(format!("Redis XADD to `{stream}`: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_carries_the_id_key_payload_and_headers_and_the_stream_is_capped() {
        let m = OutgoingMessage {
            topic: "orders".into(),
            key: vec![0xff, b'k'],
            payload: b"{}".to_vec(),
            headers: vec![("traceparent".into(), b"00-a-b-01".to_vec())],
            message_id: uuid::Uuid::nil(),
            created_at: chrono::Utc::now(),
        };
        let packed = String::from_utf8_lossy(&xadd_of(&m, "orders:3", 5000).get_packed_command())
            .into_owned();
        // RESP: `*N`, then `$LEN` and the argument for each argument.
        let lines: Vec<&str> = packed.split("\r\n").collect();
        let args: Vec<&str> = lines
            .windows(2)
            .filter(|w| w[0].starts_with('$'))
            .map(|w| w[1])
            .collect();
        assert_eq!(
            &args[..7],
            &["XADD", "orders:3", "NOMKSTREAM", "MAXLEN", "~", "5000", "*"]
        );
        assert_eq!(
            &args[7..],
            &[
                "id",
                "00000000-0000-0000-0000-000000000000",
                "key",
                "\u{fffd}k",
                "payload",
                "{}",
                "h:traceparent",
                "00-a-b-01"
            ]
        );
    }

    #[test]
    fn entries_outboxd_did_not_write_are_told_apart() {
        let entry = |fields: &[(&str, &str)]| consumer::Entry {
            id: "1-0".into(),
            fields: Some(
                fields
                    .iter()
                    .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                    .collect(),
            ),
        };
        let ours = entry(&[
            ("id", "00000000-0000-0000-0000-000000000000"),
            ("key", "k"),
            ("payload", "{}"),
        ]);
        assert_eq!(foreign(&ours), None);
        assert!(foreign(&entry(&[("temp", "21")])).is_some_and(|w| w.contains("`payload`")));
        assert!(
            foreign(&entry(&[("id", "7"), ("payload", "x")]))
                .is_some_and(|w| w.contains("not a message id"))
        );
    }
}
