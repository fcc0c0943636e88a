//! The OTLP exporter's HTTP client: one HTTP/1.1 POST per export on the
//! hyper that axum already links, in the clear for an `http://` endpoint
//! and over rustls (ring) for an `https://` one, run on the process's tokio
//! runtime. The SDK's batch processor exports from a thread of its own and
//! blocks on the returned future, which only waits for the task on the
//! runtime.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, pki_types};

/// How often a failing exporter logs, at most.
const LOG_EVERY: Duration = Duration::from_secs(60);

#[derive(Clone)]
pub(super) struct ExportClient {
    runtime: tokio::runtime::Handle,
    timeout: Duration,
    /// The TLS setup for an https endpoint; an https request without it is
    /// refused, never sent in the clear.
    tls: Option<TlsConnector>,
    failures: Arc<Mutex<Failures>>,
}

impl std::fmt::Debug for ExportClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportClient")
            .field("timeout", &self.timeout)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Failed exports since the last warning, so a collector that is down
/// costs one log line a minute, not one per batch.
#[derive(Debug, Default)]
struct Failures {
    last_logged: Option<Instant>,
    since_logged: u64,
}

impl ExportClient {
    /// A client on the current runtime; an error outside one. `tls` is
    /// required for an https endpoint.
    pub(super) fn new(timeout: Duration, tls: Option<TlsConnector>) -> Result<Self, String> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| format!("telemetry must start inside the tokio runtime ({e})"))?;
        Ok(Self {
            runtime,
            timeout,
            tls,
            failures: Arc::default(),
        })
    }

    /// Logs a failed export: the first at once, then at most one warning a
    /// minute with the number of failures since the last one.
    fn log_failure(&self, endpoint: &http::Uri, error: &HttpError) {
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        f.since_logged += 1;
        if f.last_logged.is_some_and(|at| at.elapsed() < LOG_EVERY) {
            return;
        }
        tracing::warn!(%endpoint, %error, failed_exports = f.since_logged,
            "OTLP export failed: these spans are dropped");
        f.last_logged = Some(Instant::now());
        f.since_logged = 0;
    }

    fn log_success(&self, endpoint: &http::Uri) {
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if f.last_logged.take().is_some() {
            tracing::info!(%endpoint, "OTLP exports succeed again");
        }
        f.since_logged = 0;
    }
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let timeout = self.timeout;
        let endpoint = request.uri().clone();
        let tls = self.tls.clone();
        let task = self
            .runtime
            .spawn(async move { tokio::time::timeout(timeout, post(request, tls)).await });
        let result = match task.await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(format!("the collector did not answer within {timeout:?}").into()),
            Err(e) => Err(format!("the export task stopped: {e}").into()),
        };
        match &result {
            Ok(r) if r.status().is_success() => self.log_success(&endpoint),
            Ok(r) => {
                let error = format!("the collector answered {}", r.status()).into();
                self.log_failure(&endpoint, &error);
            }
            Err(e) => self.log_failure(&endpoint, e),
        }
        result
    }
}

async fn post(
    request: Request<Bytes>,
    tls: Option<TlsConnector>,
) -> Result<Response<Bytes>, HttpError> {
    let (mut parts, body) = request.into_parts();
    let authority = parts
        .uri
        .authority()
        .cloned()
        .ok_or_else(|| format!("OTLP endpoint `{}` names no host", parts.uri))?;
    let https = match parts.uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        other => return Err(format!("OTLP endpoint scheme {other:?} is not http or https").into()),
    };
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    let stream = tokio::net::TcpStream::connect((host, port)).await?;
    parts.headers.insert(
        http::header::HOST,
        http::HeaderValue::from_str(authority.as_str())?,
    );
    parts.uri = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .parse()?;
    let request = Request::from_parts(parts, Full::new(body));
    if !https {
        return exchange(TokioIo::new(stream), request).await;
    }
    let Some(tls) = tls else {
        return Err("an https endpoint needs the exporter's TLS setup; nothing was sent".into());
    };
    let name = pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| format!("`{host}` is not a TLS server name: {e}"))?;
    let stream = tls
        .connect(name, stream)
        .await
        .map_err(|e| explain_handshake(host, &e))?;
    exchange(TokioIo::new(stream), request).await
}

async fn exchange<IO>(io: IO, request: Request<Full<Bytes>>) -> Result<Response<Bytes>, HttpError>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    let connection = tokio::spawn(connection);
    let response = sender.send_request(request).await?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await?.to_bytes();
    drop(sender);
    let _ = connection.await;
    Ok(Response::from_parts(parts, body))
}

/// A failed TLS handshake with the collector, with the fix when the
/// certificate is what failed.
fn explain_handshake(host: &str, e: &std::io::Error) -> String {
    use rustls::CertificateError as C;
    let rustls_error = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    let fix = match rustls_error {
        Some(rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature)) => {
            "; the collector's certificate is not signed by a CA outboxd trusts: set \
             telemetry.ca_file to its CA's certificate (PEM)"
        }
        Some(rustls::Error::InvalidCertificate(
            C::NotValidForName | C::NotValidForNameContext { .. },
        )) => {
            "; the certificate does not name this host: write the name it was issued for \
             in telemetry.otlp_endpoint"
        }
        Some(rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. })) => {
            "; the collector's certificate has expired: renew it"
        }
        _ => "",
    };
    format!("TLS with the collector at {host}: {e}{fix}")
}

/// Why the TLS setup for an https collector could not be made.
#[derive(Debug, thiserror::Error)]
pub(super) enum TlsSetupError {
    #[error(transparent)]
    CaFile(#[from] CaFileProblem),
    #[error("rustls refused TLS 1.2 and 1.3 over ring: {0}")]
    Protocols(rustls::Error),
}

/// Why a `ca_file` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CaFileProblem {
    #[error("cannot read it ({0})")]
    Read(std::io::Error),
    #[error("it is not PEM ({0})")]
    NotPem(String),
    #[error("it holds no certificate (no -----BEGIN CERTIFICATE----- block)")]
    Empty,
    #[error("certificate {index} in it cannot be a trust anchor ({reason})")]
    BadCertificate { index: usize, reason: String },
}

/// The TLS setup for an https collector: TLS 1.2 and 1.3 over ring,
/// Mozilla's roots plus the certificates of `ca_file`, the server's name
/// verified, no client certificate.
pub(super) fn connector(ca_file: Option<&Path>) -> Result<TlsConnector, TlsSetupError> {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = ca_file {
        use pki_types::pem::PemObject;
        let pem = std::fs::read(path).map_err(CaFileProblem::Read)?;
        let certs = pki_types::CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CaFileProblem::NotPem(e.to_string()))?;
        if certs.is_empty() {
            return Err(CaFileProblem::Empty.into());
        }
        for (index, cert) in certs.into_iter().enumerate() {
            roots.add(cert).map_err(|e| CaFileProblem::BadCertificate {
                index: index + 1,
                reason: e.to_string(),
            })?;
        }
    }
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(TlsSetupError::Protocols)?
            .with_root_certificates(roots)
            .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}
