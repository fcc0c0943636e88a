//! `GET /api/consumers`: one row per consumer for the dashboard's
//! consumers panel. The backlog (from the database on the embedded
//! transport, from the broker on Kafka) and the dead letters cover every
//! process; the counters and the rate are this process's own consumers'.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::AdminState;
use super::error::ApiError;
use super::history::History;
use crate::consumer::metrics::ConsumerMetrics;
use crate::store::inbox::dead_letters::ConsumerDeadSummary;
use crate::store::inbox::dead_letters::consumer_dead_summary;
use crate::store::transport::backlog::{GroupBacklog, embedded_backlog};

pub(super) fn routes() -> Router<AdminState> {
    Router::new().route("/api/consumers", get(list))
}

/// One consumer as the consumers panel shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ConsumerRow {
    pub name: String,
    /// Whether this process runs it; the counters are `null` when not.
    pub in_this_process: bool,
    /// Messages published to it and not handled yet: past its cursors on
    /// the embedded transport, past its group's commits on Kafka; `null`
    /// when unknown (assigned Kafka partitions, or the broker did not
    /// answer: then `lag_error` says why).
    pub lag: Option<i64>,
    pub lag_error: Option<String>,
    /// The oldest message it has not handled: the oldest one past its
    /// cursors, or the oldest of its dead and parked messages.
    pub oldest_unhandled_at: Option<DateTime<Utc>>,
    pub oldest_unhandled_age_seconds: Option<f64>,
    pub processed_total: Option<u64>,
    /// Over the last two dashboard samples (`admin.sample_seconds` apart).
    pub processed_per_second: Option<f64>,
    pub duplicates_total: Option<u64>,
    pub failed_total: Option<u64>,
    /// Dead letters waiting for an operator.
    pub dead_letters: i64,
    pub parked_keys: i64,
    pub parked_messages: i64,
    pub oldest_parked_at: Option<DateTime<Utc>>,
}

async fn list(State(s): State<AdminState>) -> Result<Response, ApiError> {
    let backlog = embedded_backlog(&s.db).await.map_err(ApiError::internal)?;
    let dead = consumer_dead_summary(&s.db)
        .await
        .map_err(ApiError::internal)?;
    let kafka = match &s.consumer_lag {
        Some(read) => tokio::time::timeout(KAFKA_LAG_WAIT, read())
            .await
            .unwrap_or_default(),
        None => BTreeMap::new(),
    };
    Ok(Json(rows(
        Sources {
            here: &s.metrics.consumers(),
            backlog: &backlog,
            kafka: &kafka,
            dead: &dead,
        },
        &s.history,
        Utc::now(),
    ))
    .into_response())
}

/// How long `/api/consumers` waits for the Kafka lag before it answers
/// without it.
const KAFKA_LAG_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// What a consumer's row is made of.
pub struct Sources<'a> {
    /// This process's consumers and their counters.
    pub here: &'a [(String, std::sync::Arc<ConsumerMetrics>)],
    /// The embedded transport's groups.
    pub backlog: &'a [GroupBacklog],
    /// The Kafka groups' lag, by consumer.
    pub kafka: &'a BTreeMap<String, Result<i64, String>>,
    pub dead: &'a [ConsumerDeadSummary],
}

/// Every consumer that runs here, has cursors or has dead letters, by name.
pub fn rows(src: Sources<'_>, history: &History, now: DateTime<Utc>) -> Vec<ConsumerRow> {
    let Sources {
        here,
        backlog,
        kafka,
        dead,
    } = src;
    let names: BTreeSet<&str> = here
        .iter()
        .map(|(n, _)| n.as_str())
        .chain(backlog.iter().map(|b| b.group.as_str()))
        .chain(kafka.keys().map(String::as_str))
        .chain(dead.iter().map(|d| d.consumer.as_str()))
        .collect();
    let rates = rates(history);
    names
        .into_iter()
        .map(|name| {
            let m = here.iter().find(|(n, _)| n == name).map(|(_, m)| m);
            let b = backlog.iter().find(|b| b.group == name);
            let d = dead.iter().find(|d| d.consumer == name);
            let oldest_parked_at = d.and_then(|d| d.oldest_parked_at);
            let oldest = [b.and_then(|b| b.oldest_published_at), oldest_parked_at]
                .into_iter()
                .flatten()
                .min();
            let load = |pick: fn(&ConsumerMetrics) -> u64| m.map(|m| pick(m));
            ConsumerRow {
                name: name.to_string(),
                in_this_process: m.is_some(),
                lag: b
                    .map(|b| b.messages)
                    .or_else(|| kafka.get(name).and_then(|r| r.as_ref().ok().copied())),
                lag_error: kafka.get(name).and_then(|r| r.as_ref().err().cloned()),
                oldest_unhandled_at: oldest,
                oldest_unhandled_age_seconds: oldest
                    .map(|t| ((now - t).num_milliseconds() as f64 / 1000.0).max(0.0)),
                processed_total: load(|m| m.processed.load(Ordering::Relaxed)),
                processed_per_second: m.and_then(|_| rates.get(name).copied()),
                duplicates_total: load(|m| m.duplicates.load(Ordering::Relaxed)),
                failed_total: load(|m| m.failed.load(Ordering::Relaxed)),
                dead_letters: d.map_or(0, |d| d.dead),
                parked_keys: d.map_or(0, |d| d.parked_keys),
                parked_messages: d.map_or(0, |d| d.parked_messages),
                oldest_parked_at,
            }
        })
        .collect()
}

