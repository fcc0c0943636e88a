//! Fix-forward: redriving dead events through a chosen registry version of
//! one of their route's transformers (a candidate included), without
//! activating it for live traffic, and a dry run that shows what that
//! version would publish; and a consumer's dry run, which runs its dead
//! letters on a version in transactions that are rolled back.
//!
//! The choice is stored on each row (`outbox.redrive_with`, migration
//! 0013); the relay that claims the row runs the route's chain with that
//! plugin replaced by the named version (`Chains::pinned_for_event`). The
//! redrive checks first that the version can run there, so an operator's
//! typo is an error now, not a second death later.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use outboxd_core::config::{ConsumerSection, PluginSource, PluginSpec};
use outboxd_core::route::{Route, Router};

use super::dead::DeadFilter;
use super::like_pattern;
use crate::consumer::PluginHandler;
use crate::consumer::inbox::Handler;
use crate::consumer::plugin_handler::DryRun;
use crate::message::OutgoingMessage;
use crate::plugin::lifecycle::registry::{Registry, RegistryError};
use crate::plugin::lifecycle::versions::{BadLabel, VersionLabel};
use crate::plugin::{ConsumerPlugin, PluginEngine, Rollout};
use crate::store::Db;
use crate::store::inbox::dead_letters::ConsumerDeadLetter;
use crate::store::outbox::dead::{self, DeadSelection};

/// What a redrive through a version needs of the config: the routes (which
/// chain each event runs) and the plugins (which of them the registry
/// serves).
#[derive(Debug, Clone, Copy)]
pub struct Pipeline<'a> {
    pub routes: &'a [Route],
    pub plugins: &'a [PluginSpec],
}

#[derive(Debug, thiserror::Error)]
pub enum FixForwardError {
    #[error(transparent)]
    BadLabel(#[from] BadLabel),
    #[error(
        "plugin `{name}` has no version {version} in the registry; `outboxd plugin list` shows the versions, `outboxd plugin deploy` adds one"
    )]
    NoSuchVersion { name: String, version: i64 },
    #[error("{label} cannot run: {reason}")]
    NotRunnable { label: String, reason: String },
    #[error(
        "plugin `{name}` is a file plugin in this config (plugins[{index}].source = \"file\"), so the relay runs no registry version of it; set source = \"registry\" and deploy the fix with `outboxd plugin deploy`, or redrive without --with"
    )]
    FilePlugin { name: String, index: usize },
    #[error(
        "dead event {seq} ({event_type}) goes through {route}, which does not run plugin `{name}`, so {label} cannot run on it; narrow the selection (--seq, --type, --aggregate) or pick a plugin of that chain (`outboxd plugin list`)"
    )]
    NotInChain {
        label: String,
        name: String,
        seq: i64,
        event_type: String,
        route: String,
    },
    #[error("plugin registry: {0}")]
    Registry(RegistryError),
    #[error("plugins: {0}")]
    Plugin(String),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

impl From<RegistryError> for FixForwardError {
    fn from(e: RegistryError) -> Self {
        match e {
            RegistryError::NoSuchVersion { name, version } => {
                FixForwardError::NoSuchVersion { name, version }
            }
            RegistryError::Database(e) => FixForwardError::Database(e),
            other => FixForwardError::Registry(other),
        }
    }
}

fn selection<'a>(filter: &'a DeadFilter, type_like: Option<&'a str>) -> DeadSelection<'a> {
    DeadSelection {
        seq: filter.seq,
        type_like,
        aggregate_id: filter.aggregate_id.as_deref(),
    }
}

