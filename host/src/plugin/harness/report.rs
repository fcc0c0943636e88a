//! The report of one `outboxd plugin test` run, for either world: what
//! `--json` prints and `--expect` compares. Values the harness made up
//! (a message id, an event's id and time, the ids the outbox gave emitted
//! events) are listed under `generated` by the placeholder that
//! [`super::expect::normalize`] puts in their place.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::plugin::error::{ErrorKind, PluginError};
use crate::plugin::host::http::HttpRecord;
use crate::plugin::host::transaction::{EmittedEvent, PluginStatement};

/// How the call ended, as the daemon would act on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    /// `ok`, `filtered` (a transformer returned nothing), `duplicate` (the
    /// inbox had the message), `retryable`, `permanent`, `trap`,
    /// `timeout`, `transaction` (a refused statement, a budget, a database
    /// error), `out_of_memory`, …
    pub result: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// What the daemon does next: `commit`, `publish`, `drop`, `retry`
    /// (rolled back, tried again later) or `dead-letter`.
    pub then: &'static str,
}

impl Outcome {
    pub fn ok(then: &'static str) -> Self {
        Self {
            result: "ok".into(),
            message: None,
            then,
        }
    }

    pub fn failed(e: &PluginError) -> Self {
        let result = match e.kind() {
            ErrorKind::GuestRetryable => "retryable",
            ErrorKind::GuestPermanent => "permanent",
            other => other.name(),
        };
        Self {
            result: result.into(),
            message: Some(e.to_string()),
            then: if e.is_permanent() {
                "dead-letter"
            } else {
                "retry"
            },
        }
    }

    pub fn is_ok(&self) -> bool {
        matches!(self.result.as_str(), "ok" | "filtered" | "duplicate")
    }
}

/// The sample message as the plugin received it.
#[derive(Debug, Clone, Serialize)]
pub struct MessageShown {
    pub id: String,
    pub topic: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub headers: BTreeMap<String, String>,
    pub attempt: u32,
}

/// A consumer run: every statement, the events it emitted, the HTTP
/// requests it made, and the outcome.
#[derive(Debug, Clone, Serialize)]
pub struct ConsumerReport {
    pub world: &'static str,
    pub message: MessageShown,
    pub statements: Vec<PluginStatement>,
    pub events: Vec<EmittedEvent>,
    pub http: Vec<HttpShown>,
    pub outcome: Outcome,
    pub duration_ms: u64,
    pub generated: BTreeMap<String, String>,
}

/// One HTTP request a consumer made, and its answer.
#[derive(Debug, Clone, Serialize)]
pub struct HttpShown {
    pub method: String,
    pub url: String,
    /// As sent, the host's idempotency header included.
    pub headers: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<serde_json::Value>,
    /// `2xx`…`5xx`, `error` or `refused`.
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The answer's headers, but `date`, which differs on every run.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub response_headers: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_body: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Answered by `--http-stub`, not the network.
    pub stubbed: bool,
    /// The `outbound_calls` row of a live request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit_id: Option<String>,
    pub duration_ms: u64,
}

impl From<&HttpRecord> for HttpShown {
    fn from(r: &HttpRecord) -> Self {
        let body = |b: &[u8]| (!b.is_empty()).then(|| payload_json(b));
        Self {
            method: r.method.clone(),
            url: r.url.clone(),
            headers: r.headers.iter().cloned().collect(),
            body: body(&r.body),
            outcome: r.outcome(),
            status: r.status,
            response_headers: r
                .response_headers
                .iter()
                .filter(|(k, _)| !k.eq_ignore_ascii_case("date"))
                .cloned()
                .collect(),
            response_body: body(&r.response_body),
            error: r.error.clone(),
            stubbed: r.stubbed,
            audit_id: r.audit_id.clone(),
            duration_ms: r.duration.as_millis() as u64,
        }
    }
}

/// A transformer's output message.
#[derive(Debug, Clone, Serialize)]
pub struct MessageOut {
    /// `None`: the route's topic.
    pub topic: Option<String>,
    pub key: String,
    pub headers: BTreeMap<String, String>,
    /// JSON when the payload parses, else the text.
    pub payload: serde_json::Value,
}

/// A transformer run: its output messages and the outcome.
#[derive(Debug, Clone, Serialize)]
pub struct TransformerReport {
    pub world: &'static str,
    pub messages: Vec<MessageOut>,
    pub outcome: Outcome,
    pub duration_ms: u64,
    pub generated: BTreeMap<String, String>,
}

/// Bytes as a report shows a payload: JSON when they parse, else text.
pub fn payload_json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| String::from_utf8_lossy(bytes).into_owned().into())
}
