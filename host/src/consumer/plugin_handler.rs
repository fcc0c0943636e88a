//! [`PluginHandler`]: a consumer plugin as an inbox [`Handler`]. It maps
//! what the plugin did onto what the runner does next: a guest `permanent`
//! dead-letters, everything else (traps, timeouts, budgets, database
//! errors, guest `retryable`) is rolled back and retried; with no active
//! registry version the message waits without using up its attempts.
//!
//! The plugin sits in an [`ActiveConsumer`] slot. A file plugin's slot never
//! changes; a registry plugin's slot is swapped by the rollout. Each message
//! reads the slot once, so it runs entirely on one version (and, while a
//! candidate is in shadow, the candidate first runs in a savepoint that is
//! always rolled back).
//!
//! For a redriven message, `pin_version` picks any registry version of the
//! plugin (a candidate included) without touching the slot, and
//! [`PluginHandler::dry_run`] runs one message on a version in a
//! transaction that is always rolled back, recording the plugin's
//! statements.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::inbox::Handler;
use super::inbox::HandlerError;
use super::inbox::Pinned;
use super::inbox::Processed;
use crate::config::TxnPolicy;
use crate::fault::{FaultPoint, Faults};
use crate::message::Delivery;
use crate::plugin::ActiveConsumer;
use crate::plugin::ConsumerPlugin;
use crate::plugin::PluginError;
use crate::plugin::bindings::transformer::outbox::plugin::types::Message;
use crate::plugin::host::transaction::{PluginStatement, Recording};
use crate::plugin::lifecycle::shadow::Comparison;
use crate::plugin::lifecycle::versions::{BadLabel, VersionLabel};
use crate::store::InboxTx;

#[derive(Debug, Clone)]
pub struct PluginHandler {
    plugin: ActiveConsumer,
    policy: TxnPolicy,
    /// The slot is swapped by a rollout (a registry plugin).
    swappable: bool,
    /// Where a statement past the wall deadline is cancelled from (on
    /// Postgres; SQLite interrupts it on its own connection).
    cancel: Option<crate::store::Db>,
    /// Armed in crash tests: `consumer-before-commit`.
    faults: Faults,
}

impl PluginHandler {
    /// A handler that always runs `plugin` (a file plugin, or a test's).
    pub fn new(plugin: Arc<ConsumerPlugin>, policy: TxnPolicy) -> Self {
        Self {
            plugin: ActiveConsumer::fixed(plugin.name().to_string(), plugin),
            policy,
            swappable: false,
            cancel: None,
            faults: Faults::none(),
        }
    }

    /// A handler that runs whatever version `slot` holds per message.
    pub fn swappable(slot: ActiveConsumer, policy: TxnPolicy) -> Self {
        Self {
            plugin: slot,
            policy,
            swappable: true,
            cancel: None,
            faults: Faults::none(),
        }
    }

    /// Statements past the wall deadline are cancelled on the server
    /// through `db` (Postgres; SQLite needs no side connection).
    pub fn with_db(mut self, db: &crate::store::Db) -> Self {
        self.cancel = Some(db.clone());
        self
    }

    /// Arms the `consumer-before-commit` fault point (crash tests).
    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// The dead letters' handler id when a message names no version of its
    /// own (it failed before a version was picked): `plugin NAME@VERSION`
    /// for a file plugin, `plugin NAME (registry)` for a registry plugin,
    /// whose version at startup would be stale.
    pub fn handler_id(&self) -> String {
        match self.plugin.label() {
            Some(label) if !self.swappable => format!("plugin {label}"),
            _ => format!("plugin {} (registry)", self.plugin.name()),
        }
    }

    pub fn slot(&self) -> &ActiveConsumer {
        &self.plugin
    }

