//! A failed message in the consumer loop: its failed attempts counted per
//! (topic, partition, offset), and after a permanent failure or
//! `max_attempts` its dead letter (the `consumer_dead_letters` record, and
//! `<topic>.dlq` on Kafka) so the partition moves on. A message whose dead
//! letter cannot be written stays: it is never dropped.

use std::sync::atomic::Ordering;

use super::{Consumer, parking};
use crate::broker::MessageSource;
use crate::consumer::dead_letter;
use crate::consumer::inbox::{Handler, HandlerError};
use crate::message::Delivery;

impl<S: MessageSource, H: Handler> Consumer<S, H> {
    /// Counts a failed attempt; when the failure is permanent or attempts
    /// are exhausted, dead-letters the message and returns true, so the
    /// partition moves on. If the record cannot be written, the message
    /// stays (false): it is never dropped. `handled_by` is the version that
    /// failed, when the handler named one (a swappable plugin's).
    pub(super) async fn give_up(
        &self,
        d: &Delivery,
        err: &HandlerError,
        handled_by: Option<&str>,
    ) -> bool {
        if let HandlerError::Unavailable(why) = err {
            tracing::warn!(topic = %d.topic, partition = d.partition, reason = %why, "no handler version can run; the message waits");
            return false;
        }
        let key = (d.topic.clone(), d.partition, d.offset);
        let attempts = match self.attempts.lock() {
            Ok(mut map) => {
                // Bounded: only messages currently failing are tracked.
                if map.len() > 100_000 {
                    map.clear();
                }
                let n = map.entry(key).or_insert(0);
                *n += 1;
                *n
            }
            Err(_) => 1,
        };
        let permanent = matches!(err, HandlerError::Permanent(_));
        if !permanent && attempts < self.config.max_attempts {
            return false;
        }
        let reason = err.to_string();
        let handler = match handled_by {
            Some(label) => format!("plugin {label}"),
            None => self.config.handler_id.clone(),
        };
        let handler = handler.as_str();
        if let Some(dlq) = &self.dlq_topic
            && let Err(e) = dlq(dead_letter::dlq_message(
                &self.config.name,
                d,
                &reason,
                handler,
                attempts,
            ))
            .await
        {
            tracing::error!(error = %e, topic = %d.topic, "cannot publish to the dead-letter topic; will retry");
            return false;
        }
        let holds_key = self.parks_keys() && parking::key_of(d).is_some();
        if let Err(e) = crate::store::inbox::dead_letters::record(
            &self.db,
            &self.config.name,
            d,
            &reason,
            handler,
            attempts,
            holds_key,
        )
        .await
        {
            tracing::error!(error = %e, topic = %d.topic, "cannot write the dead-letter record; will retry");
            return false;
        }
        if holds_key {
            self.hold_key(d);
            tracing::error!(consumer = %self.config.name, topic = %d.topic, partition = d.partition, offset = d.offset, attempts, error = %reason, "message dead-lettered; its key is parked until the dead letter is redriven or discarded (`outboxd dead list --consumer {}`), other keys move on", self.config.name);
        } else {
            tracing::error!(consumer = %self.config.name, topic = %d.topic, partition = d.partition, offset = d.offset, attempts, error = %reason, "message dead-lettered; the partition moves on");
        }
        self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = &self.metrics {
            m.dead_lettered.inc();
        }
        true
    }

    /// How often `d` has failed here so far; what the handler sees as the
    /// message's `attempt`.
    pub(super) fn failed_attempts(&self, d: &Delivery) -> u32 {
        match self.attempts.lock() {
            Ok(map) if !map.is_empty() => map
                .get(&(d.topic.clone(), d.partition, d.offset))
                .copied()
                .unwrap_or(0),
            _ => 0,
        }
    }

    pub(super) fn forget_attempts(&self, d: &Delivery) {
        if let Ok(mut map) = self.attempts.lock()
            && !map.is_empty()
        {
            map.remove(&(d.topic.clone(), d.partition, d.offset));
        }
    }
}
