//! One typed configuration: a TOML file, then `OUTBOXD__SECTION__KEY`
//! environment overrides, then command-line flags. Unknown keys are errors,
//! and every error names the key and what is wrong with it.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

mod consumer;
pub mod duration;
mod env;
mod kafka;
pub mod nats;
mod ops;
mod outbound;
mod plugins;
mod pool;
pub mod rabbitmq;
pub mod redis;
mod telemetry;
mod validate;
pub mod webhook;

pub use consumer::{ConsumerSection, HandlerRef, OnDead, TableGrants, TxnPolicy};
pub use env::is_secret;
use env::{apply_env, syntax_message};
pub use kafka::{INSTANCE_ID_ENV, NewTopics, TopicsSection};
pub use nats::{NatsSecret, NatsSection};
pub use ops::{ReconcileRule, RetentionConfig};
pub use outbound::{
    HttpLimits, OUTBOUND_HOST_SHAPE, OutboundHost, OutboundScheme, split_host_port,
};
pub use plugins::{Limits, PluginSource, PluginSpec};
pub use pool::PoolBudget;
pub use rabbitmq::{RabbitSecret, RabbitSection, RabbitUrl};
pub use redis::{RedisSecret, RedisSection, RedisUrl};
pub use telemetry::{TelemetryConfig, endpoint_problem};

use crate::backoff::Backoff;
use crate::route::Route;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub database: DatabaseConfig,
    #[serde(default)]
    pub transport: TransportConfig,
    #[serde(default)]
    pub relay: RelaySection,
    /// Event type pattern → transformer chain → topic; the first match wins.
    #[serde(default)]
    pub routes: Vec<Route>,
    /// Transformer plugins that routes may name.
    #[serde(default)]
    pub plugins: Vec<PluginSpec>,
    #[serde(default)]
    pub plugin_runtime: PluginRuntimeSection,
    #[serde(default)]
    pub consumers: Vec<ConsumerSection>,
    #[serde(default)]
    pub log: LogConfig,
    #[serde(default)]
    pub retention: RetentionConfig,
    /// Queries that find business rows missing their event.
    #[serde(default)]
    pub reconcile: Vec<ReconcileRule>,
    #[serde(default)]
    pub admin: AdminConfig,
    /// The probes and `/metrics` on a listener of their own, without a
    /// token: off unless `listen` is set.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// OpenTelemetry traces: off unless an OTLP endpoint is set.
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// Deprecated keys this config used, each with the key to write
    /// instead; the host logs them at start.
    #[serde(skip)]
    pub deprecations: Vec<String>,
}

/// The admin HTTP API and dashboard: off by default, loopback by default,
/// and a bearer token is required whenever it is on.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default = "default_admin_listen")]
    pub listen: String,
    /// Prefer OUTBOXD__ADMIN__TOKEN to writing it in the file.
    #[serde(default)]
    pub token: Option<String>,
    /// A read-only bearer token for scraping: it reaches `/metrics` on the
    /// admin listener and nothing else. Prefer
    /// OUTBOXD__ADMIN__METRICS_TOKEN to writing it in the file.
    #[serde(default)]
    pub metrics_token: Option<String>,
    /// How often the dashboard's history samples the outbox, in seconds.
    #[serde(default = "default_sample_seconds")]
    pub sample_seconds: u64,
    /// How often reconciliation rules run inside `outboxd run`; 0 = never.
    #[serde(default)]
    pub reconcile_interval_seconds: u64,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            listen: default_admin_listen(),
            token: None,
            metrics_token: None,
            sample_seconds: default_sample_seconds(),
            reconcile_interval_seconds: 0,
        }
    }
}

fn default_admin_listen() -> String {
    "127.0.0.1:9464".into()
}

/// `[metrics]`: `/healthz`, `/readyz` and `/metrics` on a listener of their
/// own, without a token, for a platform's probes and a Prometheus scrape.
/// Off unless `listen` is set (127.0.0.1:9465 beside the admin API's
/// 127.0.0.1:9464, or 0.0.0.0:9465 for probes from outside the host); it
/// serves nothing else.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    #[serde(default)]
    pub listen: Option<String>,
}

fn default_sample_seconds() -> u64 {
    5
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    /// `sqlite://PATH` (the embedded default) or `postgres://USER@HOST/DB`.
    #[serde(default = "default_db_url")]
    pub url: String,
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// Apply pending migrations when `outboxd run` starts.
    #[serde(default = "yes")]
    pub migrate_on_start: bool,
    /// SQLite only: when a commit reaches the disk.
    #[serde(default)]
    pub sqlite_synchronous: SqliteSynchronous,
}