/// Checks that `label` is a transformer version in the registry that is not
/// retired, of a plugin the registry serves, and in the chain of every dead
/// event `filter` selects.
pub async fn check(
    db: &Db,
    pipeline: Pipeline<'_>,
    filter: &DeadFilter,
    label: &VersionLabel,
) -> Result<(), FixForwardError> {
    let record = Registry::new(db.clone())
        .get(&label.name, label.version)
        .await?;
    let not_runnable = |reason: String| FixForwardError::NotRunnable {
        label: label.to_string(),
        reason,
    };
    if record.world != "transformer" {
        return Err(not_runnable(format!(
            "it is a {} plugin, and dead events are redriven through a transformer of their route",
            record.world
        )));
    }
    if record.state == "retired" {
        return Err(not_runnable(
            "it is retired and never runs again; deploy the fix as a new version (`outboxd plugin deploy`)".into(),
        ));
    }
    if let Some(index) = pipeline
        .plugins
        .iter()
        .position(|p| p.name == label.name && p.source == PluginSource::File)
    {
        return Err(FixForwardError::FilePlugin {
            name: label.name.clone(),
            index,
        });
    }
    let router = Router::new(pipeline.routes.to_vec());
    let type_like = filter.event_type.as_deref().map(like_pattern);
    let types = dead::dead_event_types(db, selection(filter, type_like.as_deref())).await?;
    for (seq, event_type) in types {
        let index = router.route_index(&event_type);
        let runs_it = index
            .map(|i| pipeline.routes[i].transformers.contains(&label.name))
            .unwrap_or(false);
        if !runs_it {
            let route = match index {
                Some(i) => format!(
                    "routes[{i}] (transformers: [{}])",
                    pipeline.routes[i].transformers.join(", ")
                ),
                None => "no route (it is published unchanged)".to_string(),
            };
            return Err(FixForwardError::NotInChain {
                label: label.to_string(),
                name: label.name.clone(),
                seq,
                event_type,
                route,
            });
        }
    }
    Ok(())
}

/// Makes the dead events `filter` selects pending again, as
/// [`dead::redrive`](super::dead::redrive) does, and has the relay run them
/// through `label` (`NAME@VERSION`) after [`check`]ing it. Returns how many.
pub async fn redrive_with(
    db: &Db,
    pipeline: Pipeline<'_>,
    filter: &DeadFilter,
    label: &str,
    now: DateTime<Utc>,
) -> Result<u64, FixForwardError> {
    let label: VersionLabel = label.parse()?;
    check(db, pipeline, filter, &label).await?;
    let type_like = filter.event_type.as_deref().map(like_pattern);
    let label = label.to_string();
    Ok(dead::redrive_dead_events(
        db,
        selection(filter, type_like.as_deref()),
        Some(&label),
        now,
    )
    .await?)
}

/// What one dead event would become, redriven.
#[derive(Debug)]
pub struct DryRunEvent {
    pub seq: i64,
    pub event_type: String,
    pub aggregate_id: String,
    /// The chain that ran, `a@1,b@3`.
    pub chain: String,
    pub outcome: DryRunOutcome,
}

#[derive(Debug)]
pub enum DryRunOutcome {
    /// The messages the relay would publish, as it would send them.
    Publish(Vec<OutgoingMessage>),
    /// The chain returned no message: the event would be marked filtered.
    Dropped,
    /// The chain failed; `permanent` failures would make it dead again.
    Failed { error: String, permanent: bool },
}

