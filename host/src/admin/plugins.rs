//! The plugin registry over HTTP: list (with this process's counters of
//! each version), activate, roll back. The same operations as `outboxd
//! plugin list|activate|rollback`, behind the token.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AdminState;
use super::error::ApiError;
use crate::plugin::Registry;
use crate::plugin::metrics::PluginReport;
use crate::store::registry::PluginRecord;

/// `GET /api/plugins`: one row per plugin version, whether the registry
/// stores it, this process has loaded it, or both: the registry's record
/// (state, shadow flag and counters summed over hosts) and this process's
/// counters (calls, errors by kind, p99 call latency). A file plugin has
/// no registry record; it runs for good, so its state is `active`.
pub(super) async fn list(State(s): State<AdminState>) -> Result<Response, ApiError> {
    let records = Registry::new(s.db.clone()).list().await?;
    Ok(Json(version_rows(records, &s.metrics.plugins())).into_response())
}

/// Joins the registry's records with the versions loaded here, by name and
/// version, into one row each, ordered by name then version.
pub(super) fn version_rows(
    records: Vec<PluginRecord>,
    loaded: &[Arc<dyn PluginReport>],
) -> Vec<Value> {
    let mut rows: Vec<((String, i64, String), Value)> = Vec::new();
    let mut matched = vec![false; loaded.len()];
    for r in records {
        let here = loaded
            .iter()
            .position(|p| p.name() == r.name && p.version() == r.version.to_string());
        let mut row = serde_json::to_value(&r).unwrap_or_else(|_| json!({}));
        row["source"] = json!("registry");
        add_counters(&mut row, here.map(|i| &loaded[i]));
        if let Some(i) = here {
            matched[i] = true;
        }
        rows.push(((r.name.clone(), r.version, String::new()), row));
    }
    for (p, _) in loaded.iter().zip(&matched).filter(|(_, m)| !**m) {
        let mut row = json!({
            "name": p.name(),
            "version": p.version(),
            "world": p.world(),
            "state": "active",
            "shadow": false,
            "source": "file",
        });
        add_counters(&mut row, Some(p));
        rows.push((
            (p.name().to_string(), i64::MAX, p.version().to_string()),
            row,
        ));
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    rows.into_iter().map(|(_, row)| row).collect()
}

/// This process's counters of one version; `loaded: false` and zeros for
/// a version this process has not loaded.
fn add_counters(row: &mut Value, report: Option<&Arc<dyn PluginReport>>) {
    let counters = report.map(|p| p.counters()).unwrap_or_default();
    let errors: BTreeMap<&str, u64> = counters.errors.iter().copied().collect();
    row["loaded"] = json!(report.is_some());
    row["calls"] = json!(counters.calls);
    row["errors"] = json!(errors);
    row["errors_total"] = json!(counters.errors.iter().map(|(_, n)| n).sum::<u64>());
    row["total_time_ms"] = json!(counters.total_time.as_secs_f64() * 1000.0);
    row["p99_ms"] = json!(
        report
            .and_then(|p| p.latency().quantile(0.99))
            .map(|s| s * 1000.0)
    );
    row["memory_high_water_bytes"] = json!(counters.memory_high_water);
}

/// `POST /api/plugins/{name}/activate/{version}`.
pub(super) async fn activate(
    State(s): State<AdminState>,
    Path((name, version)): Path<(String, i64)>,
) -> Result<Response, ApiError> {
    let record = Registry::new(s.db)
        .activate(&name, version, "admin-api")
        .await?;
    Ok(Json(record).into_response())
}

/// `POST /api/plugins/{name}/rollback`.
pub(super) async fn rollback(
    State(s): State<AdminState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let record = Registry::new(s.db).rollback(&name, "admin-api").await?;
    Ok(Json(record).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::metrics::{CALL_BUCKETS, LatencyBuckets as Histogram, PluginCounters};

    #[derive(Debug)]
    struct Report {
        name: &'static str,
        version: &'static str,
        world: &'static str,
        calls: u64,
        latency: Histogram,
    }

    impl PluginReport for Report {
        fn name(&self) -> &str {
            self.name
        }
        fn version(&self) -> &str {
            self.version
        }
        fn world(&self) -> &'static str {
            self.world
        }
        fn counters(&self) -> PluginCounters {
            PluginCounters {
                calls: self.calls,
                errors: vec![("trap", 1), ("timeout", 0)],
                ..PluginCounters::default()
            }
        }
        fn latency(&self) -> &Histogram {
            &self.latency
        }
    }

    fn loaded(
        name: &'static str,
        version: &'static str,
        world: &'static str,
        calls: u64,
    ) -> Arc<dyn PluginReport> {
        let latency = Histogram::with_buckets(&CALL_BUCKETS);
        for _ in 0..calls {
            latency.observe(0.0002);
        }
        Arc::new(Report {
            name,
            version,
            world,
            calls,
            latency,
        })
    }

    fn record(name: &str, version: i64, state: &str, shadow: bool) -> PluginRecord {
        PluginRecord {
            name: name.into(),
            version,
            sha256: String::new(),
            world: "consumer".into(),
            wit_version: "0.1.0".into(),
            size_bytes: 0,
            deployed_by: "test".into(),
            deployed_at: chrono::DateTime::UNIX_EPOCH,
            state: state.into(),
            shadow,
            auto_promote_after: None,
            shadow_stats: Default::default(),
        }
    }

    #[test]
    fn each_version_is_one_row_with_its_state_and_this_process_counters() {
        let rows = version_rows(
            vec![
                record("c", 1, "active", false),
                record("c", 2, "candidate", true),
                record("c", 3, "candidate", false),
            ],
            &[
                loaded("shape", "0.1.0", "transformer", 4),
                loaded("c", "2", "consumer", 7),
                loaded("c", "1", "consumer", 9),
            ],
        );
        let summary: Vec<(String, String, String, bool, u64)> = rows
            .iter()
            .map(|r| {
                (
                    r["name"].as_str().unwrap_or_default().to_string(),
                    r["version"].to_string(),
                    r["state"].as_str().unwrap_or_default().to_string(),
                    r["loaded"].as_bool().unwrap_or_default(),
                    r["calls"].as_u64().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("c".into(), "1".into(), "active".into(), true, 9),
                ("c".into(), "2".into(), "candidate".into(), true, 7),
                ("c".into(), "3".into(), "candidate".into(), false, 0),
                ("shape".into(), "\"0.1.0\"".into(), "active".into(), true, 4),
            ]
        );
        assert_eq!(rows[1]["shadow"], true);
        assert_eq!(rows[3]["source"], "file");
        assert_eq!(rows[3]["world"], "transformer");
        assert_eq!(rows[0]["errors"]["trap"], 1);
        assert_eq!(rows[0]["errors_total"], 1);
        // 200 µs falls in the bucket from 100 to 250 µs.
        let p99 = rows[0]["p99_ms"].as_f64().unwrap_or_default();
        assert!((0.1..=0.25).contains(&p99), "p99 {p99} ms");
        assert_eq!(rows[2]["p99_ms"], serde_json::Value::Null);
    }
}
