//! Dead letters: events the relay gave up on. They stay in the outbox,
//! hold back later events of their aggregate, and wait for a person to
//! redrive them (try again from zero attempts) or discard them with a reason.
//! The statements are the store's (`store/outbox/dead.rs`).

use chrono::{DateTime, Utc};

use super::like_pattern;
use crate::store::Db;
use crate::store::outbox::dead::DeadEvent;
use crate::store::outbox::dead::{self, DeadSelection};

/// Which dead events an operation applies to.
#[derive(Debug, Clone, Default)]
pub struct DeadFilter {
    pub seq: Option<i64>,
    /// `order.*`, `*` or an exact type.
    pub event_type: Option<String>,
    pub aggregate_id: Option<String>,
}

impl DeadFilter {
    /// The store's selection for this filter, with `type_like` the LIKE
    /// pattern of its event type ([`like_pattern`]).
    fn selection<'a>(&'a self, type_like: Option<&'a str>) -> DeadSelection<'a> {
        DeadSelection {
            seq: self.seq,
            type_like,
            aggregate_id: self.aggregate_id.as_deref(),
        }
    }
}

/// Lists dead events, oldest first.
pub async fn list(db: &Db, filter: &DeadFilter, limit: i64) -> Result<Vec<DeadEvent>, sqlx::Error> {
    let type_like = filter.event_type.as_deref().map(like_pattern);
    dead::list_dead_events(db, filter.selection(type_like.as_deref()), limit).await
}

/// One dead event, if `seq` is dead.
pub async fn get(db: &Db, seq: i64) -> Result<Option<DeadEvent>, sqlx::Error> {
    let filter = DeadFilter {
        seq: Some(seq),
        ..DeadFilter::default()
    };
    Ok(list(db, &filter, 1).await?.into_iter().next())
}

/// Makes matching dead events pending again, due now, with zero attempts.
/// An empty filter redrives every dead event. Returns how many.
pub async fn redrive(db: &Db, filter: &DeadFilter, now: DateTime<Utc>) -> Result<u64, sqlx::Error> {
    let type_like = filter.event_type.as_deref().map(like_pattern);
    dead::redrive_dead_events(db, filter.selection(type_like.as_deref()), None, now).await
}

#[derive(Debug, thiserror::Error)]
pub enum DiscardError {
    #[error("a discard needs a reason, for the audit trail")]
    NoReason,
    #[error("outbox row {0} is not a dead event; only dead events can be discarded")]
    NotDead(i64),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// Finishes a dead event without publishing it, recording why. Its
/// aggregate's later events then flow again.
pub async fn discard(
    db: &Db,
    seq: i64,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<(), DiscardError> {
    if reason.trim().is_empty() {
        return Err(DiscardError::NoReason);
    }
    if !dead::discard_dead_event(db, seq, reason, now).await? {
        return Err(DiscardError::NotDead(seq));
    }
    Ok(())
}
