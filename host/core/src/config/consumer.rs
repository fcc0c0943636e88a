//! `[[consumers]]`: one inbox consumer, its handler and the limits on a
//! plugin handler's statements ([`TxnPolicy`]).

use serde::Deserialize;

use super::validate::is_plain_identifier;
use super::{ConfigError, five, one};
use crate::db_url::DbKind;
use crate::sql_gate::is_host_table;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerSection {
    /// The consumer's name in the inbox and its consumer group.
    pub name: String,
    pub topics: Vec<String>,
    /// `plugin:NAME` for a consumer plugin of the `[[plugins]]` section, or
    /// `builtin:NAME` for a native handler registered in this binary
    /// (`Daemon::builder().handler(NAME, …)`; the `outboxd` binary has none).
    pub handler: HandlerRef,
    /// Messages of one partition per transaction, each in a savepoint.
    #[serde(default = "one")]
    pub batch_in_transaction: usize,
    /// Failed attempts before a message is dead-lettered.
    #[serde(default = "five")]
    pub max_attempts: u32,
    /// Plugin handlers: the tables the plugin's SQL may read and write.
    /// Nothing else is reachable: not the host's tables, not the catalogs,
    /// not other schemas, whatever this says.
    #[serde(default)]
    pub tables: TableGrants,
    /// Postgres, plugin handlers: the role the plugin's statements run as
    /// (`SET LOCAL ROLE`). Required on Postgres: the role must hold exactly
    /// the grants of `tables` (see `outboxd plugin-roles`).
    #[serde(default)]
    pub db_role: Option<String>,
    /// Postgres, plugin handlers: `SET LOCAL statement_timeout`.
    #[serde(
        rename = "statement_timeout",
        alias = "statement_timeout_ms",
        default = "default_statement_timeout",
        deserialize_with = "super::duration::keys::statement_timeout"
    )]
    pub statement_timeout: std::time::Duration,
    /// Plugin handlers: statements one message may run.
    #[serde(default = "default_max_statements")]
    pub max_statements: u32,
    /// Plugin handlers: rows queries may return for one message.
    #[serde(default = "default_max_rows")]
    pub max_rows: u64,
    /// Plugin handlers: bytes queries may return for one message (also the
    /// largest single value a statement may build).
    #[serde(default = "default_max_result_bytes")]
    pub max_result_bytes: u64,
    /// Kafka only: read these partitions of every topic without joining a
    /// consumer group, with offsets kept in the database. Unset: the
    /// consumer is a member of the group named after it.
    #[serde(default)]
    pub kafka_partitions: Option<Vec<i32>>,
    /// Kafka group members: when the group has partitions with lag and no
    /// progress for this long on top of the group's `session.timeout.ms`
    /// (the time a dead member's partitions normally wait), the member
    /// leaves and joins again with a new client, and logs why. `"0s"` turns
    /// the watch off.
    #[serde(
        default = "default_kafka_stall_timeout",
        deserialize_with = "super::duration::keys::kafka_stall_timeout"
    )]
    pub kafka_stall_timeout: std::time::Duration,
    /// Kafka group members: the static-membership id (`group.instance.id`),
    /// stable across restarts and unique per process, so a restarted
    /// process takes its partitions back without a rebalance. Unset: the
    /// value of `OUTBOXD_INSTANCE_ID`, else a dynamic member.
    #[serde(default)]
    pub instance_id: Option<String>,
    /// What a dead letter does to the later messages of its key.
    #[serde(default)]
    pub on_dead: OnDead,
}

/// What happens to the later messages of a key after one of its messages
/// is dead-lettered by a consumer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDead {
    /// The key is parked: its later messages are recorded as parked, in
    /// order, and wait until the dead letter is redriven or discarded;
    /// other keys keep flowing.
    #[default]
    ParkKey,
    /// The key moves on: later messages are handled as if the dead one had
    /// not been (per-key order is given up for that message).
    Skip,
}

impl OnDead {
    pub fn name(self) -> &'static str {
        match self {
            OnDead::ParkKey => "park_key",
            OnDead::Skip => "skip",
        }
    }
}

