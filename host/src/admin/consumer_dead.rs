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
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;

use super::AdminState;
use super::error::internal;
use crate::fault::Faults;
use crate::ops::consumer_dead::{self, ConsumerDeadError, Target};

pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .route("/api/consumers/{name}/dead", get(list))
        .route("/api/consumers/{name}/dead/redrive", post(redrive))
        .route("/api/consumers/{name}/dead/{id}", get(show))
        .route("/api/consumers/{name}/dead/{id}/discard", post(discard))
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

fn refused(e: ConsumerDeadError) -> Response {
    let status = match &e {
        ConsumerDeadError::NotFound { .. } => StatusCode::NOT_FOUND,
        ConsumerDeadError::Parked { .. } | ConsumerDeadError::Resolved { .. } => {
            StatusCode::CONFLICT
        }
        ConsumerDeadError::BadVersion { .. } | ConsumerDeadError::NoReason => {
            StatusCode::BAD_REQUEST
        }
        ConsumerDeadError::Interrupted(_) | ConsumerDeadError::Database(_) => {
            return internal(e);
        }
    };
    error(status, e.to_string())
}

/// The consumer's plugin, or a 404 naming the configured consumers.
fn known(s: &AdminState, name: &str) -> Result<Option<String>, Box<Response>> {
    match s.consumers.get(name) {
        Some(plugin) => Ok(plugin.clone()),
        None => Err(Box::new(error(
            StatusCode::NOT_FOUND,
            format!(
                "no consumer named `{name}` in this process's config (consumers: {})",
                s.consumers.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
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
) -> Response {
    if let Err(r) = known(&s, &name) {
        return *r;
    }
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    match consumer_dead::list(&s.db, &name, q.key.as_deref(), limit).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => internal(e),
    }
}

async fn show(State(s): State<AdminState>, Path((name, id)): Path<(String, i64)>) -> Response {
    if let Err(r) = known(&s, &name) {
        return *r;
    }
    match consumer_dead::show(&s.db, &name, id).await {
        Ok(row) => Json(row).into_response(),
        Err(e) => refused(e),
    }
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
) -> Response {
    let plugin = match known(&s, &name) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let say = "send one of {\"id\": N}, {\"key\": \"K\"} or {\"all\": true}, optionally with \"with\": \"NAME@VERSION\"";
    let Some(Json(body)) = body else {
        return error(StatusCode::BAD_REQUEST, say.into());
    };
    let target = match (body.id, body.key, body.all) {
        (Some(id), None, false) => Target::Id(id),
        (None, Some(k), false) => Target::Key(k),
        (None, None, true) => Target::All,
        _ => return error(StatusCode::BAD_REQUEST, say.into()),
    };
    if let Some(with) = &body.with
        && let Err(e) = consumer_dead::check_with(&s.db, plugin.as_deref(), with).await
    {
        return refused(e);
    }
    match consumer_dead::redrive(&s.db, &name, &target, body.with.as_deref(), &Faults::none()).await
    {
        Ok(n) => Json(json!({ "redriven": n })).into_response(),
        Err(e) => refused(e),
    }
}

#[derive(Debug, Deserialize)]
struct DiscardBody {
    reason: String,
}

async fn discard(
    State(s): State<AdminState>,
    Path((name, id)): Path<(String, i64)>,
    body: Option<Json<DiscardBody>>,
) -> Response {
    if let Err(r) = known(&s, &name) {
        return *r;
    }
    let Some(Json(body)) = body else {
        return error(
            StatusCode::BAD_REQUEST,
            "send a JSON body {\"reason\": \"...\"}".into(),
        );
    };
    match consumer_dead::discard(&s.db, &name, id, &body.reason, chrono::Utc::now()).await {
        Ok(d) => Json(json!({ "discarded": d.id, "released": d.released })).into_response(),
        Err(e) => refused(e),
    }
}
