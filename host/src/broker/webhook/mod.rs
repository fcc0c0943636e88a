//! Webhook routes: each message is an HTTP POST to the route's URL,
//! signed by the Standard Webhooks scheme ([`sign`]). A 2xx acknowledges
//! it; 408, 429 and 5xx are retried with the route's backoff (no sooner
//! than a `Retry-After`); a redirect or any other 4xx is permanent (the
//! event goes dead with the status and the start of the body); 410 Gone
//! pauses the route until `outboxd route resume NAME`, its events waiting
//! without counting attempts.
//!
//! [`Sinks`] is the relay's publisher: a message whose destination is a
//! webhook route's name goes to that route's [`WebhookSender`], any other
//! to the broker. A sender keeps at most one request in flight per key,
//! in the order the relay hands them over (the claim already gives one
//! event per aggregate per batch; a transformer's outputs of one event
//! queue behind each other). Requests go out through the same client as
//! consumer plugins' HTTP: the host resolves the name, refuses a private
//! or loopback address unless the URL names it literally, connects to the
//! checked address, follows no redirect, and reads at most
//! `max_response_bytes` within `timeout`.

pub mod metrics;
pub mod sign;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::Full;
use outboxd_core::config::webhook::WebhookSink;
use outboxd_core::config::{HttpLimits, OutboundHost};
use outboxd_core::route::Route;

use self::metrics::WebhookMetrics;
use self::sign::SigningKeys;
use super::{PublishError, Publisher};
use crate::message::OutgoingMessage;
use crate::plugin::host::http::OutboundPolicy;
use crate::plugin::host::http::transport::{SendError, resolve, send_live};
use crate::store::Db;
use crate::store::outbox::route_pauses;

/// The longest `Retry-After` honoured; a longer one is cut to this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// How much of an error response's body a dead event keeps.
const BODY_EXCERPT: usize = 200;

/// How often a paused route's sender looks whether it was resumed.
const PAUSE_RECHECK: Duration = Duration::from_secs(1);

/// Why a webhook route cannot start; each names the key and the fix.
#[derive(Debug, thiserror::Error)]
pub enum WebhookSetupError {
    #[error("{key}: {message}")]
    Config { key: String, message: String },
    #[error("webhook route `{route}`: cannot read its pause state: {source}")]
    Database {
        route: String,
        #[source]
        source: sqlx::Error,
    },
}

/// The publisher the relay uses: webhook routes by name, the broker for
/// everything else.
#[derive(Clone)]
pub struct Sinks<P> {
    broker: P,
    webhooks: Arc<HashMap<String, WebhookSender>>,
}

impl<P: Publisher> Sinks<P> {
    /// `broker` plus a sender for each webhook route of `routes`.
    pub async fn start(
        broker: P,
        routes: &[Route],
        db: &Db,
        metrics: &WebhookMetrics,
    ) -> Result<Self, WebhookSetupError> {
        let mut webhooks = HashMap::new();
        for (i, r) in routes.iter().enumerate() {
            if let (Some(sink), Some(name)) = (&r.webhook, &r.name) {
                let sender =
                    WebhookSender::start(db.clone(), name, sink, i, metrics.clone()).await?;
                webhooks.insert(name.clone(), sender);
            }
        }
        Ok(Self {
            broker,
            webhooks: Arc::new(webhooks),
        })
    }

    /// The webhook routes' names.
    pub fn webhook_routes(&self) -> Vec<String> {
        self.webhooks.keys().cloned().collect()
    }
}

impl<P: Publisher> Publisher for Sinks<P> {
    async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        match self.webhooks.get(&msg.topic) {
            Some(sender) => sender.publish(msg).await,
            None => self.broker.publish(msg).await,
        }
    }
}

/// Whether a route is paused, as this process last read it.
#[derive(Debug)]
struct PauseState {
    reason: Option<String>,
    checked: Instant,
}

/// One webhook route's sender.
#[derive(Clone)]
pub struct WebhookSender {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    db: Db,
    url: String,
    entry: OutboundHost,
    path: String,
    policy: OutboundPolicy,
    keys: SigningKeys,
    content_type: String,
    /// The route's config key, `routes[N].webhook`, for messages.
    key: String,
    pause: Mutex<PauseState>,
    /// One lock per key with a request in flight or waiting.
    in_flight: Mutex<HashMap<Vec<u8>, Arc<tokio::sync::Mutex<()>>>>,
    metrics: WebhookMetrics,
}