/// `database.sqlite_synchronous`: SQLite's `synchronous` setting in WAL
/// mode, the trade between commit latency and what a power loss may undo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSynchronous {
    /// Every commit is on disk when it returns (an fsync per commit): a
    /// power loss undoes nothing that committed. The default.
    #[default]
    Full,
    /// Commits reach the disk at checkpoints: a crash of the process loses
    /// nothing, but a power loss or OS crash may undo the last commits
    /// (all of them together, in commit order, so the outbox, the embedded
    /// transport and the inbox stay consistent with each other; an event
    /// already published to an external broker may then have no row).
    Normal,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: default_db_url(),
            max_connections: default_max_connections(),
            migrate_on_start: true,
            sqlite_synchronous: SqliteSynchronous::Full,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    #[default]
    Embedded,
    Kafka,
    /// NATS JetStream ([`NatsSection`]).
    Nats,
    /// RabbitMQ ([`RabbitSection`]).
    Rabbitmq,
    /// Redis Streams ([`RedisSection`]).
    Redis,
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportConfig {
    #[serde(default)]
    pub kind: TransportKind,
    /// Partitions per topic of the embedded transport.
    #[serde(default = "default_partitions")]
    pub partitions: i32,
    /// Embedded transport: how long a consumer owns a partition without
    /// renewing; a crashed consumer's partitions move after this.
    #[serde(
        rename = "consumer_lease",
        alias = "consumer_lease_ms",
        default = "default_consumer_lease",
        deserialize_with = "duration::keys::consumer_lease"
    )]
    pub consumer_lease: Duration,
    /// librdkafka properties, passed through as they are
    /// (`bootstrap.servers`, `security.protocol`, `sasl.*` ...). A number or
    /// a boolean (`session.timeout.ms = 6000`, or the same from the
    /// environment) is taken as its text, as librdkafka reads every value.
    /// A secret property may instead name where outboxd reads it:
    /// `"sasl.password_env"` / `"sasl.password_file"` (likewise
    /// `ssl.key.password`); loading replaces those keys with the property.
    #[serde(default, deserialize_with = "kafka_properties")]
    pub kafka: std::collections::BTreeMap<String, String>,
    /// Kafka, NATS, RabbitMQ and Redis: whether `outboxd run` creates the
    /// topics (NATS: the streams; RabbitMQ: the exchanges and partition
    /// queues; Redis: the partition streams) it needs.
    #[serde(default)]
    pub topics: TopicsSection,
    /// NATS JetStream: the server, credentials, TLS and ack settings.
    #[serde(default)]
    pub nats: NatsSection,
    /// RabbitMQ: the server, credentials, TLS and prefetch.
    #[serde(default)]
    pub rabbitmq: RabbitSection,
    /// Redis Streams: the server, password, TLS, stream length and reads.
    #[serde(default)]
    pub redis: RedisSection,
}

impl std::fmt::Debug for TransportConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The Kafka properties may hold secrets: their values are masked.
        let kafka: std::collections::BTreeMap<&str, &str> = self
            .kafka
            .iter()
            .map(|(k, v)| (k.as_str(), if is_secret(k) { "***" } else { v.as_str() }))
            .collect();
        f.debug_struct("TransportConfig")
            .field("kind", &self.kind)
            .field("partitions", &self.partitions)
            .field("consumer_lease", &self.consumer_lease)
            .field("kafka", &kafka)
            .field("topics", &self.topics)
            .field("nats", &self.nats)
            .field("rabbitmq", &self.rabbitmq)
            .field("redis", &self.redis)
            .finish()
    }
}

