//! The admin API's routes: the probes and `/metrics` (from `probes.rs`),
//! stats, history, dead letters, plugins, consumers, and the dashboard page.

use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router, middleware};
use serde::Deserialize;
use serde_json::json;

use super::AdminState;
use super::auth::{require_scrape_token, require_token};
use super::error::ApiError;
use crate::ops::dead::{self, DeadFilter};
use crate::ops::fix_forward;
use crate::store::{AnyStore, Db, OutboxStore};

const DASHBOARD: &str = include_str!("dashboard.html");

pub fn router(state: AdminState) -> Router {
    let protected = Router::new()
        .route("/api/stats", get(stats))
        .route("/api/history", get(history))
        .route("/api/dead", get(list_dead))
        .route("/api/dead/redrive", post(redrive_filter))
        .route("/api/dead/{seq}", get(show_dead))
        .route("/api/dead/{seq}/redrive", post(redrive_one))
        .route("/api/dead/{seq}/discard", post(discard_one))
        .route("/api/plugins", get(super::plugins::list))
        .route("/api/plugins/loaded", get(loaded_plugins))
        .route(
            "/api/plugins/{name}/activate/{version}",
            post(super::plugins::activate),
        )
        .route(
            "/api/plugins/{name}/rollback",
            post(super::plugins::rollback),
        )
        .merge(super::consumer_dead::routes())
        .merge(super::consumers::routes())
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    let scrape = Router::new()
        .route("/metrics", get(super::probes::metrics))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_scrape_token,
        ));
    super::probes::probe_routes()
        .route("/", get(|| async { Html(DASHBOARD) }))
        .merge(scrape)
        .merge(protected)
        .with_state(state)
}

fn store(db: &Db) -> AnyStore {
    AnyStore::new(db, Duration::from_secs(30))
}

/// The outbox's figures and `readiness` (each check, and why it failed);
/// when the database does not answer, the error and `readiness`.
async fn stats(State(s): State<AdminState>) -> Response {
    let store = store(&s.db);
    let (stats, readiness) = tokio::join!(store.stats(chrono::Utc::now()), s.probes.readiness());
    let stats = stats.map_err(|e| e.to_string()).and_then(|st| {
        serde_json::to_value(st).map_err(|e| format!("cannot write the stats as JSON: {e}"))
    });
    match stats {
        Ok(mut body) => {
            if let Some(fields) = body.as_object_mut() {
                fields.insert("readiness".into(), json!(readiness));
                // Whether each of outboxd's database connections is
                // encrypted (store/backend/pg_tls.rs); Postgres only.
                match crate::store::backend::pg_tls::connections(&s.db).await {
                    Ok(Some(c)) => {
                        fields.insert("connections".into(), json!(c));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        fields.insert("connections".into(), json!({ "error": e.to_string() }));
                    }
                }
            }
            Json(body).into_response()
        }
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({ "error": e, "readiness": readiness })),
        )
            .into_response(),
    }
}

async fn history(State(s): State<AdminState>) -> Response {
    Json(s.history.snapshot()).into_response()
}

#[derive(Debug, Deserialize)]
struct DeadQuery {
    #[serde(rename = "type")]
    event_type: Option<String>,
    aggregate: Option<String>,
    limit: Option<i64>,
    all: Option<bool>,
}

impl DeadQuery {
    fn filter(&self) -> DeadFilter {
        DeadFilter {
            seq: None,
            event_type: self.event_type.clone(),
            aggregate_id: self.aggregate.clone(),
        }
    }
}

async fn list_dead(
    State(s): State<AdminState>,
    Query(q): Query<DeadQuery>,
) -> Result<Response, ApiError> {
    let rows = dead::list(&s.db, &q.filter(), q.limit.unwrap_or(100).clamp(1, 1000))
        .await
        .map_err(ApiError::internal)?;
    Ok(Json(rows).into_response())
}

fn not_dead(seq: i64) -> ApiError {
    ApiError::not_found(format!("outbox row {seq} is not a dead event"))
}

async fn show_dead(
    State(s): State<AdminState>,
    Path(seq): Path<i64>,
) -> Result<Response, ApiError> {
    match dead::get(&s.db, seq).await.map_err(ApiError::internal)? {
        Some(e) => Ok(Json(e).into_response()),
        None => Err(not_dead(seq)),
    }
}

/// The optional body of a redrive: `{"with": "NAME@VERSION"}` runs the
/// events through that registry version (fix-forward).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RedriveBody {
    with: Option<String>,
}

/// Redrives `filter`'s dead events, through `body.with` when given.
async fn redrive(
    s: &AdminState,
    filter: &DeadFilter,
    body: Option<Json<RedriveBody>>,
) -> Result<u64, ApiError> {
    let with = body.and_then(|Json(b)| b.with);
    let now = chrono::Utc::now();
    let Some(label) = with else {
        return dead::redrive(&s.db, filter, now)
            .await
            .map_err(ApiError::internal);
    };
    let pipeline = fix_forward::Pipeline {
        routes: &s.routes,
        plugins: &s.plugins,
    };
    Ok(fix_forward::redrive_with(&s.db, pipeline, filter, &label, now).await?)
}

async fn redrive_one(
    State(s): State<AdminState>,
    Path(seq): Path<i64>,
    body: Option<Json<RedriveBody>>,
) -> Result<Response, ApiError> {
    let filter = DeadFilter {
        seq: Some(seq),
        ..DeadFilter::default()
    };
    match redrive(&s, &filter, body).await? {
        0 => Err(not_dead(seq)),
        n => Ok(Json(json!({ "redriven": n })).into_response()),
    }
}

async fn redrive_filter(
    State(s): State<AdminState>,
    Query(q): Query<DeadQuery>,
    body: Option<Json<RedriveBody>>,
) -> Result<Response, ApiError> {
    if q.event_type.is_none() && q.aggregate.is_none() && q.all != Some(true) {
        return Err(ApiError::bad_request(
            "say which dead events to redrive: ?type=T, ?aggregate=A, or ?all=true",
        ));
    }
    let n = redrive(&s, &q.filter(), body).await?;
    Ok(Json(json!({ "redriven": n })).into_response())
}

#[derive(Debug, Deserialize)]
struct DiscardBody {
    reason: String,
}

async fn discard_one(
    State(s): State<AdminState>,
    Path(seq): Path<i64>,
    body: Option<Json<DiscardBody>>,
) -> Result<Response, ApiError> {
    let Some(Json(body)) = body else {
        return Err(ApiError::bad_request(
            "send a JSON body {\"reason\": \"...\"}",
        ));
    };
    dead::discard(&s.db, seq, &body.reason, chrono::Utc::now()).await?;
    Ok(Json(json!({ "discarded": seq })).into_response())
}

/// The plugin versions this process has loaded (either world, from files
/// or the registry), with their counters.
async fn loaded_plugins(State(s): State<AdminState>) -> Response {
    let list: Vec<serde_json::Value> = s
        .metrics
        .plugins()
        .iter()
        .map(|p| {
            let m = p.counters();
            json!({
                "name": p.name(),
                "version": p.version(),
                "world": p.world(),
                "state": "loaded",
                "calls": m.calls,
                "errors": m.errors.iter().map(|(k, n)| (k.to_string(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
                "total_time_ms": m.total_time.as_secs_f64() * 1000.0,
                "memory_high_water_bytes": m.memory_high_water,
            })
        })
        .collect();
    Json(list).into_response()
}
