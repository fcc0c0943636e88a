//! Reconciliation, the safety net for writes that bypass the outbox: a
//! configured query finds business
//! rows that should have an event but do not (a fix-up script that bypassed
//! `confirm_order`, say), reports them, and can enqueue the missing events.

use serde::Serialize;

use crate::config::ReconcileRule;
use crate::event::NewEvent;
use crate::store::outbox::reconcile::missing_events;
use crate::store::{Db, EnqueueError, InboxTx};

/// A `[[reconcile]]` entry, a config section, in `outboxd-core`.

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RuleReport {
    pub name: String,
    pub missing: usize,
    /// Up to 20 of the missing aggregates.
    pub samples: Vec<String>,
    pub enqueued: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(
        "reconcile rule `{rule}`: query failed: {source}; it must return aggregate_id, event_type, payload (JSON text)"
    )]
    Query { rule: String, source: sqlx::Error },
    #[error(
        "reconcile rule `{rule}`: row for `{aggregate}` has a payload that is not JSON: {message}"
    )]
    Payload {
        rule: String,
        aggregate: String,
        message: String,
    },
    #[error("reconcile rule `{rule}`: {source}")]
    Enqueue { rule: String, source: EnqueueError },
}

/// Runs one rule. With `enqueue` (or the rule's `enqueue_missing`) the
/// missing events are written, each with an operation key derived from the
/// rule and aggregate so two concurrent runs write one event.
pub async fn run_rule(
    db: &Db,
    rule: &ReconcileRule,
    enqueue_now: bool,
) -> Result<RuleReport, ReconcileError> {
    let qerr = |source| ReconcileError::Query {
        rule: rule.name.clone(),
        source,
    };
    let rows = missing_events(db, &rule.query).await.map_err(qerr)?;
    let mut report = RuleReport {
        name: rule.name.clone(),
        missing: rows.len(),
        samples: rows.iter().take(20).map(|r| r.0.clone()).collect(),
        enqueued: 0,
    };
    if !(enqueue_now || rule.enqueue_missing) {
        return Ok(report);
    }
    for (aggregate, event_type, payload) in rows {
        let payload: serde_json::Value =
            serde_json::from_str(&payload).map_err(|e| ReconcileError::Payload {
                rule: rule.name.clone(),
                aggregate: aggregate.clone(),
                message: e.to_string(),
            })?;
        let key = format!("reconcile:{}:{}:{}", rule.name, event_type, aggregate);
        let ev = NewEvent::new(aggregate, event_type, payload)
            .with_header("outboxd-reconciled", rule.name.clone())
            .with_operation_key("outboxd", key);
        let eerr = |source| ReconcileError::Enqueue {
            rule: rule.name.clone(),
            source,
        };
        let mut tx = InboxTx::begin(db).await.map_err(|e| eerr(e.into()))?;
        let created = tx.enqueue(ev).await.map_err(eerr)?;
        tx.commit().await.map_err(|e| eerr(e.into()))?;
        if !created.is_repeat() {
            report.enqueued += 1;
        }
    }
    Ok(report)
}