/// librdkafka properties: each value a string, a number or a boolean, kept
/// as text; a table or a list is refused, naming the property.
fn kafka_properties<'de, D>(d: D) -> Result<std::collections::BTreeMap<String, String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::de::Error;
    let raw: std::collections::BTreeMap<String, toml::Value> = Deserialize::deserialize(d)?;
    raw.into_iter()
        .map(|(k, v)| {
            let text = match v {
                toml::Value::String(s) => s,
                toml::Value::Integer(n) => n.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => {
                    return Err(D::Error::custom(format!(
                        "librdkafka property `{k}` is a {}; give it as text, e.g. {k} = \"...\"",
                        other.type_str()
                    )));
                }
            };
            Ok((k, text))
        })
        .collect()
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            kind: TransportKind::Embedded,
            partitions: default_partitions(),
            consumer_lease: default_consumer_lease(),
            kafka: Default::default(),
            topics: TopicsSection::default(),
            nats: NatsSection::default(),
            rabbitmq: RabbitSection::default(),
            redis: RedisSection::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaySection {
    #[serde(default = "default_batch")]
    pub batch_size: usize,
    #[serde(
        rename = "poll_interval",
        alias = "poll_interval_ms",
        default = "default_poll_interval",
        deserialize_with = "duration::keys::poll_interval"
    )]
    pub poll_interval: Duration,
    #[serde(
        rename = "publish_timeout",
        alias = "publish_timeout_ms",
        default = "default_publish_timeout",
        deserialize_with = "duration::keys::publish_timeout"
    )]
    pub publish_timeout: Duration,
    #[serde(default = "default_max_attempts")]
    pub max_attempts: i32,
    /// Relay tasks in this process; 0 for a consumer-only process (relays
    /// and consumers scale separately).
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// SQLite only: how long a claim outlives the relay task that took it.
    /// A batch in flight renews its lease every third of this, so plugin
    /// chains and a publish may take longer; a crashed task's rows are
    /// claimable again this long after its last renewal.
    #[serde(
        rename = "lease",
        alias = "lease_ms",
        default = "default_lease",
        deserialize_with = "duration::keys::lease"
    )]
    pub lease: Duration,
    #[serde(default)]
    pub backoff: Backoff,
    /// Claim and send the next batch while the previous one is marked:
    /// faster, but a crash republishes up to two batches instead of one.
    #[serde(default)]
    pub pipeline: bool,
    /// Where the relay finds new events: `poll` (the claim query; the
    /// default, and the only source on SQLite) or `wal` (Postgres's logical
    /// replication stream, see [`WalSection`]).
    #[serde(default)]
    pub source: RelaySource,
    #[serde(default)]
    pub wal: WalSection,
}

/// `relay.source`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RelaySource {
    #[default]
    Poll,
    Wal,
}

/// `[relay.wal]`: the logical replication slot and publication the WAL
/// relay reads (Postgres only).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WalSection {
    /// The replication slot (`pgoutput`). Slots belong to the whole
    /// cluster: give each database its own name.
    #[serde(default = "default_wal_slot")]
    pub slot: String,
    /// The publication on the outbox table (`publish = 'insert'`).
    #[serde(default = "default_wal_publication")]
    pub publication: String,
    /// How often a standby (a process whose slot another one reads) tries
    /// to take the slot over. Default 1s.
    #[serde(
        default = "default_wal_standby_retry",
        deserialize_with = "duration::keys::wal_standby_retry"
    )]
    pub standby_retry: Duration,
    /// `wal_sender_timeout` for the replication connection: how long the
    /// server keeps a silent reader's slot after a network partition before
    /// a standby may take it. Default 10s.
    #[serde(
        default = "default_wal_sender_timeout",
        deserialize_with = "duration::keys::wal_sender_timeout"
    )]
    pub sender_timeout: Duration,
    /// How often the reader reports its flushed position. Default 1s.
    #[serde(
        default = "default_wal_status_interval",
        deserialize_with = "duration::keys::wal_status_interval"
    )]
    pub status_interval: Duration,
    /// Past this much WAL between the server's end and the slot's confirmed
    /// position, the relay stops reading the slot and polls instead, and
    /// says so (error log, `outboxd_relay_wal_fallback`). Default 1 GiB.
    #[serde(default = "default_wal_max_lag_bytes")]
    pub max_lag_bytes: u64,
}

impl Default for WalSection {
    fn default() -> Self {
        Self {
            slot: default_wal_slot(),
            publication: default_wal_publication(),
            standby_retry: default_wal_standby_retry(),
            sender_timeout: default_wal_sender_timeout(),
            status_interval: default_wal_status_interval(),
            max_lag_bytes: default_wal_max_lag_bytes(),
        }
    }
}

fn default_wal_slot() -> String {
    "outboxd".into()
}
fn default_wal_publication() -> String {
    "outboxd_outbox".into()
}
fn default_wal_standby_retry() -> Duration {
    Duration::from_secs(1)
}
fn default_wal_sender_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_wal_status_interval() -> Duration {
    Duration::from_secs(1)
}
fn default_wal_max_lag_bytes() -> u64 {
    1 << 30
}

