//! `[retention]` and `[[reconcile]]`: what the host's cleanup and
//! reconciliation tasks (`ops/`) are told to do.

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionConfig {
    /// Delete published outbox rows after this many days.
    #[serde(default = "d7")]
    pub published_days: f64,
    /// Replace the payload of published rows with `null` after this many
    /// days (inbox ids tie messages to customers: keep them no longer than dedup needs); must not exceed `published_days`.
    #[serde(default)]
    pub purge_payload_days: Option<f64>,
    /// Inbox rows must outlive every possible redelivery.
    #[serde(default = "d30")]
    pub inbox_days: f64,
    /// Rows per statement.
    #[serde(default = "b5000")]
    pub batch_size: i64,
    /// How often `outboxd run` cleans up, in seconds.
    #[serde(default = "hourly")]
    pub interval_seconds: u64,
}

fn d7() -> f64 {
    7.0
}
fn d30() -> f64 {
    30.0
}
fn b5000() -> i64 {
    5000
}
fn hourly() -> u64 {
    3600
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            published_days: d7(),
            purge_payload_days: None,
            inbox_days: d30(),
            batch_size: b5000(),
            interval_seconds: hourly(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcileRule {
    pub name: String,
    /// Returns one row per missing event: `aggregate_id`, `event_type`, and
    /// `payload` as JSON text, in that order.
    pub query: String,
    /// Enqueue the missing events instead of only reporting them.
    #[serde(default)]
    pub enqueue_missing: bool,
}
