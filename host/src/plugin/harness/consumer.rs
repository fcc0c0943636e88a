//! `outboxd plugin test` on a consumer: the component runs on a sample
//! message through the daemon's own call path (the inbox mark, the
//! consumer's [`TxnPolicy`] with its grants, budgets and role, the lexical
//! guard and the capability gate) in a transaction that is always rolled
//! back: on a scratch SQLite file, migrated and deleted afterwards, or on
//! the database of `--database-url`. Every statement is recorded with its
//! values ([`Recording::WithValues`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::message::SampleMessage;
use super::report::{ConsumerReport, HttpShown, MessageShown, Outcome};
use crate::config::Limits;
use crate::config::PluginSpec;
use crate::config::TxnPolicy;
use crate::db_url::redact_url;
use crate::plugin::error::PluginError;
use crate::plugin::host::http::Transport;
use crate::plugin::host::transaction::StatementKind;
use crate::plugin::runtime::consumer::ConsumerPlugin;
use crate::plugin::runtime::engine::PluginEngine;
use crate::store::Db;
use crate::store::InboxTx;
use crate::store::migrate;

/// Why a consumer could not be tried at all (as opposed to an outcome of
/// the plugin, which is in the report).
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error("cannot create the scratch SQLite database in {dir}: {source}")]
    Scratch {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} on {database}: {source}")]
    Database {
        what: &'static str,
        database: String,
        source: crate::store::StoreError,
    },
    #[error(
        "--setup {file}: {source} (the setup runs as the host, before the plugin, in the same transaction)"
    )]
    Setup { file: String, source: sqlx::Error },
}

/// Everything one consumer test run needs.
pub struct ConsumerTest<'a> {
    pub wasm: &'a Path,
    pub limits: Limits,
    pub config: BTreeMap<String, String>,
    pub policy: TxnPolicy,
    /// `None`: a scratch SQLite file.
    pub database_url: Option<&'a str>,
    /// The setup script's file name and text.
    pub setup: Option<(String, String)>,
    pub message: SampleMessage,
    /// `allowed_outbound_hosts` of the plugin (`--allow-host`).
    pub allow_hosts: Vec<String>,
    /// Where its HTTP requests go: canned answers (`--http-stub`; none
    /// matches when no file is given, so nothing leaves the process) or
    /// the network (`--http-live`).
    pub transport: Transport,
}

/// A temporary directory, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the test. The transaction is rolled back whatever happens.
pub async fn run(
    engine: &PluginEngine,
    t: ConsumerTest<'_>,
) -> Result<ConsumerReport, HarnessError> {
    let mut spec = PluginSpec::new(plugin_name(t.wasm), t.wasm);
    spec.limits = t.limits;
    spec.config = t.config;
    spec.allowed_outbound_hosts = t.allow_hosts.clone();
    let plugin = ConsumerPlugin::load(engine, &spec)?;
    let (db, shown, _scratch) = open(t.database_url).await?;
    let db_error = |what, source: sqlx::Error| HarnessError::Database {
        what,
        database: shown.clone(),
        source: source.into(),
    };
    let mut generated = BTreeMap::new();
    let id = match t.message.id {
        Some(id) => id,
        None => {
            let id = uuid::Uuid::new_v4();
            generated.insert("<message-id>".to_string(), id.to_string());
            id
        }
    };
    let message = t.message.to_guest(id);
    let mut tx = InboxTx::begin(&db)
        .await
        .map_err(|e| db_error("cannot begin a transaction", e))?;
    let run: Result<_, HarnessError> = async {
        tx.bound_statements(t.policy.statement_timeout)
            .await
            .map_err(|e| db_error("cannot set the statement timeout", e))?;
        if let Some((file, sql)) = &t.setup {
            tx.run_script(sql).await.map_err(|source| HarnessError::Setup {
                file: file.clone(),
                source,
            })?;
        }
        let fresh = tx
            .mark(&t.policy.consumer, id, Some(&plugin.label()))
            .await
            .map_err(|e| db_error("cannot write the inbox mark (is the database migrated? run `outboxd migrate` on it)", e))?;
        if !fresh {
            let outcome = Outcome {
                result: "duplicate".into(),
                message: Some(format!(
                    "the inbox of consumer `{}` has message {id} already: nothing runs",
                    t.policy.consumer
                )),
                then: "commit",
            };
            return Ok((outcome, Vec::new(), Vec::new(), 0));
        }
        let start = Instant::now();
        let traced = plugin
            .handle_traced(&mut tx, &message, &t.policy, Some(&db), t.transport.clone())
            .await;
        let took = start.elapsed().as_millis() as u64;
        let outcome = match &traced.result {
            Ok(()) => Outcome::ok("commit"),
            Err(e) => Outcome::failed(e),
        };
        Ok((outcome, traced.statements, traced.http, took))
    }
    .await;
    if let Err(e) = tx.rollback().await {
        tracing::warn!(error = %e, "rolling back the test's transaction failed; its connection is dropped, which rolls it back");
    }
    db.close().await;
    let (outcome, statements, http, duration_ms) = run?;
    let events: Vec<_> = statements
        .iter()
        .filter(|s| s.kind == StatementKind::Emit)
        .filter_map(|s| s.values.as_ref()?.event.clone())
        .filter(|e| !e.id.is_empty())
        .collect();
    for (i, e) in events.iter().enumerate() {
        generated.insert(format!("<event-{}>", i + 1), e.id.clone());
    }
    let http: Vec<_> = http.iter().map(HttpShown::from).collect();
    for (i, h) in http.iter().enumerate() {
        if let Some(id) = &h.audit_id {
            generated.insert(format!("<audit-{}>", i + 1), id.clone());
        }
    }
    Ok(ConsumerReport {
        world: "consumer",
        message: MessageShown {
            id: id.to_string(),
            topic: t.message.topic.clone(),
            key: t.message.key.clone(),
            headers: t.message.headers.clone(),
            attempt: t.message.attempt,
        },
        statements,
        events,
        http,
        outcome,
        duration_ms,
        generated,
    })
}

/// The plugin's name in marks and errors: the file's stem.
fn plugin_name(wasm: &Path) -> String {
    wasm.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "test".into())
}

/// The database of `url`, or a scratch SQLite file (migrated, and removed
/// when the returned guard drops); and how to name it.
async fn open(url: Option<&str>) -> Result<(Db, String, Option<Scratch>), HarnessError> {
    let (url, scratch) = match url {
        Some(url) => (url.to_string(), None),
        None => {
            let dir = std::env::temp_dir().join(format!(
                "outboxd-plugin-test-{}",
                uuid::Uuid::new_v4().simple()
            ));
            std::fs::create_dir_all(&dir).map_err(|source| HarnessError::Scratch {
                dir: dir.clone(),
                source,
            })?;
            let url = format!("sqlite://{}", dir.join("scratch.db").display());
            (url, Some(Scratch(dir)))
        }
    };
    let shown = match &scratch {
        Some(_) => "a scratch SQLite database".to_string(),
        None => redact_url(&url),
    };
    let db = Db::connect(&url, 2)
        .await
        .map_err(|source| HarnessError::Database {
            what: "cannot connect",
            database: shown.clone(),
            source,
        })?;
    if scratch.is_some() {
        migrate(&db)
            .await
            .map_err(|source| HarnessError::Database {
                what: "cannot migrate",
                database: shown.clone(),
                source,
            })?;
    }
    Ok((db, shown, scratch))
}
