//! The admin API's consumer dead letters: the same operations as
//! `outboxd dead … --consumer NAME` (`ops/consumer_dead.rs`), behind the
//! admin token.
//!
//! - `GET  /api/consumers/{name}/dead?key=K&limit=N`
//! - `GET  /api/consumers/{name}/dead/{id}`
//! - `POST /api/consumers/{name}/dead/redrive` with `{"id": N}`,
//!   `{"key": "K"}` or `{"all": true}`, and optionally `"with": "NAME@VERSION"`
//! - `POST /api/consumers/{name}/dead/{id}/discard` with `{"reason": "…"}`

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;

use super::AdminState;
use super::error::ApiError;
use crate::fault::Faults;
use crate::ops::consumer_dead::{self, Target};

pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .route("/api/consumers/{name}/dead", get(list))
        .route("/api/consumers/{name}/dead/redrive", post(redrive))
        .route("/api/consumers/{name}/dead/{id}", get(show))
        .route("/api/consumers/{name}/dead/{id}/discard", post(discard))
}

/// The consumer's plugin, or a 404 naming the configured consumers.
fn known(s: &AdminState, name: &str) -> Result<Option<String>, ApiError> {
    match s.consumers.get(name) {
        Some(plugin) => Ok(plugin.clone()),
        None => Err(ApiError::not_found(format!(
            "no consumer named `{name}` in this process's config (consumers: {})",
            s.consumers.keys().cloned().collect::<Vec<_>>().join(", ")
        ))),
    }
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    key: Option<String>,
    limit: Option<i64>,
}

async fn list(
    State(s): State<AdminState>,
    Path(name): Path<String>,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    known(&s, &name)?;
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let rows = consumer_dead::list(&s.db, &name, q.key.as_deref(), limit)
        .await
        .map_err(ApiError::internal)?;
    Ok(Json(rows).into_response())
}

async fn show(
    State(s): State<AdminState>,
    Path((name, id)): Path<(String, i64)>,
) -> Result<Response, ApiError> {
    known(&s, &name)?;
    Ok(Json(consumer_dead::show(&s.db, &name, id).await?).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RedriveBody {
    id: Option<i64>,
    key: Option<String>,
    #[serde(default)]
    all: bool,
    with: Option<String>,
}

async fn redrive(
    State(s): State<AdminState>,
    Path(name): Path<String>,
    body: Option<Json<RedriveBody>>,
) -> Result<Response, ApiError> {
    let plugin = known(&s, &name)?;
    let say = "send one of {\"id\": N}, {\"key\": \"K\"} or {\"all\": true}, optionally with \"with\": \"NAME@VERSION\"";
    let Some(Json(body)) = body else {
        return Err(ApiError::bad_request(say));
    };
    let target = match (body.id, body.key, body.all) {
        (Some(id), None, false) => Target::Id(id),
        (None, Some(k), false) => Target::Key(k),
        (None, None, true) => Target::All,
        _ => return Err(ApiError::bad_request(say)),
    };
    if let Some(with) = &body.with {
        consumer_dead::check_with(&s.db, plugin.as_deref(), with).await?;
    }
    let n = consumer_dead::redrive(&s.db, &name, &target, body.with.as_deref(), &Faults::none())
        .await?;
    Ok(Json(json!({ "redriven": n })).into_response())
}

#[derive(Debug, Deserialize)]
struct DiscardBody {
    reason: String,
}

async fn discard(
    State(s): State<AdminState>,
    Path((name, id)): Path<(String, i64)>,
    body: Option<Json<DiscardBody>>,
) -> Result<Response, ApiError> {
    known(&s, &name)?;
    let Some(Json(body)) = body else {
        return Err(ApiError::bad_request(
            "send a JSON body {\"reason\": \"...\"}",
        ));
    };
    let d = consumer_dead::discard(&s.db, &name, id, &body.reason, chrono::Utc::now()).await?;
    Ok(Json(json!({ "discarded": d.id, "released": d.released })).into_response())
}