/// Runs the dead events `filter` selects (oldest first, at most `limit`)
/// through their route's chain as a redrive would, with `label`'s version
/// in place of its plugin when given (after [`check`]ing it), else on the
/// active versions. Publishes nothing and writes nothing.
pub async fn dry_run(
    db: &Db,
    engine: PluginEngine,
    pipeline: Pipeline<'_>,
    filter: &DeadFilter,
    label: Option<&str>,
    limit: i64,
) -> Result<Vec<DryRunEvent>, FixForwardError> {
    let label: Option<VersionLabel> = label.map(str::parse).transpose()?;
    if let Some(label) = &label {
        check(db, pipeline, filter, label).await?;
    }
    let type_like = filter.event_type.as_deref().map(like_pattern);
    let events =
        dead::dead_events_as_claimed(db, selection(filter, type_like.as_deref()), limit).await?;
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let rollout = Rollout::new(
        engine,
        Registry::new(db.clone()),
        pipeline.plugins.to_vec(),
        pipeline.routes.to_vec(),
    )
    .map_err(FixForwardError::Plugin)?;
    rollout.refresh().await?;
    let chains = rollout.chains();
    let router = Router::new(pipeline.routes.to_vec());
    let mut out = Vec::with_capacity(events.len());
    for ev in events {
        let route = match &label {
            Some(l) => chains
                .pinned_for_event(&router, &ev.event_type, &l.to_string())
                .await
                .map_err(|e| FixForwardError::NotRunnable {
                    label: l.to_string(),
                    reason: e.reason,
                })?,
            None => match chains.for_event(&router, &ev.event_type) {
                Some(route) => route,
                None => {
                    let msg = crate::message::message_for_event(&router, &ev);
                    out.push(DryRunEvent {
                        seq: ev.seq,
                        event_type: ev.event_type,
                        aggregate_id: ev.aggregate_id,
                        chain: String::new(),
                        outcome: DryRunOutcome::Publish(vec![msg]),
                    });
                    continue;
                }
            },
        };
        let outcome = match crate::relay::transform::preview(&router, &route, &ev).await {
            Ok(messages) if messages.is_empty() => DryRunOutcome::Dropped,
            Ok(messages) => DryRunOutcome::Publish(messages),
            Err(e) => DryRunOutcome::Failed {
                permanent: e.error.is_permanent(),
                error: e.to_string(),
            },
        };
        out.push(DryRunEvent {
            seq: ev.seq,
            event_type: ev.event_type,
            aggregate_id: ev.aggregate_id,
            chain: route.active.label(),
            outcome,
        });
    }
    Ok(out)
}

/// What one consumer dead letter would do, redriven.
#[derive(Debug)]
pub struct ConsumerDryRun {
    /// The dead letter's id.
    pub id: i64,
    pub run: DryRun,
}

/// Runs `consumer`'s dead `letters` (read in full, with their payloads)
/// through its plugin as a redrive would apply them, each in a transaction
/// that is rolled back: on `with`'s version (`NAME@VERSION`, a registry
/// candidate included) when given, else on the active one. Returns each
/// one's outcome and the plugin's statements; commits nothing.
pub async fn consumer_dry_run(
    db: &Db,
    engine: PluginEngine,
    consumer: &ConsumerSection,
    plugins: &[PluginSpec],
    letters: &[ConsumerDeadLetter],
    with: Option<&str>,
) -> Result<Vec<ConsumerDryRun>, FixForwardError> {
    let not_runnable = |reason: String| FixForwardError::NotRunnable {
        label: with.unwrap_or("the active version").to_string(),
        reason,
    };
    let Some(name) = consumer.plugin_name() else {
        return Err(not_runnable(format!(
            "consumer `{}` runs a native handler, which may act outside its transaction, so it is not dry-run",
            consumer.name
        )));
    };
    let spec = plugins
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| not_runnable(format!("no [[plugins]] entry is named `{name}`")))?;
    let policy = consumer.txn_policy();
    let handler = if spec.source == PluginSource::Registry {
        let rollout = Rollout::new(
            engine,
            Registry::new(db.clone()),
            plugins.to_vec(),
            Vec::new(),
        )
        .map_err(FixForwardError::Plugin)?
        .with_consumers([name.to_string()]);
        if with.is_none() {
            rollout.refresh().await?;
        }
        let slot = rollout
            .consumer(name)
            .ok_or_else(|| not_runnable(format!("plugin `{name}` has no slot")))?;
        PluginHandler::swappable(slot, policy)
    } else {
        let plugin = ConsumerPlugin::load(&engine, spec)
            .map_err(|e| FixForwardError::Plugin(e.to_string()))?;
        PluginHandler::new(Arc::new(plugin), policy)
    }
    .with_db(db);
    let pinned = match with {
        Some(label) => handler
            .pin_version(label)
            .await
            .map_err(|e| not_runnable(e.to_string()))?,
        None => handler.pin(),
    };
    let mut out = Vec::with_capacity(letters.len());
    for letter in letters {
        let Some(delivery) = letter.delivery() else {
            return Err(not_runnable(format!(
                "dead letter {} was read without its payload",
                letter.id
            )));
        };
        let run = handler
            .dry_run(db, &consumer.name, &pinned, &delivery)
            .await;
        out.push(ConsumerDryRun { id: letter.id, run });
    }
    Ok(out)
}
