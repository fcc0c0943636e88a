//! A webhook receiver on 127.0.0.1 for the webhook tests: verifies each
//! request's signature with the Standard Webhooks algorithm written out
//! here (not outboxd's signer), applies each `webhook-id` once, records
//! every request, and can be told to answer slowly, with a scripted status
//! (429 or 503 with `Retry-After`, 410, a redirect, a 4xx with a body), or
//! to let a request hang.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The secret of the tests' webhook routes (the specification's example).
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One scripted answer, used once, in order; then `200`.
#[derive(Debug, Clone)]
pub enum Answer {
    Status(u16),
    /// A status with `Retry-After: SECONDS`.
    RetryAfter(u16, u64),
    /// A status with a body.
    Body(u16, String),
    /// `302` to this location.
    Redirect(String),
}

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Got {
    pub id: String,
    pub verified: bool,
    pub at: Instant,
}

#[derive(Default)]
struct Inner {
    script: VecDeque<Answer>,
    max_delay_ms: u64,
    got: Vec<Got>,
    /// Ids whose effect was applied, in the order applied.
    applied: Vec<(Option<String>, serde_json::Value)>,
    seen: HashSet<String>,
    /// Requests in flight per payload key, and the most seen at once.
    in_flight: HashMap<String, usize>,
    max_in_flight: usize,
}

#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
}

impl Receiver {
    pub async fn start() -> Self {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = axum::Router::new()
            .fallback(receive)
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the webhook receiver");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, inner }
    }

    /// The same receiver over TLS with `acceptor`'s certificate.
    pub async fn start_tls(acceptor: tokio_rustls::TlsAcceptor) -> Self {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = axum::Router::new()
            .fallback(receive)
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the webhook receiver");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let service = hyper_util::service::TowerToHyperService::new(app.clone());
                tokio::spawn(async move {
                    // A refused handshake (the client's verification) ends here.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self { addr, inner }
    }

    /// `http://127.0.0.1:PORT/hooks`.
    pub fn url(&self) -> String {
        format!("http://{}/hooks", self.addr)
    }

    pub fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        self.lock().script.extend(answers);
    }

    /// Each request waits a random 0..=`ms` before it is answered.
    pub fn delay_up_to(&self, ms: u64) {
        self.lock().max_delay_ms = ms;
    }

    pub fn got(&self) -> Vec<Got> {
        self.lock().got.clone()
    }

    /// The effects applied once each (first delivery of an id), in order:
    /// (payload key, payload).
    pub fn applied(&self) -> Vec<(Option<String>, serde_json::Value)> {
        self.lock().applied.clone()
    }

    /// The most requests of one key that were in flight at once.
    pub fn max_in_flight_per_key(&self) -> usize {
        self.lock().max_in_flight
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The specification's check: `v1,` + base64 HMAC-SHA256 of
/// `id.timestamp.body` under the decoded secret, any of the listed
/// signatures, and a timestamp within five minutes.
pub fn verify(secret: &str, headers: &HeaderMap, body: &[u8]) -> bool {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(id), Some(ts), Some(sigs)) = (
        text("webhook-id"),
        text("webhook-timestamp"),
        text("webhook-signature"),
    ) else {
        return false;
    };
    let Ok(ts_n) = ts.parse::<i64>() else {
        return false;
    };
    if (chrono::Utc::now().timestamp() - ts_n).abs() > 300 {
        return false;
    }
    let key = STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .expect("the test secret is base64");
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key).expect("key");
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(body);
    let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    sigs.split(' ').any(|s| s == expected)
}

async fn receive(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let verified = verify(SECRET, &headers, &body);
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let payload: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let key = payload
        .get("key")
        .and_then(|k| k.as_str())
        .map(str::to_string);
    let (delay, answer) = {
        let mut s = inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = &key {
            let n = s.in_flight.entry(k.clone()).or_default();
            *n += 1;
            let n = *n;
            s.max_in_flight = s.max_in_flight.max(n);
        }
        let delay = if s.max_delay_ms > 0 {
            fastrand::u64(0..=s.max_delay_ms)
        } else {
            0
        };
        (delay, s.script.pop_front())
    };
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let response = match &answer {
        None => StatusCode::NO_CONTENT.into_response(),
        Some(Answer::Status(code)) => status(*code).into_response(),
        Some(Answer::RetryAfter(code, secs)) => {
            (status(*code), [("retry-after", secs.to_string())]).into_response()
        }
        Some(Answer::Body(code, text)) => (status(*code), text.clone()).into_response(),
        Some(Answer::Redirect(to)) => {
            (StatusCode::FOUND, [("location", to.clone())]).into_response()
        }
    };
    let code = response.status().as_u16();
    let mut s = inner.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(k) = &key
        && let Some(n) = s.in_flight.get_mut(k)
    {
        *n -= 1;
    }
    if verified && (200..300).contains(&code) && s.seen.insert(id.clone()) {
        s.applied.push((key.clone(), payload));
    }
    s.got.push(Got {
        id,
        verified,
        at: Instant::now(),
    });
    response
}

fn status(code: u16) -> StatusCode {
    StatusCode::from_u16(code).expect("a status code")
}
