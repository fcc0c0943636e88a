//! Operations on a running outbox: retention, dead letters (inspect,
//! redrive, discard; fix-forward through a chosen plugin version) and
//! reconciliation against business tables; the outbound calls plugins
//! made, by idempotency key.

pub mod consumer_dead;
pub mod dead;
pub mod fix_forward;
pub mod metrics;
pub mod outbound;
pub mod reconcile;
pub mod retention;

/// Turns an event-type pattern (`order.*`, `*`, or exact) into a LIKE pattern.
pub(crate) fn like_pattern(pattern: &str) -> String {
    let escaped = pattern
        .replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_");
    match escaped.strip_suffix('*') {
        Some(prefix) => format!("{prefix}%"),
        None => escaped,
    }
}
