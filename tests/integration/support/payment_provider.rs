//! A test payment provider on loopback, in the test process (not mocked
//! inside the host): `POST /charges` with `{"order_id", "amount_cents"}`
//! charges and answers `201 {"charge_id", "order_id", "amount_cents"}`.
//!
//! - [`Mode::Dedupe`] keeps its first answer per `Idempotency-Key` and
//!   replays it without charging again (the request is recorded as
//!   `replayed`), as Stripe does; a request without the key is refused with 400, and the
//!   same key with another body with 422.
//! - [`Mode::IgnoreKey`] charges every request: the control that shows
//!   the double charge an idempotency key prevents.
//!
//! It records every request (with its `Idempotency-Key`) and every charge,
//! so a test counts charges per order and per key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Dedupe,
    IgnoreKey,
}

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Seen {
    pub idempotency_key: Option<String>,
    pub order_id: Option<String>,
    pub status: u16,
    pub replayed: bool,
}

/// One charge the provider made.
#[derive(Debug, Clone)]
pub struct Charge {
    pub charge_id: String,
    pub order_id: String,
    pub amount_cents: i64,
    pub idempotency_key: Option<String>,
}

#[derive(Default)]
struct State {
    requests: Vec<Seen>,
    charges: Vec<Charge>,
    /// Dedupe mode: key → (request body, status, answer).
    answers: HashMap<String, (Value, u16, Value)>,
}

pub struct Provider {
    /// `http://127.0.0.1:PORT`, for the plugin's `provider_url` and the
    /// `allowed_outbound_hosts` entry.
    pub url: String,
    state: Arc<Mutex<State>>,
}

impl Provider {
    /// Starts a provider on a free loopback port; it lives as long as the
    /// test's runtime.
    pub async fn start(mode: Mode) -> Provider {
        let state: Arc<Mutex<State>> = Arc::default();
        let shared = state.clone();
        let app = axum::Router::new().route(
            "/charges",
            axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let state = shared.clone();
                async move {
                    let (status, answer) = charge(&state, mode, &headers, &body);
                    (status, axum::Json(answer))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the payment provider");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Provider { url, state }
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.state.lock().expect("provider").requests.clone()
    }

    pub fn charges(&self) -> Vec<Charge> {
        self.state.lock().expect("provider").charges.clone()
    }

    pub fn charges_for_order(&self, order_id: &str) -> usize {
        self.charges()
            .iter()
            .filter(|c| c.order_id == order_id)
            .count()
    }

    pub fn charges_for_key(&self, key: &str) -> usize {
        let charges = self.charges();
        charges
            .iter()
            .filter(|c| c.idempotency_key.as_deref() == Some(key))
            .count()
    }
}

fn charge(
    state: &Mutex<State>,
    mode: Mode,
    headers: &HeaderMap,
    body: &[u8],
) -> (StatusCode, Value) {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let order_id = request["order_id"].as_str().map(str::to_string);
    let mut state = state.lock().expect("provider");
    let mut seen = Seen {
        idempotency_key: key.clone(),
        order_id: order_id.clone(),
        status: 0,
        replayed: false,
    };
    let (status, answer) = match (mode, &key, order_id, request["amount_cents"].as_i64()) {
        (Mode::Dedupe, None, _, _) => (400, json!({"error": "Idempotency-Key is required"})),
        (Mode::Dedupe, Some(k), _, _) if state.answers.contains_key(k) => {
            let (first, status, answer) = state.answers[k].clone();
            seen.replayed = true;
            if first == request {
                (status, answer)
            } else {
                (
                    422,
                    json!({"error": "Idempotency-Key reused with another request"}),
                )
            }
        }
        (_, _, Some(order_id), Some(amount_cents)) if amount_cents > 0 => {
            let charge_id = format!("ch_{}", uuid::Uuid::new_v4().simple());
            state.charges.push(Charge {
                charge_id: charge_id.clone(),
                order_id: order_id.clone(),
                amount_cents,
                idempotency_key: key.clone(),
            });
            let answer =
                json!({"charge_id": charge_id, "order_id": order_id, "amount_cents": amount_cents});
            if let (Mode::Dedupe, Some(k)) = (mode, &key) {
                state
                    .answers
                    .insert(k.clone(), (request.clone(), 201, answer.clone()));
            }
            (201, answer)
        }
        _ => (
            400,
            json!({"error": "expected {\"order_id\": string, \"amount_cents\": positive integer}"}),
        ),
    };
    seen.status = status;
    state.requests.push(seen);
    (StatusCode::from_u16(status).expect("a status"), answer)
}