impl WebhookSender {
    /// Checks the sink (URL, secret, CA file) and reads whether the route
    /// is paused.
    pub async fn start(
        db: Db,
        name: &str,
        sink: &WebhookSink,
        index: usize,
        metrics: WebhookMetrics,
    ) -> Result<Self, WebhookSetupError> {
        let key = format!("routes[{index}].webhook");
        let bad = |k: &str, message: String| WebhookSetupError::Config {
            key: format!("{key}.{k}"),
            message,
        };
        let uri: Uri = sink
            .url
            .trim()
            .parse()
            .map_err(|e| bad("url", format!("`{}` is not a URL: {e}", sink.url)))?;
        let scheme = uri.scheme_str().unwrap_or("");
        let authority = uri.authority().map(|a| a.as_str()).unwrap_or("");
        let entry = OutboundHost::parse(&format!("{scheme}://{authority}"))
            .map_err(|e| bad("url", format!("{e}; use \"https://host[:port]/path\"")))?;
        let path = uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "/".into());
        let secret_key = if sink.secret_file.is_some() {
            "secret_file"
        } else {
            "secret_env"
        };
        let secret = sink.secret.as_ref().ok_or_else(|| {
            bad(
                secret_key,
                "no signing secret was loaded; set secret_env or secret_file".into(),
            )
        })?;
        let keys = SigningKeys::parse(&secret.0).map_err(|m| bad(secret_key, m))?;
        let extra_roots = match &sink.ca_file {
            Some(path) => read_roots(path).map_err(|m| bad("ca_file", m))?,
            None => Vec::new(),
        };
        let limits = HttpLimits {
            request_timeout: sink.timeout,
            max_response_bytes: sink.max_response_bytes,
            ..HttpLimits::default()
        };
        let policy = OutboundPolicy::for_webhook(key.clone(), entry.clone(), limits, extra_roots);
        let paused = route_pauses::paused(&db)
            .await
            .map_err(|source| WebhookSetupError::Database {
                route: name.to_string(),
                source,
            })?
            .into_iter()
            .find(|p| p.route == name)
            .map(|p| pause_message(name, &p.reason));
        if let Some(reason) = &paused {
            tracing::error!(route = %name, "{reason}");
        }
        metrics.set_paused(name, paused.is_some());
        Ok(Self {
            inner: Arc::new(Inner {
                name: name.to_string(),
                db,
                url: sink.url.trim().to_string(),
                entry,
                path,
                policy,
                keys,
                content_type: sink.content_type.trim().to_string(),
                key,
                pause: Mutex::new(PauseState {
                    reason: paused,
                    checked: Instant::now(),
                }),
                in_flight: Mutex::default(),
                metrics,
            }),
        })
    }

    /// Sends `msg` and waits for the answer; `Ok` only on a 2xx.
    pub async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        let me = &self.inner;
        if let Some(reason) = self.paused().await {
            return Err(PublishError::Paused { reason });
        }
        let lock = me.lock_for(&msg.key);
        let result = {
            let _turn = lock.lock().await;
            self.send(&msg).await
        };
        me.release(&msg.key, lock);
        result
    }

    /// The pause message when the route is paused; rereads the database
    /// at most every [`PAUSE_RECHECK`] while it is.
    async fn paused(&self) -> Option<String> {
        let me = &self.inner;
        {
            let state = me.pause.lock().unwrap_or_else(|p| p.into_inner());
            match &state.reason {
                None => return None,
                Some(r) if state.checked.elapsed() < PAUSE_RECHECK => return Some(r.clone()),
                Some(_) => {}
            }
        }
        let still = match route_pauses::paused(&me.db).await {
            Ok(rows) => rows
                .into_iter()
                .find(|p| p.route == me.name)
                .map(|p| pause_message(&me.name, &p.reason)),
            // Cannot tell: stay paused, look again later.
            Err(_) => me.pause_reason(),
        };
        let mut state = me.pause.lock().unwrap_or_else(|p| p.into_inner());
        if state.reason.is_some() && still.is_none() {
            tracing::info!(route = %me.name, "webhook route resumed; its waiting events go out in order");
        }
        state.reason = still.clone();
        state.checked = Instant::now();
        me.metrics.set_paused(&me.name, still.is_some());
        still
    }

    /// One request and what its answer means.
    async fn send(&self, msg: &OutgoingMessage) -> Result<(), PublishError> {
        let me = &self.inner;
        let id = msg.message_id.to_string();
        let timestamp = chrono::Utc::now().timestamp();
        let mut request = Request::post(me.path.as_str())
            .header(http::header::HOST, me.entry.authority())
            .header(http::header::CONTENT_TYPE, me.content_type.as_str())
            .header(
                http::header::USER_AGENT,
                concat!("outboxd/", env!("CARGO_PKG_VERSION")),
            )
            .header("webhook-id", id.as_str())
            .header("webhook-timestamp", timestamp.to_string())
            .header(
                "webhook-signature",
                me.keys.sign(&id, timestamp, &msg.payload),
            );
        for name in [crate::telemetry::TRACEPARENT, "tracestate"] {
            if let Some(v) = msg.header(name)
                && let Ok(v) = http::HeaderValue::from_bytes(v)
            {
                request = request.header(name, v);
            }
        }
        let request = request
            .body(Full::new(Bytes::from(msg.payload.clone())))
            .map_err(|e| {
                PublishError::Permanent(format!("{}: cannot build the request: {e}", me.key))
            })?;
        let answer = match resolve(&me.policy, &me.entry).await {
            Ok(addr) => send_live(&me.policy, &me.entry, addr, request).await,
            Err(e) => Err(e),
        };
        let response = match answer {
            Ok(r) => r,
            Err(e) => {
                let class = match &e {
                    SendError::Timeout(..) => "timeout",
                    _ => "error",
                };
                me.metrics.request(&me.name, class);
                return Err(me.send_error(e));
            }
        };
        let status = response.status();
        me.metrics.request(&me.name, status_class(status));
        me.judge(status, response.headers(), response.body()).await
    }
}

