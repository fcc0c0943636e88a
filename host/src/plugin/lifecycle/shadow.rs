//! Shadow runs: a candidate version runs on the same events as the active
//! one; its outputs are compared and counted here, and never published.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use crate::plugin::bindings::GuestMessage;
use crate::store::registry::ShadowTotals;

/// Mismatching events kept as samples per candidate and host.
pub const MAX_SAMPLES: usize = 5;

/// Counters for one candidate version on this host.
#[derive(Debug, Default)]
pub struct ShadowStats {
    matches: AtomicI64,
    mismatches: AtomicI64,
    errors: AtomicI64,
    shadow_micros: AtomicI64,
    active_micros: AtomicI64,
    samples: Mutex<Vec<String>>,
}

/// How a shadow call compared with the active call on one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Comparison {
    Match,
    /// The outputs differ (or only the active version failed).
    Mismatch(String),
    /// The candidate failed.
    Error(String),
}

impl ShadowStats {
    /// Counts one event. `event_id` names it in a mismatch sample.
    pub fn record(
        &self,
        event_id: &str,
        comparison: &Comparison,
        active: Duration,
        shadow: Duration,
    ) {
        self.active_micros
            .fetch_add(active.as_micros() as i64, Ordering::Relaxed);
        self.shadow_micros
            .fetch_add(shadow.as_micros() as i64, Ordering::Relaxed);
        let counter = match comparison {
            Comparison::Match => &self.matches,
            Comparison::Mismatch(_) => &self.mismatches,
            Comparison::Error(_) => &self.errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Comparison::Mismatch(why) | Comparison::Error(why) = comparison
            && let Ok(mut samples) = self.samples.lock()
            && samples.len() < MAX_SAMPLES
        {
            samples.push(format!("event {event_id}: {why}"));
        }
    }

    pub fn totals(&self) -> ShadowTotals {
        ShadowTotals {
            matches: self.matches.load(Ordering::Relaxed),
            mismatches: self.mismatches.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            shadow_micros: self.shadow_micros.load(Ordering::Relaxed),
            active_micros: self.active_micros.load(Ordering::Relaxed),
            samples: self.samples.lock().map(|s| s.clone()).unwrap_or_default(),
        }
    }
}

/// Compares the active chain's result with the shadow chain's.
pub fn compare<E: std::fmt::Display>(
    active: &Result<Vec<GuestMessage>, E>,
    shadow: &Result<Vec<GuestMessage>, E>,
) -> Comparison {
    match (active, shadow) {
        (_, Err(e)) => Comparison::Error(e.to_string()),
        (Err(e), Ok(_)) => Comparison::Mismatch(format!("active failed ({e}), shadow succeeded")),
        (Ok(a), Ok(s)) if a.len() != s.len() => {
            Comparison::Mismatch(format!("{} outputs, shadow {}", a.len(), s.len()))
        }
        (Ok(a), Ok(s)) => {
            for (i, (a, s)) in a.iter().zip(s).enumerate() {
                let what = if a.topic != s.topic {
                    "topic"
                } else if a.key != s.key {
                    "key"
                } else if a.payload != s.payload {
                    "payload"
                } else if a.headers != s.headers {
                    "headers"
                } else {
                    continue;
                };
                return Comparison::Mismatch(format!("output {i}: {what} differs"));
            }
            Comparison::Match
        }
    }
}