impl ConsumerSection {
    /// A consumer with every optional key at its default.
    pub fn new(name: impl Into<String>, topics: Vec<String>, handler: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            topics,
            handler: HandlerRef::from_config(&handler.into()),
            batch_in_transaction: one(),
            max_attempts: five(),
            tables: TableGrants::default(),
            db_role: None,
            statement_timeout: default_statement_timeout(),
            max_statements: default_max_statements(),
            max_rows: default_max_rows(),
            max_result_bytes: default_max_result_bytes(),
            kafka_partitions: None,
            on_dead: OnDead::default(),
            kafka_stall_timeout: default_kafka_stall_timeout(),
            instance_id: None,
        }
    }

    /// The `[[plugins]]` name when the handler is `plugin:NAME`.
    pub fn plugin_name(&self) -> Option<&str> {
        match &self.handler {
            HandlerRef::Plugin(name) => Some(name),
            HandlerRef::Builtin(_) => None,
        }
    }

    /// `tables` names plain tables, none of them the host's; on Postgres a
    /// plugin consumer needs `db_role`, the role its SQL runs as.
    pub(super) fn validate_grants(&self, i: usize, db: Option<DbKind>) -> Result<(), ConfigError> {
        let bad = |key: String, message: String| Err(ConfigError::Key { key, message });
        for (list, names) in [("read", &self.tables.read), ("write", &self.tables.write)] {
            for t in names {
                let key = format!("consumers[{i}].tables.{list}");
                if !is_plain_identifier(t) {
                    return bad(
                        key,
                        format!(
                            "`{t}` is not a plain table name (lower-case letters, digits, _; unqualified)"
                        ),
                    );
                }
                if is_host_table(t) {
                    return bad(
                        key,
                        format!(
                            "`{t}` is outboxd's own table or a catalog (or a name reserved for them); plugin SQL may never reach it: remove it"
                        ),
                    );
                }
            }
        }
        if self.plugin_name().is_none() {
            if self.tables != TableGrants::default() {
                return bad(
                    format!("consumers[{i}].tables"),
                    "applies to plugin handlers only; remove it".into(),
                );
            }
            return Ok(());
        }
        if db == Some(DbKind::Postgres) && self.db_role.is_none() {
            return bad(
                format!("consumers[{i}].db_role"),
                format!(
                    "a consumer plugin on Postgres runs its SQL as a role of its own that holds exactly the grants of consumers[{i}].tables; set db_role = \"outboxd_plugin_{}\" and create the role with `outboxd plugin-roles` (or run the SQL `outboxd plugin-roles --print` shows)",
                    self.name.replace('-', "_")
                ),
            );
        }
        Ok(())
    }

    pub fn txn_policy(&self) -> TxnPolicy {
        TxnPolicy {
            consumer: self.name.clone(),
            tables: self.tables.clone(),
            db_role: self.db_role.clone(),
            statement_timeout: self.statement_timeout,
            max_statements: self.max_statements,
            max_rows: self.max_rows,
            max_result_bytes: self.max_result_bytes,
        }
    }
}

fn default_kafka_stall_timeout() -> std::time::Duration {
    std::time::Duration::from_secs(30)
}
fn default_statement_timeout() -> std::time::Duration {
    TxnPolicy::default().statement_timeout
}
fn default_max_statements() -> u32 {
    TxnPolicy::default().max_statements
}
fn default_max_rows() -> u64 {
    TxnPolicy::default().max_rows
}
fn default_max_result_bytes() -> u64 {
    TxnPolicy::default().max_result_bytes
}

/// What `consumers[].handler` names, parsed once from its TOML text: a
/// native handler registered in this binary (`builtin:NAME`) or a consumer plugin of
/// the `[[plugins]]` section (`plugin:NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandlerRef {
    Builtin(String),
    Plugin(String),
}

impl HandlerRef {
    /// `text` as the config writes it; a name without either prefix is
    /// taken as a built-in one (which validation then checks).
    pub fn from_config(text: &str) -> Self {
        match text.strip_prefix("plugin:") {
            Some(name) => HandlerRef::Plugin(name.to_string()),
            None => HandlerRef::Builtin(text.strip_prefix("builtin:").unwrap_or(text).to_string()),
        }
    }
}

impl std::fmt::Display for HandlerRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandlerRef::Builtin(name) => write!(f, "builtin:{name}"),
            HandlerRef::Plugin(name) => write!(f, "plugin:{name}"),
        }
    }
}

impl<'de> Deserialize<'de> for HandlerRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if !(text.starts_with("plugin:") || text.starts_with("builtin:")) {
            return Err(serde::de::Error::custom(format!(
                "unknown handler `{text}`; use plugin:NAME (a [[plugins]] entry) or builtin:NAME (a handler registered in this binary)"
            )));
        }
        Ok(HandlerRef::from_config(&text))
    }
}

/// `consumers[].tables`: what a consumer plugin's SQL may touch. `write`
/// covers reading too (an UPDATE's WHERE reads the table it writes).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableGrants {
    #[serde(default)]
    pub read: Vec<String>,
    #[serde(default)]
    pub write: Vec<String>,
}

impl TableGrants {
    pub fn may_read(&self, table: &str) -> bool {
        self.read.iter().chain(&self.write).any(|t| t == table)
    }

    pub fn may_write(&self, table: &str) -> bool {
        self.write.iter().any(|t| t == table)
    }
}

/// How a consumer's plugin statements are run and bounded, per message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnPolicy {
    /// The consumer's name, for errors that name its config keys.
    pub consumer: String,
    /// What the plugin's SQL may touch (`consumers[].tables`).
    pub tables: TableGrants,
    /// Postgres only: `SET LOCAL ROLE` before the plugin's first statement.
    pub db_role: Option<String>,
    /// Postgres only: `SET LOCAL statement_timeout` for each transaction.
    pub statement_timeout: std::time::Duration,
    /// Statements (`execute`, `query`, `emit`) one message may run.
    pub max_statements: u32,
    /// Rows `query` may return across one message.
    pub max_rows: u64,
    /// Bytes `query` may return across one message, and the largest single
    /// value (the databases build a value whole before the host sees it).
    pub max_result_bytes: u64,
}

impl Default for TxnPolicy {
    fn default() -> Self {
        Self {
            consumer: String::new(),
            tables: TableGrants::default(),
            db_role: None,
            statement_timeout: std::time::Duration::from_secs(5),
            max_statements: 100,
            max_rows: 10_000,
            max_result_bytes: 16 * 1024 * 1024,
        }
    }
}
