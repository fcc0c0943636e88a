//! Fault injection at the durable boundaries, where a crash would lose or
//! duplicate an event if the design were wrong (the crash-matrix tests).
//!
//! Production code calls [`Faults::check`] at each point. By default nothing
//! is armed and the check is a branch on `None`. Tests arm one point either
//! to return an error (an in-process "crash" that skips the rest of the
//! step) or, through `OUTBOXD_FAULT`, to stop the process where a test then
//! kills it with SIGKILL.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// Write path: before the producer's transaction begins.
    BeforeTransaction,
    /// Write path: after the business change and the outbox insert, before commit.
    AfterInsertBeforeCommit,
    /// Write path: after commit, before the caller hears about it.
    AfterCommitBeforeReply,
    /// Relay: after the broker acknowledged, before the rows are marked.
    AfterPublishBeforeMark,
    /// Relay: after the mark committed.
    AfterMark,
    /// Consumer: after the effect committed, before the offset is stored.
    AfterHandleBeforeCommitOffset,
    /// Consumer redrive: a redriven message's effect and its dead letter's
    /// resolution are written, before their transaction commits.
    RedriveBeforeCommit,
    /// Consumer redrive: after a redriven message's transaction committed,
    /// before the next one.
    RedriveAfterCommit,
    /// `outboxd dead redrive --consumer`: the release is written, before
    /// its transaction commits.
    RedriveReleaseBeforeCommit,
    /// Consumer plugin: `handle` returned ok and its HTTP outcomes are
    /// written, before the inbox transaction commits (after an external
    /// effect, before the mark).
    ConsumerBeforeCommit,
    /// WAL relay: the batch is published and marked, before the slot's
    /// position moves past it (the stream replays it after a crash).
    WalAfterMarkBeforeConfirm,
}

impl FaultPoint {
    pub const ALL: [FaultPoint; 11] = [
        FaultPoint::BeforeTransaction,
        FaultPoint::AfterInsertBeforeCommit,
        FaultPoint::AfterCommitBeforeReply,
        FaultPoint::AfterPublishBeforeMark,
        FaultPoint::AfterMark,
        FaultPoint::AfterHandleBeforeCommitOffset,
        FaultPoint::RedriveBeforeCommit,
        FaultPoint::RedriveAfterCommit,
        FaultPoint::RedriveReleaseBeforeCommit,
        FaultPoint::ConsumerBeforeCommit,
        FaultPoint::WalAfterMarkBeforeConfirm,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultPoint::BeforeTransaction => "before-transaction",
            FaultPoint::AfterInsertBeforeCommit => "after-insert-before-commit",
            FaultPoint::AfterCommitBeforeReply => "after-commit-before-reply",
            FaultPoint::AfterPublishBeforeMark => "after-publish-before-mark",
            FaultPoint::AfterMark => "after-mark",
            FaultPoint::AfterHandleBeforeCommitOffset => "after-handle-before-commit-offset",
            FaultPoint::RedriveBeforeCommit => "redrive-before-commit",
            FaultPoint::RedriveAfterCommit => "redrive-after-commit",
            FaultPoint::RedriveReleaseBeforeCommit => "redrive-release-before-commit",
            FaultPoint::ConsumerBeforeCommit => "consumer-before-commit",
            FaultPoint::WalAfterMarkBeforeConfirm => "wal-after-mark-before-confirm",
        }
    }
}

impl FromStr for FaultPoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FaultPoint::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = FaultPoint::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown fault point `{s}`; expected one of {}",
                    names.join(", ")
                )
            })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Return [`InjectedFault`] from the check.
    Error,
    /// Print `OUTBOXD FAULT <point>` to stderr and stop making progress, so a
    /// test can SIGKILL the process at exactly this point.
    Hang,
}

/// The error an armed point returns.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("injected fault at {}", .0.name())]
pub struct InjectedFault(pub FaultPoint);

#[derive(Debug)]
struct Plan {
    point: FaultPoint,
    action: FaultAction,
    /// The point fires on this hit (1 = first).
    fire_on: u32,
    hits: AtomicU32,
}

/// A cheap, cloneable handle; the default arms nothing.
#[derive(Debug, Clone, Default)]
pub struct Faults(Option<Arc<Plan>>);

impl Faults {
    pub fn none() -> Self {
        Self(None)
    }

    /// Arms `point` to fire on its `fire_on`-th hit (1-based), once.
    pub fn arm(point: FaultPoint, action: FaultAction, fire_on: u32) -> Self {
        Self(Some(Arc::new(Plan {
            point,
            action,
            fire_on: fire_on.max(1),
            hits: AtomicU32::new(0),
        })))
    }

    /// Parses `POINT:ACTION[:N]`, for example `after-publish-before-mark:hang:3`.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut parts = spec.split(':');
        let point: FaultPoint = parts.next().unwrap_or_default().parse()?;
        let action = match parts.next() {
            Some("error") => FaultAction::Error,
            Some("hang") | None => FaultAction::Hang,
            Some(other) => {
                return Err(format!(
                    "unknown fault action `{other}` in `{spec}`; expected error or hang"
                ));
            }
        };
        let fire_on = match parts.next() {
            Some(n) => n
                .parse()
                .map_err(|_| format!("fault hit count `{n}` in `{spec}` is not a number"))?,
            None => 1,
        };
        Ok(Self::arm(point, action, fire_on))
    }

    /// Called at each fault point by production code.
    pub async fn check(&self, point: FaultPoint) -> Result<(), InjectedFault> {
        let Some(plan) = &self.0 else { return Ok(()) };
        if plan.point != point {
            return Ok(());
        }
        let hit = plan.hits.fetch_add(1, Ordering::SeqCst) + 1;
        if hit != plan.fire_on {
            return Ok(());
        }
        match plan.action {
            FaultAction::Error => Err(InjectedFault(point)),
            FaultAction::Hang => {
                eprintln!("OUTBOXD FAULT {}", point.name());
                std::future::pending::<()>().await;
                Err(InjectedFault(point))
            }
        }
    }
}
