//! OpenTelemetry traces: one trace per event, from the producer's
//! `traceparent` through the relay, the broker and the consumer to the
//! inbox commit. Off unless an OTLP endpoint is configured; while off,
//! every function here returns at one atomic load and makes nothing.
//!
//! The trace context travels in the `traceparent` header: of the outbox
//! row (rewritten at enqueue to the enqueue span), of the broker message
//! (set to the publish span), and of the delivery inside the consumer (set
//! to the fetch span), so each step parents on the one before without any
//! state beside the message. Only events whose producer passed a
//! `traceparent` are traced. The spans, in the order an event meets them:
//!
//! | span | parent | attributes |
//! |---|---|---|
//! | `enqueue` | the producer's `traceparent` | aggregate, type |
//! | `claim` | `enqueue` | seq, message id |
//! | `plugin.transform` | `claim` | plugin name, version |
//! | `publish` (ends at the broker's ack) | `claim` | topic, message id |
//! | `fetch` | `publish` | consumer, topic, partition, offset |
//! | `inbox.mark` | `fetch` | consumer |
//! | `handle` (a native handler or a consumer plugin) | `fetch` | handler, plugin name, version |
//! | `plugin.statement` | `handle` | statement kind, table (never values) |
//! | `commit` | `fetch` | consumer |

mod http;

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use outboxd_core::config::{TelemetryConfig, endpoint_problem};

pub use http::CaFileProblem;
pub use opentelemetry::context::FutureExt;

/// The header that carries the trace context.
pub const TRACEPARENT: &str = "traceparent";

static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Spans are being made.
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("{key}: {problem}")]
    Endpoint { key: &'static str, problem: String },
    #[error(
        "{key}: `{}`: {problem}; name a PEM file of the CA certificates the collector's \
         certificate chains to, or remove {key} to trust Mozilla's roots alone",
        .path.display()
    )]
    CaFile {
        key: &'static str,
        path: std::path::PathBuf,
        problem: CaFileProblem,
    },
    #[error("cannot build the OTLP exporter for {endpoint}: {message}")]
    Exporter { endpoint: String, message: String },
}

/// The running exporter. Dropping it (or [`Telemetry::shutdown`]) sends the
/// spans not yet sent; until then they go every `OTEL_BSP_SCHEDULE_DELAY`
/// milliseconds (5000 by default).
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Starts exporting when `config` or the `OTEL_*` environment names an
    /// endpoint; otherwise does nothing and spans stay off. Call it inside
    /// the runtime that should carry the exports, once per process.
    pub fn start(config: &TelemetryConfig) -> Result<Self, TelemetryError> {
        Self::start_with_env(config, |name| std::env::var(name).ok())
    }

    fn start_with_env(
        config: &TelemetryConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, TelemetryError> {
        let off = Ok(Self { provider: None });
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return off;
        }
        let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        // The config names the base URL; OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
        // is the full URL, OTEL_EXPORTER_OTLP_ENDPOINT the base.
        let (key, endpoint) = if let Some(url) = &config.otlp_endpoint {
            ("telemetry.otlp_endpoint", traces_url(url))
        } else if let Some(url) = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url)
        } else if let Some(url) = set("OTEL_EXPORTER_OTLP_ENDPOINT") {
            ("OTEL_EXPORTER_OTLP_ENDPOINT", traces_url(&url))
        } else {
            return off;
        };
        if let Some(problem) = endpoint_problem(&endpoint) {
            return Err(TelemetryError::Endpoint { key, problem });
        }
        let ca_file = if let Some(path) = &config.ca_file {
            Some(("telemetry.ca_file", path.clone()))
        } else if let Some(path) = set("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE") {
            Some(("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", path.into()))
        } else {
            set("OTEL_EXPORTER_OTLP_CERTIFICATE")
                .map(|path| ("OTEL_EXPORTER_OTLP_CERTIFICATE", path.into()))
        };
        let tls = if endpoint.starts_with("https://") {
            Some(tls_connector(&endpoint, ca_file)?)
        } else if let Some((ca_key, _)) = ca_file {
            return Err(TelemetryError::Endpoint {
                key: ca_key,
                problem: format!(
                    "names a CA for an https collector, but the endpoint ({key}) is \
                     `{endpoint}`, in the clear; write https://… or remove {ca_key}"
                ),
            });
        } else {
            None
        };
        let service = config
            .service_name
            .clone()
            .or_else(|| set("OTEL_SERVICE_NAME"))
            .unwrap_or_else(|| "outboxd".into());
        let provider = provider(&endpoint, service, tls)?;
        let tracer = provider.tracer("outboxd");
        if TRACER.set(tracer).is_err() {
            tracing::warn!("telemetry was already started in this process; keeping the first");
        }
        tracing::info!(endpoint = %endpoint, "sending OpenTelemetry traces");
        Ok(Self {
            provider: Some(provider),
        })
    }

    /// Sends the spans not yet sent and stops the exporter.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown_with_timeout(Duration::from_secs(5))
        {
            tracing::warn!(error = %e, "some spans could not be sent at shutdown");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.stop();
    }
}

fn traces_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