impl Default for RelaySection {
    fn default() -> Self {
        Self {
            batch_size: default_batch(),
            poll_interval: default_poll_interval(),
            publish_timeout: default_publish_timeout(),
            max_attempts: default_max_attempts(),
            workers: default_workers(),
            lease: default_lease(),
            backoff: Backoff::default(),
            pipeline: false,
            source: RelaySource::Poll,
            wal: WalSection::default(),
        }
    }
}

fn one() -> usize {
    1
}
fn five() -> u32 {
    5
}

/// Engine-wide plugin settings.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PluginRuntimeSection {
    /// Where compiled components are cached (by sha256). Unset means the
    /// default directory ([`CacheDir::Default`]), a string is a directory,
    /// and `false` compiles at every start.
    #[serde(default)]
    pub cache_dir: CacheDir,
    /// Use wasmtime's pooling instance allocator.
    #[serde(default)]
    pub pooling: bool,
    /// How often registry plugins are re-read when no Postgres notification
    /// arrives (SQLite relies on this alone). Default 1s.
    #[serde(
        rename = "registry_poll",
        alias = "registry_poll_ms",
        default,
        deserialize_with = "duration::keys::registry_poll"
    )]
    pub registry_poll: Option<Duration>,
    /// Development mode: every `NAME.wasm` dropped in this directory is
    /// deployed to the registry as plugin NAME and activated.
    #[serde(default)]
    pub watch_dir: Option<std::path::PathBuf>,
}

/// `plugin_runtime.cache_dir`: compiled components are cached by default,
/// because an 18 MB Python component takes seconds (release) to minutes
/// (debug) to compile, and a restart after a crash would wait for it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CacheDir {
    /// `$XDG_CACHE_HOME/outboxd/components`, else
    /// `$HOME/.cache/outboxd/components`, else a directory next to the
    /// SQLite file; created private (0700).
    #[default]
    Default,
    /// `cache_dir = false`: compile at every start.
    Off,
    /// `cache_dir = "PATH"`.
    Dir(std::path::PathBuf),
}

impl<'de> Deserialize<'de> for CacheDir {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Flag(bool),
            Path(std::path::PathBuf),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "expected a directory (a string), true for the default directory, or false to turn the cache off",
            )
        })? {
            Raw::Flag(true) => Ok(CacheDir::Default),
            Raw::Flag(false) => Ok(CacheDir::Off),
            Raw::Path(p) if p.as_os_str().is_empty() => Err(serde::de::Error::custom(
                "an empty path; give a directory, or false to turn the cache off",
            )),
            Raw::Path(p) => Ok(CacheDir::Dir(p)),
        }
    }
}

impl CacheDir {
    /// The directory to use, if any, for a host whose database is
    /// `database_url`. The plugin engine creates it private and refuses it
    /// when others can write to it (the host's `plugin::runtime::cache::prepare_dir`).
    pub fn resolve(&self, database_url: &str) -> Option<std::path::PathBuf> {
        match self {
            CacheDir::Off => None,
            CacheDir::Dir(p) => Some(p.clone()),
            CacheDir::Default => default_cache_dir(database_url),
        }
    }
}

fn default_cache_dir(database_url: &str) -> Option<std::path::PathBuf> {
    let user_cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| std::path::PathBuf::from(h).join(".cache"))
        });
    if let Some(dir) = user_cache {
        return Some(dir.join("outboxd").join("components"));
    }
    let file = database_url
        .strip_prefix("sqlite://")
        .or_else(|| database_url.strip_prefix("sqlite:"))?;
    let file = file.split('?').next().unwrap_or(file);
    if file.is_empty() || file == ":memory:" {
        return None;
    }
    let mut dir = std::path::PathBuf::from(file).into_os_string();
    dir.push(".components");
    Some(dir.into())
}

