//! Fix-forward: redriving dead events through a chosen registry version of
//! one of their route's transformers (a candidate included), without
//! activating it for live traffic, and a dry run that shows what that
//! version would publish.
//!
//! The choice is stored on each row (`outbox.redrive_with`, migration
//! 0013); the relay that claims the row runs the route's chain with that
//! plugin replaced by the named version (`Chains::pinned_for_event`). The
//! redrive checks first that the version can run there, so an operator's
//! typo is an error now, not a second death later.

use chrono::{DateTime, Utc};
use outboxd_core::config::{PluginSource, PluginSpec};
use outboxd_core::route::{Route, Router};

use super::dead::DeadFilter;
use super::like_pattern;
use crate::broker::OutgoingMessage;
use crate::plugin::registry::{Registry, RegistryError};
use crate::plugin::versions::{BadLabel, VersionLabel};
use crate::plugin::{PluginEngine, Rollout};
use crate::store::Db;
use crate::store::dead_letters::{self, DeadSelection};

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
    let types = dead_letters::dead_event_types(db, selection(filter, type_like.as_deref())).await?;
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
    Ok(dead_letters::redrive_dead_events(
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
        dead_letters::dead_events_as_claimed(db, selection(filter, type_like.as_deref()), limit)
            .await?;
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
                    let msg = crate::relay::message_for_event(&router, &ev);
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