/// Messages per second each consumer processed between the newest two
/// samples.
fn rates(history: &History) -> BTreeMap<String, f64> {
    let Some((a, b)) = history.last_two() else {
        return BTreeMap::new();
    };
    let secs = (b.at - a.at).num_milliseconds() as f64 / 1000.0;
    if secs <= 0.0 {
        return BTreeMap::new();
    }
    b.consumers_processed
        .iter()
        .filter_map(|(name, now)| {
            let before = a.consumers_processed.get(name)?;
            Some((name.clone(), now.saturating_sub(*before) as f64 / secs))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::history::Sample;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::UNIX_EPOCH + chrono::Duration::seconds(secs)
    }

    fn sample(secs: i64, processed: u64) -> Sample {
        Sample {
            at: at(secs),
            pending: 0,
            oldest_pending_age_seconds: 0.0,
            dead: 0,
            published_total: 0,
            consumers_processed: [("billing".to_string(), processed)].into(),
        }
    }

    #[test]
    fn a_row_joins_this_process_counters_the_backlog_and_the_dead_letters() {
        let billing = std::sync::Arc::new(ConsumerMetrics::default());
        billing.processed.store(30, Ordering::Relaxed);
        billing.duplicates.store(2, Ordering::Relaxed);
        let history = History::default();
        history.push(sample(100, 10));
        history.push(sample(104, 30));
        let backlog = [
            GroupBacklog {
                group: "billing".into(),
                messages: 5,
                oldest_published_at: Some(at(150)),
            },
            GroupBacklog {
                group: "audit".into(),
                messages: 0,
                oldest_published_at: None,
            },
        ];
        let dead = [ConsumerDeadSummary {
            consumer: "billing".into(),
            dead: 1,
            parked_keys: 1,
            parked_messages: 3,
            oldest_parked_at: Some(at(120)),
        }];
        let kafka = [
            ("ledger".to_string(), Ok(7)),
            ("audit-kafka".to_string(), Err("broker down".to_string())),
        ]
        .into();
        let rows = rows(
            Sources {
                here: &[("billing".to_string(), billing)],
                backlog: &backlog,
                kafka: &kafka,
                dead: &dead,
            },
            &history,
            at(200),
        );
        assert_eq!(rows.len(), 4, "{rows:?}");
        // A Kafka group's lag, and why another's is unknown.
        assert_eq!((rows[1].name.as_str(), rows[1].lag), ("audit-kafka", None));
        assert_eq!(rows[1].lag_error.as_deref(), Some("broker down"));
        assert_eq!((rows[3].name.as_str(), rows[3].lag), ("ledger", Some(7)));
        let rows = [rows[0].clone(), rows[2].clone()];
        // Another process's consumer: the database's numbers, no counters.
        assert_eq!(rows[0].name, "audit");
        assert!(!rows[0].in_this_process);
        assert_eq!((rows[0].lag, rows[0].processed_total), (Some(0), None));
        assert_eq!(rows[0].oldest_unhandled_at, None);
        let b = &rows[1];
        assert_eq!(
            (b.lag, b.processed_total, b.duplicates_total, b.dead_letters),
            (Some(5), Some(30), Some(2), 1)
        );
        assert_eq!((b.parked_keys, b.parked_messages), (1, 3));
        assert_eq!(b.processed_per_second, Some(5.0), "20 messages in 4 s");
        // The parked message is older than the backlog's oldest.
        assert_eq!(b.oldest_unhandled_at, Some(at(120)));
        assert_eq!(b.oldest_unhandled_age_seconds, Some(80.0));
    }
}
