//! What a failed admin request answers: a status and a JSON body naming
//! the error, shared by every handler.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A 500 whose body is `{"error": "..."}`: the server could not do what
/// was asked (the database failed, a plugin could not load).
pub(super) fn internal(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(json!({ "error": e.to_string() })),
    )
        .into_response()
}
