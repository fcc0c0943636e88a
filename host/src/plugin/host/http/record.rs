//! What the host records of every request a plugin made (live or stub,
//! refused included): what `outboxd plugin test` prints, and what the
//! audit's outcome rows are written from.

use std::time::Duration;

use serde::Serialize;

/// One request a plugin made during one `handle` call, as sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HttpRecord {
    /// The audit row's id (`outbound_calls.id`), when the intent was written.
    pub audit_id: Option<String>,
    pub method: String,
    /// The URL as the plugin asked for it.
    pub url: String,
    /// The headers as sent, the host's idempotency header included.
    pub headers: Vec<(String, String)>,
    /// The request body (at most `max_request_bytes`).
    pub body: Vec<u8>,
    /// The answer's status; `None` when there was none.
    pub status: Option<u16>,
    pub response_headers: Vec<(String, String)>,
    /// The response body (at most `max_response_bytes`).
    pub response_body: Vec<u8>,
    /// From the plugin's `handle` to the last byte (or the failure).
    #[serde(serialize_with = "millis")]
    pub duration: Duration,
    /// Why the request failed or was refused.
    pub error: Option<String>,
    /// Refused by the host before any connection (allow-list, address, cap).
    pub refused: bool,
    /// Answered by a stub, not the network.
    pub stubbed: bool,
}

impl HttpRecord {
    pub(crate) fn new(method: &str, url: &str) -> Self {
        Self {
            audit_id: None,
            method: method.to_string(),
            url: url.to_string(),
            headers: Vec::new(),
            body: Vec::new(),
            status: None,
            response_headers: Vec::new(),
            response_body: Vec::new(),
            duration: Duration::ZERO,
            error: None,
            refused: false,
            stubbed: false,
        }
    }

    /// The metrics' outcome label: `2xx`..`5xx`, `error` or `refused`.
    pub fn outcome(&self) -> &'static str {
        if self.refused {
            return "refused";
        }
        match self.status {
            Some(200..=299) => "2xx",
            Some(300..=399) => "3xx",
            Some(400..=499) => "4xx",
            Some(500..=599) => "5xx",
            Some(_) => "1xx",
            None => "error",
        }
    }
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}
