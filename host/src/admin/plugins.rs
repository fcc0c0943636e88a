//! The plugin registry over HTTP: list, activate, roll back. The same
//! operations as `outboxd plugin list|activate|rollback`, behind the token.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AdminState;
use crate::plugin::{Registry, RegistryError};

fn answer<T: serde::Serialize>(result: Result<T, RegistryError>) -> Response {
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => {
            let status = match &e {
                RegistryError::NoSuchVersion { .. } => StatusCode::NOT_FOUND,
                RegistryError::Conflict { .. } => StatusCode::CONFLICT,
                RegistryError::Refused { .. } => StatusCode::UNPROCESSABLE_ENTITY,
                RegistryError::Database(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (status, Json(json!({ "error": e.to_string() }))).into_response()
        }
    }
}

/// `GET /api/plugins`: every version, its state and shadow counters.
pub async fn list(State(s): State<AdminState>) -> Response {
    answer(Registry::new(s.db).list().await)
}

/// `POST /api/plugins/{name}/activate/{version}`.
pub async fn activate(
    State(s): State<AdminState>,
    Path((name, version)): Path<(String, i64)>,
) -> Response {
    answer(
        Registry::new(s.db)
            .activate(&name, version, "admin-api")
            .await,
    )
}

/// `POST /api/plugins/{name}/rollback`.
pub async fn rollback(State(s): State<AdminState>, Path(name): Path<String>) -> Response {
    answer(Registry::new(s.db).rollback(&name, "admin-api").await)
}