impl Inner {
    fn pause_reason(&self) -> Option<String> {
        self.pause
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reason
            .clone()
    }

    fn lock_for(&self, key: &[u8]) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(key.to_vec()).or_default().clone()
    }

    /// Drops the key's lock once nobody else holds or waits for it.
    fn release(&self, key: &[u8], lock: Arc<tokio::sync::Mutex<()>>) {
        let mut map = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        drop(lock);
        if map.get(key).is_some_and(|l| Arc::strong_count(l) == 1) {
            map.remove(key);
        }
    }

    fn send_error(&self, e: SendError) -> PublishError {
        match e {
            SendError::ResponseTooLarge(cap) => PublishError::Permanent(format!(
                "POST {}: the response body is larger than {cap} bytes ({}.max_response_bytes); \
                 raise the cap or make the endpoint answer briefly",
                self.url, self.key
            )),
            other => PublishError::Retryable(format!("POST {}: {other}", self.url)),
        }
    }

    /// What an answer means for the event.
    async fn judge(
        &self,
        status: StatusCode,
        headers: &http::HeaderMap,
        body: &Bytes,
    ) -> Result<(), PublishError> {
        let code = status.as_u16();
        if status.is_success() {
            return Ok(());
        }
        let excerpt = excerpt(body);
        if status.is_redirection() {
            let to = headers
                .get(http::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("(no Location)");
            return Err(PublishError::Permanent(format!(
                "POST {} answered {code}, a redirect to {to}; outboxd follows no redirects: set \
                 {}.url to the final address",
                self.url, self.key
            )));
        }
        if code == 410 {
            let reason = format!("POST {} answered 410 Gone: {excerpt}", self.url);
            if let Err(e) = route_pauses::pause(&self.db, &self.name, &reason).await {
                tracing::error!(route = %self.name, error = %e, "cannot record the route's pause; it holds in this process only");
            }
            let message = pause_message(&self.name, &reason);
            tracing::error!(route = %self.name, "{message}");
            let mut state = self.pause.lock().unwrap_or_else(|p| p.into_inner());
            state.reason = Some(message.clone());
            state.checked = Instant::now();
            self.metrics.set_paused(&self.name, true);
            return Err(PublishError::Paused { reason: message });
        }
        let reason = format!("POST {} answered {code}: {excerpt}", self.url);
        if code == 408 || code == 429 || status.is_server_error() {
            return Err(match retry_after(headers) {
                Some(after) => PublishError::Throttled { reason, after },
                None => PublishError::Retryable(reason),
            });
        }
        Err(PublishError::Permanent(format!(
            "{reason}; the endpoint refused the request (a 4xx is not retried): fix the receiver \
             or the route's transformers, then redrive with `outboxd dead`"
        )))
    }
}

