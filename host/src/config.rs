//! One typed configuration: a TOML file, then `OUTBOXD__SECTION__KEY`
//! environment overrides, then command-line flags. Unknown keys are errors,
//! and every error names the key and what is wrong with it.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::plugin::PluginSpec;
use crate::relay::{Backoff, Route};
use crate::store::DbKind;

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
    pub retention: crate::ops::retention::RetentionConfig,
    /// Queries that find business rows missing their event.
    #[serde(default)]
    pub reconcile: Vec<crate::ops::reconcile::ReconcileRule>,
    #[serde(default)]
    pub admin: AdminConfig,
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
            sample_seconds: default_sample_seconds(),
            reconcile_interval_seconds: 0,
        }
    }
}

fn default_admin_listen() -> String {
    "127.0.0.1:9464".into()
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
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: default_db_url(),
            max_connections: default_max_connections(),
            migrate_on_start: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    #[default]
    Embedded,
    Kafka,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportConfig {
    #[serde(default)]
    pub kind: TransportKind,
    /// Partitions per topic of the embedded transport.
    #[serde(default = "default_partitions")]
    pub partitions: i32,
    /// Embedded transport: how long a consumer owns a partition without
    /// renewing; a crashed consumer's partitions move after this.
    #[serde(default = "default_consumer_lease_ms")]
    pub consumer_lease_ms: u64,
    /// librdkafka properties, passed through as they are
    /// (`bootstrap.servers`, `security.protocol`, `sasl.*` ...).
    #[serde(default)]
    pub kafka: std::collections::BTreeMap<String, String>,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            kind: TransportKind::Embedded,
            partitions: default_partitions(),
            consumer_lease_ms: default_consumer_lease_ms(),
            kafka: Default::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaySection {
    #[serde(default = "default_batch")]
    pub batch_size: usize,
    #[serde(default = "default_poll_ms")]
    pub poll_interval_ms: u64,
    #[serde(default = "default_publish_timeout_ms")]
    pub publish_timeout_ms: u64,
    #[serde(default = "default_max_attempts")]
    pub max_attempts: i32,
    /// Relay tasks in this process; 0 for a consumer-only process (relays
    /// and consumers scale separately).
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// SQLite only: how long a claim is leased before another task may take it.
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    #[serde(default)]
    pub backoff: Backoff,
    /// Claim and send the next batch while the previous one is marked:
    /// faster, but a crash republishes up to two batches instead of one.
    #[serde(default)]
    pub pipeline: bool,
}

impl Default for RelaySection {
    fn default() -> Self {
        Self {
            batch_size: default_batch(),
            poll_interval_ms: default_poll_ms(),
            publish_timeout_ms: default_publish_timeout_ms(),
            max_attempts: default_max_attempts(),
            workers: default_workers(),
            lease_ms: default_lease_ms(),
            backoff: Backoff::default(),
            pipeline: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerSection {
    /// The consumer's name in the inbox and its consumer group.
    pub name: String,
    pub topics: Vec<String>,
    /// `builtin:billing`, or `plugin:NAME` for a consumer plugin of the
    /// `[[plugins]]` section.
    pub handler: String,
    /// Messages of one partition per transaction, each in a savepoint.
    #[serde(default = "one")]
    pub batch_in_transaction: usize,
    /// Failed attempts before a message is dead-lettered.
    #[serde(default = "five")]
    pub max_attempts: u32,
    /// Postgres, plugin handlers: the role the plugin's statements run as
    /// (`SET LOCAL ROLE`); unset keeps the host's role.
    #[serde(default)]
    pub db_role: Option<String>,
    /// Postgres, plugin handlers: `SET LOCAL statement_timeout`.
    #[serde(default = "default_statement_timeout_ms")]
    pub statement_timeout_ms: u64,
    /// Plugin handlers: statements one message may run.
    #[serde(default = "default_max_statements")]
    pub max_statements: u32,
    /// Plugin handlers: rows queries may return for one message.
    #[serde(default = "default_max_rows")]
    pub max_rows: u64,
    /// Kafka only: read these partitions of every topic without joining a
    /// consumer group, with offsets kept in the database. Unset: the
    /// consumer is a member of the group named after it.
    #[serde(default)]
    pub kafka_partitions: Option<Vec<i32>>,
}

impl ConsumerSection {
    /// A consumer with every optional key at its default.
    pub fn new(name: impl Into<String>, topics: Vec<String>, handler: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            topics,
            handler: handler.into(),
            batch_in_transaction: one(),
            max_attempts: five(),
            db_role: None,
            statement_timeout_ms: default_statement_timeout_ms(),
            max_statements: default_max_statements(),
            max_rows: default_max_rows(),
            kafka_partitions: None,
        }
    }

    /// The `[[plugins]]` name when the handler is `plugin:NAME`.
    pub fn plugin_name(&self) -> Option<&str> {
        self.handler.strip_prefix("plugin:")
    }

    pub fn txn_policy(&self) -> crate::plugin::TxnPolicy {
        crate::plugin::TxnPolicy {
            db_role: self.db_role.clone(),
            statement_timeout_ms: self.statement_timeout_ms,
            max_statements: self.max_statements,
            max_rows: self.max_rows,
        }
    }
}

fn default_statement_timeout_ms() -> u64 {
    crate::plugin::TxnPolicy::default().statement_timeout_ms
}
fn default_max_statements() -> u32 {
    crate::plugin::TxnPolicy::default().max_statements
}
fn default_max_rows() -> u64 {
    crate::plugin::TxnPolicy::default().max_rows
}

/// A role name is spliced into `SET LOCAL ROLE "…"`, so only plain
/// identifiers are accepted.
fn is_plain_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && s.len() <= 63
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
    /// Where compiled components are cached (by sha256); unset compiles at
    /// every start.
    #[serde(default)]
    pub cache_dir: Option<std::path::PathBuf>,
    /// Use wasmtime's pooling instance allocator.
    #[serde(default)]
    pub pooling: bool,
    /// How often registry plugins are re-read when no Postgres notification
    /// arrives (SQLite relies on this alone). Default 1000.
    #[serde(default)]
    pub registry_poll_ms: Option<u64>,
    /// Development mode: every `NAME.wasm` dropped in this directory is
    /// deployed to the registry as plugin NAME and activated.
    #[serde(default)]
    pub watch_dir: Option<std::path::PathBuf>,
}

impl PluginRuntimeSection {
    pub fn registry_poll(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.registry_poll_ms.unwrap_or(1000).max(10))
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
fn default_consumer_lease_ms() -> u64 {
    15_000
}
fn default_batch() -> usize {
    100
}
fn default_poll_ms() -> u64 {
    500
}
fn default_publish_timeout_ms() -> u64 {
    10_000
}
fn default_max_attempts() -> i32 {
    10
}
fn default_workers() -> usize {
    2
}
fn default_lease_ms() -> u64 {
    30_000
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
        apply_env(&mut table, env)?;
        let config: Config =
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
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
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| {
            Err(ConfigError::Key {
                key: key.into(),
                message,
            })
        };
        if let Err(e) = DbKind::from_url(&self.database.url) {
            return bad("database.url", e.to_string());
        }
        if self.database.max_connections == 0 {
            return bad("database.max_connections", "must be at least 1".into());
        }
        if self.relay.batch_size == 0 || self.relay.batch_size > 10_000 {
            return bad(
                "relay.batch_size",
                format!(
                    "{} is out of range; use 1 to 10000 (default 100)",
                    self.relay.batch_size
                ),
            );
        }
        if self.relay.workers > 64 {
            return bad(
                "relay.workers",
                format!("{} is out of range; use 0 to 64", self.relay.workers),
            );
        }
        if self.relay.workers == 0 && self.consumers.is_empty() {
            return bad(
                "relay.workers",
                "0 runs no relay, and no [[consumers]] are configured, so this process \
                 would do nothing; use 1 to 64, or add a consumer"
                    .into(),
            );
        }
        if self.relay.max_attempts < 1 {
            return bad("relay.max_attempts", "must be at least 1".into());
        }
        if self.relay.publish_timeout_ms == 0 {
            return bad("relay.publish_timeout_ms", "must be more than 0".into());
        }
        if self.relay.lease_ms <= self.relay.publish_timeout_ms {
            return bad(
                "relay.lease_ms",
                format!(
                    "{} must exceed relay.publish_timeout_ms ({}), or a slow batch could be claimed twice",
                    self.relay.lease_ms, self.relay.publish_timeout_ms
                ),
            );
        }
        let b = self.relay.backoff;
        if !(b.base_seconds > 0.0 && b.max_seconds >= b.base_seconds) {
            return bad(
                "relay.backoff",
                "need 0 < base_seconds <= max_seconds".into(),
            );
        }
        if self.transport.consumer_lease_ms < 300 {
            return bad(
                "transport.consumer_lease_ms",
                "use at least 300 ms (default 15000)".into(),
            );
        }
        if self.transport.partitions < 1 || self.transport.partitions > 1024 {
            return bad("transport.partitions", "use 1 to 1024".into());
        }
        if self.transport.kind == TransportKind::Kafka
            && !self.transport.kafka.contains_key("bootstrap.servers")
        {
            return bad(
                "transport.kafka",
                "set \"bootstrap.servers\" when transport.kind = \"kafka\"".into(),
            );
        }
        if self.admin.enabled {
            if self.admin.listen.parse::<std::net::SocketAddr>().is_err() {
                return bad(
                    "admin.listen",
                    format!(
                        "`{}` is not an address such as 127.0.0.1:9464",
                        self.admin.listen
                    ),
                );
            }
            match &self.admin.token {
                Some(t) if t.len() >= 16 => {}
                _ => {
                    return bad(
                        "admin.token",
                        "the admin API needs a bearer token of at least 16 characters; set OUTBOXD__ADMIN__TOKEN".into(),
                    );
                }
            }
        }
        let r = &self.retention;
        if r.batch_size < 1 || r.published_days <= 0.0 || r.inbox_days <= 0.0 {
            return bad(
                "retention",
                "batch_size, published_days and inbox_days must be positive".into(),
            );
        }
        if r.purge_payload_days
            .is_some_and(|d| d <= 0.0 || d > r.published_days)
        {
            return bad(
                "retention.purge_payload_days",
                "must be positive and at most retention.published_days".into(),
            );
        }
        for (i, rule) in self.reconcile.iter().enumerate() {
            if rule.name.is_empty() || rule.query.trim().is_empty() {
                return bad(
                    &format!("reconcile[{i}]"),
                    "name and query must not be empty".into(),
                );
            }
        }
        for (i, r) in self.routes.iter().enumerate() {
            if r.topic.is_empty() || r.event_type.is_empty() {
                return bad(
                    &format!("routes[{i}]"),
                    "event_type and topic must not be empty".into(),
                );
            }
            if let Some(j) = r.allowed_topics.iter().position(|t| t.trim().is_empty()) {
                return bad(
                    &format!("routes[{i}].allowed_topics[{j}]"),
                    "must not be empty; list topic names, or remove the entry".into(),
                );
            }
        }
        for (i, p) in self.plugins.iter().enumerate() {
            if p.name.is_empty() {
                return bad(&format!("plugins[{i}].name"), "must not be empty".into());
            }
            if self.plugins[..i].iter().any(|q| q.name == p.name) {
                return bad(
                    &format!("plugins[{i}].name"),
                    format!("`{}` is used by an earlier [[plugins]] entry", p.name),
                );
            }
            let path_set = !p.path.as_os_str().is_empty();
            match p.source {
                crate::plugin::PluginSource::File if !path_set => {
                    return bad(
                        &format!("plugins[{i}].path"),
                        "is required for a file plugin; or set source = \"registry\" to run the registry's active version".into(),
                    );
                }
                crate::plugin::PluginSource::Registry if path_set => {
                    return bad(
                        &format!("plugins[{i}].path"),
                        "a registry plugin takes its component from `outboxd plugin deploy`; remove path".into(),
                    );
                }
                _ => {}
            }
            let l = p.limits;
            if l.timeout_ms == 0 || l.timeout_ms > 60_000 {
                return bad(
                    &format!("plugins[{i}].limits.timeout_ms"),
                    format!(
                        "{} is out of range; use 1 to 60000 (default 50)",
                        l.timeout_ms
                    ),
                );
            }
            if l.memory_mib == 0 || l.memory_mib > 4096 {
                return bad(
                    &format!("plugins[{i}].limits.memory_mib"),
                    format!(
                        "{} is out of range; use 1 to 4096 (default 64)",
                        l.memory_mib
                    ),
                );
            }
            if l.max_outputs == 0 || l.max_output_bytes == 0 {
                return bad(
                    &format!("plugins[{i}].limits"),
                    "max_outputs and max_output_bytes must be at least 1".into(),
                );
            }
        }
        for (ri, r) in self.routes.iter().enumerate() {
            for (ti, t) in r.transformers.iter().enumerate() {
                if !self.plugins.iter().any(|p| p.name == *t) {
                    return bad(
                        &format!("routes[{ri}].transformers[{ti}]"),
                        format!("no [[plugins]] entry is named `{t}`"),
                    );
                }
            }
        }
        for (i, c) in self.consumers.iter().enumerate() {
            match c.plugin_name() {
                Some(name) if !self.plugins.iter().any(|p| p.name == name) => {
                    return bad(
                        &format!("consumers[{i}].handler"),
                        format!("no [[plugins]] entry is named `{name}`"),
                    );
                }
                Some(name)
                    if self
                        .routes
                        .iter()
                        .any(|r| r.transformers.iter().any(|t| t == name)) =>
                {
                    return bad(
                        &format!("consumers[{i}].handler"),
                        format!(
                            "`{name}` is also a route's transformer; a plugin is a transformer or a consumer, give each its own [[plugins]] entry"
                        ),
                    );
                }
                Some(_) => {}
                None if c.handler != "builtin:billing" => {
                    return bad(
                        &format!("consumers[{i}].handler"),
                        format!(
                            "unknown handler `{}`; use builtin:billing or plugin:NAME",
                            c.handler
                        ),
                    );
                }
                None => {}
            }
            if let Some(role) = &c.db_role
                && !is_plain_identifier(role)
            {
                return bad(
                    &format!("consumers[{i}].db_role"),
                    format!("`{role}` is not a plain identifier (lower-case letters, digits, _)"),
                );
            }
            if c.statement_timeout_ms == 0 || c.statement_timeout_ms > 600_000 {
                return bad(
                    &format!("consumers[{i}].statement_timeout_ms"),
                    "use 1 to 600000 (default 5000)".into(),
                );
            }
            if c.max_statements == 0 || c.max_rows == 0 {
                return bad(
                    &format!("consumers[{i}]"),
                    "max_statements and max_rows must be at least 1".into(),
                );
            }
            if c.batch_in_transaction == 0 || c.batch_in_transaction > 10_000 {
                return bad(
                    &format!("consumers[{i}].batch_in_transaction"),
                    "use 1 to 10000".into(),
                );
            }
            if c.max_attempts == 0 {
                return bad(
                    &format!("consumers[{i}].max_attempts"),
                    "must be at least 1".into(),
                );
            }
            if c.topics.is_empty() {
                return bad(
                    &format!("consumers[{i}].topics"),
                    "list at least one topic".into(),
                );
            }
            if let Some(parts) = &c.kafka_partitions {
                let key = format!("consumers[{i}].kafka_partitions");
                if self.transport.kind != TransportKind::Kafka {
                    return bad(
                        &key,
                        "applies to transport.kind = \"kafka\" only; remove it".into(),
                    );
                }
                let mut seen = std::collections::BTreeSet::new();
                if parts.is_empty() || parts.iter().any(|p| *p < 0 || !seen.insert(*p)) {
                    return bad(
                        &key,
                        format!(
                            "{parts:?}: list distinct partition numbers, 0 or more, at least one (or remove the key to join the consumer group)"
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    pub fn relay_config(&self) -> crate::relay::RelayConfig {
        crate::relay::RelayConfig {
            batch_size: self.relay.batch_size,
            backoff: self.relay.backoff,
            max_attempts: self.relay.max_attempts,
            publish_timeout: Duration::from_millis(self.relay.publish_timeout_ms),
        }
    }

    pub fn plugin_engine_config(&self) -> crate::plugin::EngineConfig {
        crate::plugin::EngineConfig {
            cache_dir: self.plugin_runtime.cache_dir.clone(),
            pooling: self.plugin_runtime.pooling,
        }
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

/// A TOML error without the quoted source line (toml's own `Display`
/// shows it, and the line may hold a password or token): the message and
/// where it is.
fn syntax_message(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim_end();
    match e.span() {
        Some(span) => {
            let before = &text.as_bytes()[..span.start.min(text.len())];
            let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
            let column = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
            format!("{message} (line {line}, column {column})")
        }
        None => message.to_string(),
    }
}

/// Property names whose values are never logged.
pub fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("password")
        || k.contains("secret")
        || k.contains("token")
        || k.ends_with(".key")
        || k.contains("sasl.oauthbearer.config")
}

/// `OUTBOXD__RELAY__BATCH_SIZE=50` sets `relay.batch_size`. Values are read
/// as TOML when they parse (numbers, booleans, arrays) and as strings
/// otherwise. Kafka property names contain dots: `OUTBOXD__TRANSPORT__KAFKA__BOOTSTRAP.SERVERS`.
fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<(), ConfigError> {
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix("OUTBOXD__") else {
            continue;
        };
        let path: Vec<String> = rest.split("__").map(|s| s.to_ascii_lowercase()).collect();
        if path.iter().any(|p| p.is_empty()) {
            return Err(ConfigError::Key {
                key: name.clone(),
                message: "empty path segment; use OUTBOXD__SECTION__KEY".into(),
            });
        }
        // Secrets are always strings: a numeric token must not become an
        // integer (and then a type error that quotes it).
        let secret = path.last().is_some_and(|k| is_secret(k)) || path == ["database", "url"];
        let value = if secret {
            toml::Value::String(raw.clone())
        } else {
            format!("v = {raw}")
                .parse::<toml::Table>()
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or(toml::Value::String(raw.clone()))
        };
        let mut cursor = &mut *table;
        for seg in &path[..path.len() - 1] {
            let entry = cursor
                .entry(seg.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            cursor = match entry {
                toml::Value::Table(t) => t,
                _ => {
                    return Err(ConfigError::Key {
                        key: name.clone(),
                        message: format!("`{seg}` is not a section"),
                    });
                }
            };
        }
        if let Some(last) = path.last() {
            cursor.insert(last.clone(), value);
        }
    }
    Ok(())
}
