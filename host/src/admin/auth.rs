//! Bearer-token checks, in constant time so a token cannot be guessed byte
//! by byte from response timings. The admin token reaches every route; the
//! read-only metrics token reaches `/metrics` only.

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AdminState;

/// Which configured token a request presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bearer {
    Admin,
    Metrics,
    Neither,
}

fn bearer(state: &AdminState, req: &Request) -> Bearer {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
        .as_bytes();
    if presented.is_empty() {
        return Bearer::Neither;
    }
    // Both comparisons run whichever matches, so the time taken does not
    // tell which token was close.
    let admin = constant_time_eq(presented, state.token.as_bytes());
    let metrics = state
        .metrics_token
        .as_ref()
        .is_some_and(|t| constant_time_eq(presented, t.as_bytes()));
    match (admin, metrics) {
        (true, _) => Bearer::Admin,
        (false, true) => Bearer::Metrics,
        (false, false) => Bearer::Neither,
    }
}

fn unauthorized(which: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        format!("missing or wrong bearer token; send Authorization: Bearer <{which}>\n"),
    )
        .into_response()
}

/// The `/api` routes: the admin token only.
pub async fn require_token(State(state): State<AdminState>, req: Request, next: Next) -> Response {
    match bearer(&state, &req) {
        Bearer::Admin => next.run(req).await,
        Bearer::Metrics => (
            StatusCode::FORBIDDEN,
            "admin.metrics_token reaches /metrics only; send Authorization: Bearer <admin.token>\n",
        )
            .into_response(),
        Bearer::Neither => unauthorized("admin.token"),
    }
}

/// `/metrics`: the admin token or the metrics token.
pub async fn require_scrape_token(
    State(state): State<AdminState>,
    req: Request,
    next: Next,
) -> Response {
    match bearer(&state, &req) {
        Bearer::Admin | Bearer::Metrics => next.run(req).await,
        Bearer::Neither => unauthorized("admin.metrics_token or admin.token"),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
