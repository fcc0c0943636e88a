//! Per-key parking (`consumers[].on_dead = "park_key"`, the default) and
//! applying what an operator released.
//!
//! A message the runner gives up on parks its key: later messages of the
//! key are recorded as parked, in order, and not handled, while other keys
//! flow and the partition's offset moves on. An operator's redrive marks
//! the dead letter `redrive`; a discard resolves it. Either way the running
//! consumer then applies the key's rows here, oldest first, one
//! transaction each that holds the inbox mark, the effect and the row's
//! resolution, so a row is applied once whatever is killed when. The key
//! flows again once none of its rows is unresolved.
//!
//! The parked keys are read from the database every `parking_check` (so a
//! key parked or released by another process is seen) and kept in memory
//! between reads; a key this runner parks is held at once. A stale entry
//! only parks a message that could have run: it is then applied, in
//! order, on the next check.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Consumer, ConsumerError};
use crate::broker::MessageSource;
use crate::consumer::inbox::Handler;
use crate::consumer::inbox::HandlerError;
use crate::consumer::inbox::Processed;
use crate::consumer::inbox::mark_and_handle_pinned;
use crate::fault::FaultPoint;
use crate::message::Delivery;
use crate::store::InboxTx;
use crate::store::inbox::dead_letters::{self, ConsumerDeadLetter};

/// The runner's view of its parked keys.
#[derive(Debug, Default)]
pub(super) struct Parking {
    keys: Mutex<HashSet<Vec<u8>>>,
    last_check: Mutex<Option<Instant>>,
    /// Failed attempts at applying a released row, by row id.
    attempts: Mutex<HashMap<i64, u32>>,
}