impl PluginRuntimeSection {
    /// How often registry plugins are re-read (at least every 10 ms).
    pub fn registry_poll_every(&self) -> Duration {
        self.registry_poll
            .unwrap_or(Duration::from_secs(1))
            .max(Duration::from_millis(10))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Human,
    Json,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    #[serde(default)]
    pub format: LogFormat,
}

fn default_db_url() -> String {
    "sqlite://outboxd.db".into()
}
fn default_max_connections() -> u32 {
    8
}
fn yes() -> bool {
    true
}
fn default_partitions() -> i32 {
    8
}
fn default_consumer_lease() -> Duration {
    Duration::from_secs(15)
}
fn default_batch() -> usize {
    100
}
fn default_poll_interval() -> Duration {
    Duration::from_millis(500)
}
fn default_publish_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_max_attempts() -> i32 {
    10
}
fn default_workers() -> usize {
    2
}
fn default_lease() -> Duration {
    Duration::from_secs(30)
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {message}")]
    Syntax { path: String, message: String },
    #[error("config key `{key}`: {message}")]
    Key { key: String, message: String },
}

impl Config {
    /// Defaults, then `path` if given, then the environment.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let (origin, text) = match path {
            Some(p) => (
                p.display().to_string(),
                std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.display().to_string(),
                    source,
                })?,
            ),
            None => ("(defaults)".to_string(), String::new()),
        };
        Self::from_toml(&origin, &text, env)
    }

    pub fn from_toml(
        origin: &str,
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut table: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| ConfigError::Syntax {
                    path: origin.to_string(),
                    message: syntax_message(text, &e),
                })?;
        // Read twice: for the `OUTBOXD__…` overrides, and for the secrets and
        // instance ids outboxd reads from named variables.
        let env: Vec<(String, String)> = env.into_iter().collect();
        apply_env(&mut table, env.iter().cloned())?;
        duration::take_deprecations();
        let mut config: Config = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|e| {
                let key = e.path().to_string();
                // serde quotes the offending value; for a secret that could
                // be the secret itself.
                let secret = key == "database.url" || key.rsplit('.').next().is_some_and(is_secret);
                ConfigError::Key {
                    message: if secret {
                        "must be a string (the value is not shown: it may be a secret)".into()
                    } else {
                        e.into_inner().to_string()
                    },
                    key: if key == "." {
                        "(top level)".into()
                    } else {
                        key
                    },
                }
            })?;
        config.deprecations = duration::take_deprecations();
        match config.transport.kind {
            TransportKind::Kafka => kafka::resolve_secrets(&mut config.transport.kafka, &env)?,
            TransportKind::Nats => config.transport.nats.resolve_secrets(&env)?,
            TransportKind::Rabbitmq => config.transport.rabbitmq.resolve_secrets(&env)?,
            TransportKind::Redis => config.transport.redis.resolve_secrets(&env)?,
            TransportKind::Embedded => {}
        }
        for (i, r) in config.routes.iter_mut().enumerate() {
            if let Some(sink) = &mut r.webhook {
                sink.resolve_secret(&format!("routes[{i}].webhook"), &env)?;
            }
        }
        kafka::resolve_instance_ids(&mut config, &env)?;
        config.validate()?;
        Ok(config)
    }

    /// The config with `database.url` replaced (the `--database-url` flag),
    /// validated again: several checks depend on the kind of database (the
    /// SQLite relay lease, the Postgres LISTEN connections of the pool).
    pub fn with_database_url(mut self, url: &str) -> Result<Self, ConfigError> {
        self.database.url = url.to_string();
        self.validate()?;
        Ok(self)
    }

    /// The config with secrets masked, for logs and `--help` output.
    pub fn redacted_kafka(&self) -> Vec<(String, String)> {
        self.transport
            .kafka
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    if is_secret(k) {
                        "***".into()
                    } else {
                        v.clone()
                    },
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod cache_dir_tests {
    use super::{CacheDir, Config};

    fn parse(toml: &str) -> CacheDir {
        Config::from_toml("t.toml", toml, std::iter::empty())
            .expect("valid")
            .plugin_runtime
            .cache_dir
    }

    #[test]
    fn the_cache_is_on_by_default_and_false_turns_it_off() {
        assert_eq!(parse(""), CacheDir::Default);
        assert_eq!(
            parse("[plugin_runtime]\ncache_dir = true\n"),
            CacheDir::Default
        );
        assert_eq!(
            parse("[plugin_runtime]\ncache_dir = false\n"),
            CacheDir::Off
        );
        assert_eq!(
            parse("[plugin_runtime]\ncache_dir = \"/srv/c\"\n"),
            CacheDir::Dir("/srv/c".into())
        );
        assert_eq!(CacheDir::Off.resolve("sqlite://x.db"), None);
        assert!(CacheDir::Default.resolve("sqlite://x.db").is_some());
    }

    #[test]
    fn a_bad_cache_dir_names_the_key() {
        let err = Config::from_toml(
            "t.toml",
            "[plugin_runtime]\ncache_dir = 3\n",
            std::iter::empty(),
        )
        .expect_err("a number is no directory");
        let text = err.to_string();
        assert!(
            text.contains("plugin_runtime.cache_dir") && text.contains("false"),
            "{text}"
        );
    }
}
