//! Consumer dead letters an operator acts on: list, show, redrive (through
//! the active version or, fix-forward, a chosen one) and discard. An
//! operation only changes the rows' state; the running consumer applies
//! what was released, in order per key (`consumer/runner/parking.rs`). The
//! statements are the store's (`store/inbox/dead_letters.rs`).

use chrono::{DateTime, Utc};

use crate::fault::Faults;
use crate::store::Db;
use crate::store::inbox::dead_letters::{self, RedriveError, Selection};
use crate::store::inbox::dead_letters::{ConsumerDeadLetter, ConsumerDeadSummary};

/// Which dead letters of a consumer a redrive releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Id(i64),
    Key(String),
    All,
}

#[derive(Debug, thiserror::Error)]
pub enum ConsumerDeadError {
    #[error(
        "consumer `{consumer}` has no dead letter {id} (see `outboxd dead list --consumer {consumer}`)"
    )]
    NotFound { consumer: String, id: i64 },
    #[error(
        "dead letter {id} of consumer `{consumer}` is parked behind dead letter {behind} of the same key; redrive or discard {behind}, and {id} follows in order"
    )]
    Parked {
        consumer: String,
        id: i64,
        behind: i64,
    },
    #[error("dead letter {id} of consumer `{consumer}` is already resolved ({resolution})")]
    Resolved {
        consumer: String,
        id: i64,
        resolution: String,
    },
    #[error(
        "`--with {with}`: {why}; give NAME@VERSION of the consumer's plugin (`outboxd plugin list` shows the versions)"
    )]
    BadVersion { with: String, why: String },
    #[error("say why the dead letter is discarded: --reason TEXT (kept with it)")]
    NoReason,
    #[error("the redrive was interrupted: {0}")]
    Interrupted(crate::fault::InjectedFault),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

impl From<RedriveError> for ConsumerDeadError {
    fn from(e: RedriveError) -> Self {
        match e {
            RedriveError::Database(e) => e.into(),
            RedriveError::Fault(f) => ConsumerDeadError::Interrupted(f),
        }
    }
}

/// `consumer`'s unresolved dead letters and parked messages, oldest first,
/// optionally of one key.
pub async fn list(
    db: &Db,
    consumer: &str,
    key: Option<&str>,
    limit: i64,
) -> Result<Vec<ConsumerDeadLetter>, sqlx::Error> {
    dead_letters::list(db, consumer, key.map(str::as_bytes), false, limit).await
}

/// One dead letter in full: payload, headers, error, attempts, version.
pub async fn show(
    db: &Db,
    consumer: &str,
    id: i64,
) -> Result<ConsumerDeadLetter, ConsumerDeadError> {
    dead_letters::get(db, consumer, id)
        .await?
        .ok_or_else(|| ConsumerDeadError::NotFound {
            consumer: consumer.to_string(),
            id,
        })
}

/// Refuses a row an operator cannot act on directly: missing, resolved, or
/// parked behind another.
async fn actionable(
    db: &Db,
    consumer: &str,
    id: i64,
) -> Result<ConsumerDeadLetter, ConsumerDeadError> {
    let row = show(db, consumer, id).await?;
    if let Some(resolution) = &row.resolution {
        return Err(ConsumerDeadError::Resolved {
            consumer: consumer.to_string(),
            id,
            resolution: resolution.clone(),
        });
    }
    if row.state == dead_letters::PARKED {
        let behind = match &row.key_bytes {
            Some(k) => dead_letters::head_of_key(db, consumer, k).await?,
            None => None,
        };
        return Err(ConsumerDeadError::Parked {
            consumer: consumer.to_string(),
            id,
            behind: behind.unwrap_or(id),
        });
    }
    Ok(row)
}

/// Checks a fix-forward choice: `NAME@VERSION` of `plugin`, the consumer's
/// own plugin, stored in the registry.
pub async fn check_with(
    db: &Db,
    plugin: Option<&str>,
    with: &str,
) -> Result<(), ConsumerDeadError> {
    let bad = |why: String| ConsumerDeadError::BadVersion {
        with: with.to_string(),
        why,
    };
    let (name, version) = with
        .rsplit_once('@')
        .ok_or_else(|| bad("not NAME@VERSION".into()))?;
    let version: i64 = version
        .parse()
        .map_err(|_| bad(format!("version `{version}` is not a number")))?;
    match plugin {
        Some(p) if p == name => {}
        Some(p) => {
            return Err(bad(format!(
                "this consumer runs plugin `{p}`, not `{name}`"
            )));
        }
        None => {
            return Err(bad(
                "this consumer's handler is built in, not a plugin with versions".into(),
            ));
        }
    }
    if crate::store::registry::component(db, name, version)
        .await?
        .is_none()
    {
        return Err(bad(format!(
            "the registry has no version {version} of `{name}`"
        )));
    }
    Ok(())
}

/// Releases the selected dead letters for the running consumer to apply,
/// through `with` when given (fix-forward, checked by the caller with
/// [`check_with`]). Returns how many were released.
pub async fn redrive(
    db: &Db,
    consumer: &str,
    target: &Target,
    with: Option<&str>,
    faults: &Faults,
) -> Result<u64, ConsumerDeadError> {
    let selection = match target {
        Target::Id(id) => {
            let row = actionable(db, consumer, *id).await?;
            if row.state == dead_letters::REDRIVE {
                return Ok(0);
            }
            Selection::Id(*id)
        }
        Target::Key(k) => Selection::Key(k.as_bytes()),
        Target::All => Selection::All,
    };
    Ok(dead_letters::redrive(db, consumer, selection, with, faults).await?)
}

/// What a discard did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Discarded {
    pub id: i64,
    /// Messages that were parked behind it and now run, in order.
    pub released: i64,
}

/// Resolves dead letter `id` as discarded, with `reason`; the messages
/// parked behind it then run in order.
pub async fn discard(
    db: &Db,
    consumer: &str,
    id: i64,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<Discarded, ConsumerDeadError> {
    if reason.trim().is_empty() {
        return Err(ConsumerDeadError::NoReason);
    }
    let row = actionable(db, consumer, id).await?;
    if !dead_letters::discard(db, consumer, id, reason, now).await? {
        // Resolved between the check and the statement.
        return Err(ConsumerDeadError::Resolved {
            consumer: consumer.to_string(),
            id,
            resolution: "by someone else just now".into(),
        });
    }
    let released = match (&row.key_bytes, row.holds_key) {
        (Some(k), true) => dead_letters::parked_behind(db, consumer, k).await?,
        _ => 0,
    };
    Ok(Discarded { id, released })
}

/// Per consumer: dead letters waiting, parked keys and messages.
pub async fn summary(db: &Db) -> Result<Vec<ConsumerDeadSummary>, sqlx::Error> {
    dead_letters::consumer_dead_summary(db).await
}