/// The TLS setup for an https endpoint, with `ca_file`'s certificates
/// (and the key that named it) added to Mozilla's roots.
fn tls_connector(
    endpoint: &str,
    ca_file: Option<(&'static str, std::path::PathBuf)>,
) -> Result<tokio_rustls::TlsConnector, TelemetryError> {
    let path = ca_file.as_ref().map(|(_, p)| p.as_path());
    http::connector(path).map_err(|e| match (e, ca_file) {
        (http::TlsSetupError::CaFile(problem), Some((key, path))) => {
            TelemetryError::CaFile { key, path, problem }
        }
        (e, _) => TelemetryError::Exporter {
            endpoint: endpoint.into(),
            message: e.to_string(),
        },
    })
}

fn provider(
    endpoint: &str,
    service: String,
    tls: Option<tokio_rustls::TlsConnector>,
) -> Result<SdkTracerProvider, TelemetryError> {
    use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
    let client = http::ExportClient::new(Duration::from_secs(10), tls).map_err(|message| {
        TelemetryError::Exporter {
            endpoint: endpoint.into(),
            message,
        }
    })?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| TelemetryError::Exporter {
            endpoint: endpoint.into(),
            message: e.to_string(),
        })?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service)
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// The remote context a `traceparent` value names; `None` while off, or
/// for a value that is not a valid W3C traceparent.
pub fn remote(traceparent: Option<&str>) -> Option<Context> {
    let value = traceparent?;
    if !enabled() {
        return None;
    }
    let carrier: HashMap<String, String> = [(TRACEPARENT.to_string(), value.to_string())].into();
    let cx = TraceContextPropagator::new().extract(&carrier);
    cx.span().span_context().is_valid().then_some(cx)
}

/// The context a message's headers carry (see [`remote`]).
pub fn from_headers<V: AsRef<[u8]>>(headers: &[(String, V)]) -> Option<Context> {
    if !enabled() {
        return None;
    }
    let value = headers
        .iter()
        .find(|(k, _)| k == TRACEPARENT)
        .and_then(|(_, v)| std::str::from_utf8(v.as_ref()).ok());
    remote(value)
}

/// A span being recorded, or nothing (telemetry off, or nothing to parent
/// it on). Ends when dropped, or by [`Span::end`].
#[derive(Debug, Default)]
pub struct Span(Option<Context>);

impl Span {
    /// A span under `parent`; nothing without one.
    pub fn child(parent: Option<&Context>, name: &'static str, kind: SpanKind) -> Span {
        Self::child_at(parent, name, kind, None)
    }

    /// [`Span::child`], started at `start` rather than now.
    pub fn child_at(
        parent: Option<&Context>,
        name: &'static str,
        kind: SpanKind,
        start: Option<SystemTime>,
    ) -> Span {
        let (Some(parent), Some(tracer)) = (parent, TRACER.get()) else {
            return Span(None);
        };
        let mut builder = tracer.span_builder(name).with_kind(kind);
        if let Some(start) = start {
            builder = builder.with_start_time(start);
        }
        let span = builder.start_with_context(tracer, parent);
        Span(Some(parent.with_span(span)))
    }

    /// A span under the context the current future runs in (see
    /// [`FutureExt::with_context`]); nothing if it has no span.
    pub fn in_current(name: &'static str, kind: SpanKind) -> Span {
        if !enabled() {
            return Span(None);
        }
        let current = Context::current();
        if !current.has_active_span() {
            return Span(None);
        }
        Self::child(Some(&current), name, kind)
    }

    pub fn is_recording(&self) -> bool {
        self.0.is_some()
    }

    /// Sets an attribute; `value` is only made when the span records.
    pub fn attr<V: Into<opentelemetry::Value>>(
        &self,
        key: &'static str,
        value: impl FnOnce() -> V,
    ) {
        if let Some(cx) = &self.0 {
            cx.span().set_attribute(KeyValue::new(key, value().into()));
        }
    }

    /// Marks the span failed with `message`.
    pub fn fail(&self, message: impl FnOnce() -> String) {
        if let Some(cx) = &self.0 {
            cx.span().set_status(Status::error(message()));
        }
    }

    /// Records `result`'s error, if any, and passes it on.
    pub fn record<T, E: std::fmt::Display>(&self, result: &Result<T, E>) {
        if let Err(e) = result {
            self.fail(|| e.to_string());
        }
    }

    /// The context with this span active, for children and for
    /// [`FutureExt::with_context`].
    pub fn context(&self) -> Option<&Context> {
        self.0.as_ref()
    }

    /// This span as a W3C `traceparent` value.
    pub fn traceparent(&self) -> Option<String> {
        let cx = self.0.as_ref()?;
        let mut carrier = HashMap::new();
        TraceContextPropagator::new().inject_context(cx, &mut carrier);
        carrier.remove(TRACEPARENT)
    }

    pub fn end(self) {}

    /// Ends the span now, keeping its context as a parent for later spans.
    pub fn finish(&self) {
        if let Some(cx) = &self.0 {
            cx.span().end();
        }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(cx) = self.0.take() {
            cx.span().end();
        }
    }
}