/// The key a message parks under: messages without a key (or with an
/// empty one) have no order to keep and never park.
pub(super) fn key_of(d: &Delivery) -> Option<&[u8]> {
    d.key.as_deref().filter(|k| !k.is_empty())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// What applying one released row came to.
enum Applied {
    /// Its effect committed, or it was a duplicate: resolved.
    Done,
    /// Someone else resolved it first.
    Gone,
    /// It failed and stays released, to be tried again.
    Retry,
    /// It failed for good and is its key's dead letter again.
    DeadAgain,
}

impl<S: MessageSource, H: Handler> Consumer<S, H> {
    pub(super) fn parks_keys(&self) -> bool {
        self.config.on_dead == crate::config::OnDead::ParkKey
    }

    /// Whether `d` must wait behind a dead letter of its key.
    pub(super) fn is_parked(&self, d: &Delivery) -> bool {
        if !self.parks_keys() {
            return false;
        }
        match key_of(d) {
            Some(k) => {
                let keys = lock(&self.parking.keys);
                !keys.is_empty() && keys.contains(k)
            }
            None => false,
        }
    }

    /// Holds `d`'s key from now on (its message was just dead-lettered).
    pub(super) fn hold_key(&self, d: &Delivery) {
        if let Some(k) = key_of(d) {
            lock(&self.parking.keys).insert(k.to_vec());
        }
    }

    /// Records `d` as parked; false (the partition stops here and retries)
    /// when the record cannot be written: a message is never dropped.
    pub(super) async fn park(&self, d: &Delivery) -> bool {
        match dead_letters::park(&self.db, &self.config.name, d).await {
            Ok(()) => {
                tracing::info!(consumer = %self.config.name, topic = %d.topic, partition = d.partition, offset = d.offset, "message parked behind a dead letter of its key");
                self.stats.parked.fetch_add(1, Ordering::Relaxed);
                if let Some(m) = &self.metrics {
                    m.parking.parked.inc();
                }
                true
            }
            Err(e) => {
                tracing::error!(consumer = %self.config.name, topic = %d.topic, error = %e, "cannot record a parked message; will retry");
                false
            }
        }
    }

    /// Every `parking_check`: applies what an operator released, then
    /// rereads the parked keys. Returns how many rows were applied and
    /// whether one failed (so the loop pauses before trying again).
    pub(super) async fn check_parking(&mut self) -> Result<(usize, bool), ConsumerError> {
        {
            let mut last = lock(&self.parking.last_check);
            if last.is_some_and(|t| t.elapsed() < self.config.parking_check) {
                return Ok((0, false));
            }
            *last = Some(Instant::now());
        }
        let (applied, failed) = self.apply_released().await?;
        self.refresh_parked_keys().await;
        Ok((applied, failed))
    }

    async fn refresh_parked_keys(&self) {
        if !self.parks_keys() {
            return;
        }
        match dead_letters::parked_keys(&self.db, &self.config.name).await {
            Ok(parked) => {
                if let Some(m) = &self.metrics {
                    let p = &m.parking;
                    p.parked_keys.set(parked.keys.len() as u64);
                    p.parked_messages.set(parked.parked_messages.max(0) as u64);
                    let age = parked
                        .oldest
                        .map(|t| (chrono::Utc::now() - t).num_seconds().max(0) as u64)
                        .unwrap_or(0);
                    p.oldest_parked_seconds.set(age);
                }
                *lock(&self.parking.keys) = parked.keys;
            }
            Err(e) => {
                tracing::warn!(consumer = %self.config.name, error = %e, "cannot read the parked keys; keeping the ones known")
            }
        }
    }

    /// Applies released rows (and the parked rows behind them) until none
    /// is ready or one fails.
    async fn apply_released(&self) -> Result<(usize, bool), ConsumerError> {
        let mut applied = 0;
        loop {
            let rows = match dead_letters::next_to_apply(&self.db, &self.config.name, 100).await {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::warn!(consumer = %self.config.name, error = %e, "cannot read released dead letters; will retry");
                    return Ok((applied, true));
                }
            };
            if rows.is_empty() {
                return Ok((applied, false));
            }
            let mut progress = false;
            let mut failed = false;
            for row in &rows {
                match self.apply_row(row).await? {
                    Applied::Done => {
                        applied += 1;
                        progress = true;
                    }
                    Applied::Gone | Applied::DeadAgain => progress = true,
                    Applied::Retry => failed = true,
                }
            }
            if failed || !progress {
                return Ok((applied, failed));
            }
        }
    }

    /// One released row, in one transaction: the row taken, the inbox
    /// mark, the handler on the chosen version, the row resolved, commit.
    async fn apply_row(&self, row: &ConsumerDeadLetter) -> Result<Applied, ConsumerError> {
        let name = &self.config.name;
        let Some(d) = row.delivery() else {
            return Ok(self
                .failed_for_good(row, "the stored message could not be read back", "")
                .await);
        };
        let message_id = match d.message_id() {
            Ok(id) => id,
            Err(e) => return Ok(self.failed_for_good(row, &e, "").await),
        };
        let pinned = match &row.redrive_with {
            Some(label) => match self.handler.pin_version(label).await {
                Ok(p) => p,
                Err(e) => return Ok(self.failed(row, e, Some(label)).await),
            },
            None => self.handler.pin(),
        };
        let mut tx = match InboxTx::begin(&self.db).await {
            Ok(tx) => tx,
            Err(e) => return Ok(self.failed(row, e.into(), None).await),
        };
        if let Err(e) = self.handler.begin(&mut tx).await {
            let _ = tx.rollback().await;
            return Ok(self.failed(row, e.into(), None).await);
        }
        match dead_letters::take_for_apply(&mut tx, row.id).await {
            Ok(true) => {}
            Ok(false) => {
                let _ = tx.rollback().await;
                return Ok(Applied::Gone);
            }
            Err(e) => {
                let _ = tx.rollback().await;
                return Ok(self.failed(row, e.into(), None).await);
            }
        }
        let (handled_by, result) =
            mark_and_handle_pinned(&mut tx, name, message_id, &d, self.handler.as_ref(), pinned)
                .await;
        let outcome = match result {
            Ok(o) => o,
            Err(e) => {
                let _ = tx.rollback().await;
                return Ok(self.failed(row, e, handled_by.as_deref()).await);
            }
        };
        let resolution = match outcome {
            Processed::Handled => "applied",
            Processed::Duplicate => "duplicate",
        };
        let finish = async {
            dead_letters::resolve_in(&mut tx, row.id, resolution, chrono::Utc::now()).await?;
            self.handler.before_commit(&mut tx).await
        };
        if let Err(e) = finish.await {
            let _ = tx.rollback().await;
            return Ok(self.failed(row, e.into(), handled_by.as_deref()).await);
        }
        self.faults.check(FaultPoint::RedriveBeforeCommit).await?;
        if let Err(e) = tx.commit().await {
            return Ok(self.failed(row, e.into(), handled_by.as_deref()).await);
        }
        self.faults.check(FaultPoint::RedriveAfterCommit).await?;
        lock(&self.parking.attempts).remove(&row.id);
        tracing::info!(consumer = %name, id = row.id, state = %row.state, resolution, version = handled_by.as_deref().unwrap_or("-"), "applied a released dead letter");
        self.stats.redriven.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = &self.metrics {
            m.parking.redriven.inc();
        }
        self.count_processed(&d, outcome);
        Ok(Applied::Done)
    }

    /// A released row whose attempt failed: a version that cannot run yet
    /// waits; a retryable failure is tried again up to `max_attempts`; then,
    /// or at once when permanent, the row is its key's dead letter again.
    async fn failed(
        &self,
        row: &ConsumerDeadLetter,
        err: HandlerError,
        handled_by: Option<&str>,
    ) -> Applied {
        self.count_failed();
        if let HandlerError::Unavailable(why) = &err {
            tracing::warn!(consumer = %self.config.name, id = row.id, reason = %why, "no handler version can run the released dead letter yet; it waits");
            return Applied::Retry;
        }
        let attempts = {
            let mut map = lock(&self.parking.attempts);
            let n = map.entry(row.id).or_insert(0);
            *n += 1;
            *n
        };
        if matches!(err, HandlerError::Retryable(_)) && attempts < self.config.max_attempts {
            tracing::warn!(consumer = %self.config.name, id = row.id, error = %err, attempts, "applying a released dead letter failed; will retry");
            return Applied::Retry;
        }
        let handler = match handled_by {
            Some(label) => format!("plugin {label}"),
            None => self.config.handler_id.clone(),
        };
        self.failed_for_good(row, &err.to_string(), &handler).await
    }

    async fn failed_for_good(
        &self,
        row: &ConsumerDeadLetter,
        error: &str,
        handler: &str,
    ) -> Applied {
        let attempts = lock(&self.parking.attempts).remove(&row.id).unwrap_or(1);
        let handler = if handler.is_empty() {
            self.config.handler_id.as_str()
        } else {
            handler
        };
        match dead_letters::failed_again(
            &self.db,
            row.id,
            error,
            handler,
            attempts,
            chrono::Utc::now(),
        )
        .await
        {
            Ok(()) => {
                tracing::error!(consumer = %self.config.name, id = row.id, error, "a released dead letter failed again; it is its key's dead letter again");
                self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                if let Some(m) = &self.metrics {
                    m.dead_lettered.inc();
                }
                Applied::DeadAgain
            }
            Err(e) => {
                tracing::error!(consumer = %self.config.name, id = row.id, error = %e, "cannot record a failed redrive; will retry");
                Applied::Retry
            }
        }
    }
}