    /// Runs `d` for `consumer` on the version `pinned` holds (from
    /// [`pin`](Handler::pin) or [`pin_version`](Handler::pin_version)) as
    /// the consumer would, inbox mark included, in a transaction that is
    /// always rolled back: what the message would do, and every statement
    /// the plugin sent (text only, never a parameter value). Nothing is
    /// committed; a duplicate runs nothing, as it would for real.
    pub async fn dry_run(
        &self,
        db: &crate::store::Db,
        consumer: &str,
        pinned: &Pinned,
        d: &Delivery,
    ) -> DryRun {
        let mut run = DryRun {
            handled_by: pinned.label.clone(),
            outcome: Ok(Processed::Handled),
            statements: Vec::new(),
        };
        let message_id = match d.message_id() {
            Ok(id) => id,
            Err(e) => {
                run.outcome = Err(HandlerError::Permanent(e));
                return run;
            }
        };
        let mut tx = match InboxTx::begin(db).await {
            Ok(tx) => tx,
            Err(e) => {
                run.outcome = Err(e.into());
                return run;
            }
        };
        run.outcome = self
            .dry_run_in(
                &mut tx,
                consumer,
                message_id,
                pinned,
                d,
                &mut run.statements,
            )
            .await;
        if let Err(e) = tx.rollback().await {
            // Dropping the connection's transaction rolls it back as well.
            tracing::warn!(error = %e, "rolling back a dry run failed; its connection is dropped");
        }
        run
    }

    async fn dry_run_in(
        &self,
        tx: &mut InboxTx,
        consumer: &str,
        message_id: uuid::Uuid,
        pinned: &Pinned,
        d: &Delivery,
        statements: &mut Vec<PluginStatement>,
    ) -> Result<Processed, HandlerError> {
        self.begin(tx).await?;
        if !tx
            .mark(consumer, message_id, pinned.label.as_deref())
            .await?
        {
            return Ok(Processed::Duplicate);
        }
        let plugin = self.pinned_plugin(pinned)?;
        let message = to_message(d, message_id.to_string());
        let (result, sent) = plugin
            .handle_recorded(
                tx,
                &message,
                &self.policy,
                self.cancel.as_ref(),
                Recording::TextOnly,
            )
            .await;
        *statements = sent;
        result.map_err(|e| handler_error(&plugin.label(), e))?;
        Ok(Processed::Handled)
    }

    /// The version a pinned message runs on.
    fn pinned_plugin(&self, pinned: &Pinned) -> Result<Arc<ConsumerPlugin>, HandlerError> {
        let versions = match &pinned.versions {
            Some(v) => v.clone(),
            None => self.plugin.snapshot(),
        };
        versions.active.clone().ok_or_else(|| {
            HandlerError::Unavailable(format!(
                "plugin `{}`: no version is active in the registry; `outboxd plugin activate` one",
                self.plugin.name()
            ))
        })
    }

    /// Runs the candidate in a savepoint that is always rolled back, so it
    /// sees exactly what the active version will see and leaves nothing.
    async fn run_shadow(
        &self,
        tx: &mut InboxTx,
        message: &Message,
        candidate: &ConsumerPlugin,
    ) -> Result<(Result<(), PluginError>, Duration), HandlerError> {
        tx.savepoint("outboxd_shadow").await?;
        let start = Instant::now();
        let result = candidate
            .handle_shadow(tx, message, &self.policy, self.cancel.as_ref())
            .await;
        let took = start.elapsed();
        tx.rollback_to("outboxd_shadow").await?;
        tx.release("outboxd_shadow").await?;
        Ok((result, took))
    }
}

/// What one delivery would do on a version: [`PluginHandler::dry_run`].
#[derive(Debug)]
pub struct DryRun {
    /// The version that ran (`name@version`).
    pub handled_by: Option<String>,
    /// `Ok(Handled)`: the effect would commit with the inbox mark;
    /// `Ok(Duplicate)`: the inbox has the message already, nothing would
    /// run; an error: the message would be rolled back (and retried or
    /// dead-lettered by its kind).
    pub outcome: Result<Processed, HandlerError>,
    /// Every statement the plugin sent, in order.
    pub statements: Vec<PluginStatement>,
}

/// A plugin's failure as the runner branches on it: a guest `permanent`
/// dead-letters, everything else is retried.
fn handler_error(label: &str, e: PluginError) -> HandlerError {
    let text = format!("plugin {label}: {e}");
    if e.is_permanent() {
        HandlerError::Permanent(text)
    } else {
        HandlerError::Retryable(text)
    }
}