/// Splits a `name@version` label into plugin attributes on `span`.
pub fn plugin_attrs(span: &Span, label: &str) {
    if !span.is_recording() {
        return;
    }
    let (name, version) = label.split_once('@').unwrap_or((label, ""));
    span.attr("outboxd.plugin.name", || name.to_string());
    span.attr("outboxd.plugin.version", || version.to_string());
}

/// A `fetch` span, started at `started`, for every traced message a
/// consumer just fetched; each message's `traceparent` becomes its fetch
/// span, the parent of what the consumer does with it. Nothing while off.
pub fn fetched(
    deliveries: &mut [outboxd_core::message::Delivery],
    consumer: &str,
    started: Option<SystemTime>,
) {
    if started.is_none() {
        return;
    }
    for d in deliveries {
        let parent = from_headers(&d.headers);
        let span = Span::child_at(parent.as_ref(), "fetch", SpanKind::Consumer, started);
        let Some(traceparent) = span.traceparent() else {
            continue;
        };
        span.attr("outboxd.consumer", || consumer.to_string());
        span.attr("messaging.destination.name", || d.topic.clone());
        span.attr("messaging.destination.partition.id", || {
            d.partition.to_string()
        });
        span.attr("messaging.kafka.offset", || d.offset);
        set_traceparent(&mut d.headers, traceparent);
    }
}

/// A span under the trace context a delivery carries (its fetch span).
pub fn for_delivery(
    d: &outboxd_core::message::Delivery,
    name: &'static str,
    consumer: &str,
) -> Span {
    let span = Span::child(from_headers(&d.headers).as_ref(), name, SpanKind::Internal);
    span.attr("outboxd.consumer", || consumer.to_string());
    span
}

/// Replaces (or adds) the `traceparent` of `headers` with `value`.
pub fn set_traceparent<V: From<String>>(headers: &mut Vec<(String, V)>, value: String) {
    match headers.iter_mut().find(|(k, _)| k == TRACEPARENT) {
        Some((_, v)) => *v = V::from(value),
        None => headers.push((TRACEPARENT.to_string(), V::from(value))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_endpoint_telemetry_stays_off() {
        let t = Telemetry::start_with_env(&TelemetryConfig::default(), |_| None).expect("off");
        assert!(t.provider.is_none());
        assert!(
            Span::child(Some(&Context::new()), "x", SpanKind::Internal)
                .context()
                .is_none()
        );
    }

    #[test]
    fn a_bad_environment_endpoint_is_named() {
        let env =
            |name: &str| (name == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "grpc://x".to_string());
        let e = Telemetry::start_with_env(&TelemetryConfig::default(), env).expect_err("grpc");
        assert!(
            e.to_string().starts_with("OTEL_EXPORTER_OTLP_ENDPOINT: "),
            "{e}"
        );
    }

    fn https_with_ca(ca_file: &std::path::Path) -> TelemetryConfig {
        TelemetryConfig {
            otlp_endpoint: Some("https://127.0.0.1:1".into()),
            ca_file: Some(ca_file.into()),
            ..TelemetryConfig::default()
        }
    }

    #[test]
    fn a_missing_or_non_pem_ca_file_is_refused_at_start_naming_the_key() {
        let dir = std::env::temp_dir().join(format!("outboxd-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let missing = dir.join("missing.pem");
        let not_pem = dir.join("not.pem");
        std::fs::write(&not_pem, "just some text, no certificate\n").expect("write");
        let broken = dir.join("broken.pem");
        std::fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\nnot base64 !!\n-----END CERTIFICATE-----\n",
        )
        .expect("write");
        for (path, why) in [
            (&missing, "cannot read it"),
            (&not_pem, "holds no certificate"),
            (&broken, "not PEM"),
        ] {
            let e = Telemetry::start_with_env(&https_with_ca(path), |_| None)
                .expect_err("a bad ca_file");
            let text = e.to_string();
            assert!(
                text.starts_with("telemetry.ca_file: ")
                    && text.contains(why)
                    && text.contains("name a PEM file"),
                "{text}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!enabled(), "no exporter was started");
    }

    #[test]
    fn a_ca_file_with_a_plain_http_endpoint_is_refused() {
        let config = TelemetryConfig {
            otlp_endpoint: Some("http://127.0.0.1:4318".into()),
            ca_file: Some("/etc/outboxd/otel-ca.pem".into()),
            ..TelemetryConfig::default()
        };
        let e = Telemetry::start_with_env(&config, |_| None).expect_err("ca_file over http");
        let text = e.to_string();
        assert!(
            text.starts_with("telemetry.ca_file: ") && text.contains("https://"),
            "{text}"
        );
    }

    #[test]
    fn sdk_disabled_wins_over_an_endpoint() {
        let config = TelemetryConfig {
            otlp_endpoint: Some("http://127.0.0.1:4318".into()),
            ..TelemetryConfig::default()
        };
        let env = |name: &str| (name == "OTEL_SDK_DISABLED").then(|| "true".to_string());
        let t = Telemetry::start_with_env(&config, env).expect("off");
        assert!(t.provider.is_none());
    }
}