/// What a paused route's events show while they wait.
fn pause_message(route: &str, reason: &str) -> String {
    format!(
        "webhook route `{route}` is paused ({reason}); its events wait without counting \
         attempts; when the endpoint is back, run `outboxd route resume {route}`"
    )
}

/// `2xx`, `3xx`, `4xx` or `5xx`, for the metrics.
fn status_class(status: StatusCode) -> &'static str {
    match status.as_u16() {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "other",
    }
}

/// `Retry-After` as seconds or an HTTP date, at most [`MAX_RETRY_AFTER`].
fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let v = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    let after = match v.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => {
            let at = chrono::DateTime::parse_from_rfc2822(v).ok()?;
            (at.with_timezone(&chrono::Utc) - chrono::Utc::now())
                .to_std()
                .unwrap_or(Duration::ZERO)
        }
    };
    Some(after.min(MAX_RETRY_AFTER))
}

/// The first bytes of a body as one line of text.
fn excerpt(body: &Bytes) -> String {
    let cut = &body[..body.len().min(BODY_EXCERPT)];
    let text: String = String::from_utf8_lossy(cut)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.trim().is_empty() {
        "(empty body)".into()
    } else if body.len() > BODY_EXCERPT {
        format!("{}…", text.trim())
    } else {
        text.trim().to_string()
    }
}

/// The certificates of a PEM file, each checked as a trust anchor.
fn read_roots(
    path: &str,
) -> Result<Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>>, String> {
    use tokio_rustls::rustls::pki_types::CertificateDer;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    let pem = std::fs::read(path).map_err(|e| {
        format!("cannot read {path}: {e}; point it at a PEM file of CA certificates")
    })?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{path} is not PEM: {e}; give the CA certificates in PEM"))?;
    if certs.is_empty() {
        return Err(format!(
            "{path} holds no certificate; give the CA certificates in PEM (BEGIN CERTIFICATE)"
        ));
    }
    let mut store = tokio_rustls::rustls::RootCertStore::empty();
    for (i, cert) in certs.iter().enumerate() {
        store.add(cert.clone()).map_err(|e| {
            format!(
                "certificate {} in {path} cannot be a trust anchor: {e}",
                i + 1
            )
        })?;
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_dates_and_is_capped() {
        let mut h = http::HeaderMap::new();
        h.insert(http::header::RETRY_AFTER, "7".parse().expect("value"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        h.insert(http::header::RETRY_AFTER, "999999".parse().expect("value"));
        assert_eq!(retry_after(&h), Some(MAX_RETRY_AFTER));
        let soon = (chrono::Utc::now() + chrono::Duration::seconds(30)).to_rfc2822();
        h.insert(http::header::RETRY_AFTER, soon.parse().expect("value"));
        let d = retry_after(&h).expect("a date");
        assert!(
            d > Duration::from_secs(25) && d <= Duration::from_secs(30),
            "{d:?}"
        );
        h.insert(http::header::RETRY_AFTER, "soon".parse().expect("value"));
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn an_excerpt_is_one_bounded_line() {
        let long = Bytes::from(format!("bad\r\nrequest {}", "x".repeat(500)));
        let e = excerpt(&long);
        assert!(
            e.starts_with("bad  request") && e.ends_with('…') && e.len() < 220,
            "{e}"
        );
        assert_eq!(excerpt(&Bytes::new()), "(empty body)");
    }
}
