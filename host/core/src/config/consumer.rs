//! `[[consumers]]`: one inbox consumer, its handler and the limits on a
//! plugin handler's statements ([`TxnPolicy`]).

use serde::Deserialize;

use super::{five, one};

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

    pub fn txn_policy(&self) -> TxnPolicy {
        TxnPolicy {
            db_role: self.db_role.clone(),
            statement_timeout_ms: self.statement_timeout_ms,
            max_statements: self.max_statements,
            max_rows: self.max_rows,
        }
    }
}

fn default_statement_timeout_ms() -> u64 {
    TxnPolicy::default().statement_timeout_ms
}
fn default_max_statements() -> u32 {
    TxnPolicy::default().max_statements
}
fn default_max_rows() -> u64 {
    TxnPolicy::default().max_rows
}

/// How a consumer's plugin statements are run and bounded, per message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnPolicy {
    /// Postgres only: `SET LOCAL ROLE` before the plugin's first statement.
    pub db_role: Option<String>,
    /// Postgres only: `SET LOCAL statement_timeout` for each transaction.
    pub statement_timeout_ms: u64,
    /// Statements (`execute`, `query`, `emit`) one message may run.
    pub max_statements: u32,
    /// Rows `query` may return across one message.
    pub max_rows: u64,
}

impl Default for TxnPolicy {
    fn default() -> Self {
        Self {
            db_role: None,
            statement_timeout_ms: 5_000,
            max_statements: 100,
            max_rows: 10_000,
        }
    }
}