/// The plugin's view of a delivery. Header values that are not UTF-8 are
/// passed lossily; the message id is the deduplicated one.
fn to_message(d: &Delivery, id: String) -> Message {
    Message {
        id,
        topic: d.topic.clone(),
        key: d.key.clone(),
        payload: d.payload.clone(),
        headers: d
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
            .collect(),
        attempt: d.attempt,
    }
}

/// How the candidate's outcome compares with the active one's: the same
/// outcome (ok, retryable, permanent) is a match.
fn compare(active: &Result<(), PluginError>, candidate: &Result<(), PluginError>) -> Comparison {
    let kind = |r: &Result<(), PluginError>| match r {
        Ok(()) => "ok",
        Err(e) if e.is_permanent() => "permanent",
        Err(_) => "retryable",
    };
    match (active, candidate) {
        (Ok(()), Err(e)) => Comparison::Error(e.to_string()),
        (a, c) if kind(a) == kind(c) => Comparison::Match,
        (a, c) => Comparison::Mismatch(format!("active {}, candidate {}", kind(a), kind(c))),
    }
}

impl Handler for PluginHandler {
    async fn begin(&self, tx: &mut InboxTx) -> Result<(), sqlx::Error> {
        tx.bound_statements(self.policy.statement_timeout).await
    }

    async fn before_commit(&self, tx: &mut InboxTx) -> Result<(), sqlx::Error> {
        self.faults
            .check(FaultPoint::ConsumerBeforeCommit)
            .await
            .map_err(|e| sqlx::Error::Io(std::io::Error::other(e)))?;
        tx.reset_plugin_session().await
    }

    async fn handle(&self, tx: &mut InboxTx, d: &Delivery) -> Result<(), HandlerError> {
        self.handle_pinned(&self.pin(), tx, d).await
    }

    /// One read of the slot per message: the message runs entirely on these
    /// versions, whatever the rollout swaps in meanwhile.
    fn pin(&self) -> Pinned {
        let versions = self.plugin.snapshot();
        Pinned {
            label: versions.active.as_ref().map(|p| p.label()),
            versions: Some(versions),
            picked_at: Instant::now(),
        }
    }

    /// A registry version of this consumer's plugin (a candidate
    /// included), loaded on demand and kept, as the one version of one
    /// message; the slot's live versions stay as they are. A file plugin
    /// has only its own version.
    async fn pin_version(&self, label: &str) -> Result<Pinned, HandlerError> {
        if !self.swappable && self.plugin.label().as_deref() == Some(label) {
            return Ok(self.pin());
        }
        let parsed: VersionLabel = label
            .parse()
            .map_err(|e: BadLabel| HandlerError::Permanent(e.to_string()))?;
        let versions = self.plugin.pinned(&parsed).await.map_err(|e| {
            if e.permanent {
                HandlerError::Permanent(e.to_string())
            } else {
                HandlerError::Retryable(e.to_string())
            }
        })?;
        Ok(Pinned {
            label: versions.active.as_ref().map(|p| p.label()),
            versions: Some(Arc::new(versions)),
            picked_at: Instant::now(),
        })
    }

    async fn handle_pinned(
        &self,
        pinned: &Pinned,
        tx: &mut InboxTx,
        d: &Delivery,
    ) -> Result<(), HandlerError> {
        let versions = match &pinned.versions {
            Some(v) => v.clone(),
            None => self.plugin.snapshot(),
        };
        let plugin = self.pinned_plugin(pinned)?;
        let label = plugin.label();
        let id = d.message_id().map_err(HandlerError::Permanent)?.to_string();
        let message = to_message(d, id);
        let shadow = match &versions.shadow {
            Some((candidate, stats)) => {
                let (result, took) = self.run_shadow(tx, &message, candidate).await?;
                Some((result, took, stats))
            }
            None => None,
        };
        let start = Instant::now();
        let result = plugin
            .handle_cancellable(tx, &message, &self.policy, self.cancel.as_ref())
            .await;
        if let Some((candidate, shadow_took, stats)) = shadow {
            stats.record(
                &message.id,
                &compare(&result, &candidate),
                start.elapsed(),
                shadow_took,
            );
        }
        result.map_err(|e| handler_error(&label, e))
    }
}

impl From<PluginError> for HandlerError {
    fn from(e: PluginError) -> Self {
        HandlerError::Retryable(e.to_string())
    }
}
