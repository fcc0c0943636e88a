//! What a failed admin request answers: a status and a JSON body
//! `{"error": "..."}` naming what went wrong and the fix. Every handler
//! returns `Result<_, ApiError>`; each error type of the operations below
//! says which status its variants are, once, here.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::ops::consumer_dead::ConsumerDeadError;
use crate::ops::dead::DiscardError;
use crate::ops::fix_forward::FixForwardError;
use crate::plugin::RegistryError;

/// A refused or failed admin request.
#[derive(Debug)]
pub(super) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    /// 400: the request itself is wrong; `message` says what to send.
    pub(super) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404: what the request names does not exist.
    pub(super) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// 500: the server could not do what was asked (the database failed,
    /// a plugin could not load).
    pub(super) fn internal(e: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
    }

    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.message }))).into_response()
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        Self::internal(e)
    }
}

impl From<ConsumerDeadError> for ApiError {
    fn from(e: ConsumerDeadError) -> Self {
        let status = match &e {
            ConsumerDeadError::NotFound { .. } => StatusCode::NOT_FOUND,
            ConsumerDeadError::Parked { .. } | ConsumerDeadError::Resolved { .. } => {
                StatusCode::CONFLICT
            }
            ConsumerDeadError::BadVersion { .. } | ConsumerDeadError::NoReason => {
                StatusCode::BAD_REQUEST
            }
            ConsumerDeadError::Interrupted(_) | ConsumerDeadError::Database(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        Self::new(status, e.to_string())
    }
}

impl From<DiscardError> for ApiError {
    fn from(e: DiscardError) -> Self {
        let status = match &e {
            DiscardError::NoReason => StatusCode::BAD_REQUEST,
            DiscardError::NotDead(_) => StatusCode::NOT_FOUND,
            DiscardError::Database(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, e.to_string())
    }
}

impl From<FixForwardError> for ApiError {
    fn from(e: FixForwardError) -> Self {
        let status = match &e {
            FixForwardError::Database(_)
            | FixForwardError::Registry(_)
            | FixForwardError::Plugin(_) => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        };
        Self::new(status, e.to_string())
    }
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        let status = match &e {
            RegistryError::NoSuchVersion { .. } => StatusCode::NOT_FOUND,
            RegistryError::Conflict { .. } => StatusCode::CONFLICT,
            RegistryError::Refused { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            RegistryError::Database(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body(e: ApiError) -> (StatusCode, serde_json::Value) {
        let r = e.into_response();
        let status = r.status();
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 16)
            .await
            .expect("a body");
        (status, serde_json::from_slice(&bytes).expect("JSON"))
    }

    #[tokio::test]
    async fn each_refusal_keeps_its_status_and_names_the_fix() {
        let (status, json) = body(
            ConsumerDeadError::NotFound {
                consumer: "billing".into(),
                id: 7,
            }
            .into(),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(
            json["error"]
                .as_str()
                .expect("a string")
                .contains("outboxd dead list --consumer billing"),
            "{json}"
        );
        let (status, _) = body(DiscardError::NoReason.into()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, _) = body(
            RegistryError::Conflict {
                name: "p".into(),
                reason: "x".into(),
            }
            .into(),
        )
        .await;
        assert_eq!(status, StatusCode::CONFLICT);
        let (status, json) = body(ApiError::internal("database is down")).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(json, serde_json::json!({ "error": "database is down" }));
    }
}
