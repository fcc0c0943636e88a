//! How an admitted request reaches an answer: [`Transport::Live`] resolves,
//! checks the address, connects to that address and speaks HTTP/1.1 (TLS
//! for https); [`Transport::Stub`] answers from canned responses and opens
//! nothing. Both read the whole body within the caps.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use outboxd_core::config::{OutboundHost, OutboundScheme};
use serde::Deserialize;
use tokio::net::TcpStream;

use super::policy::OutboundPolicy;

/// Where a plugin's admitted requests go.
#[derive(Debug, Clone, Default)]
pub enum Transport {
    /// The network: the host resolves the name, checks the address and
    /// connects to it.
    #[default]
    Live,
    /// Canned responses; nothing leaves the process. The allow-list and the
    /// caps still apply; names are not resolved.
    Stub(Arc<HttpStub>),
    /// Every request refused: a shadow run or a dry run, which must have
    /// no effect outside its rolled-back transaction.
    Shadow,
}

/// Canned responses, tried in order: the first whose method (if given)
/// and URL (exact, or a prefix of the request's) match answers.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct HttpStub {
    pub responses: Vec<StubResponse>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct StubResponse {
    #[serde(default)]
    pub method: Option<String>,
    /// The request URL, or a prefix of it.
    pub url: String,
    pub status: u16,
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    #[serde(default)]
    pub body: Vec<u8>,
}

impl HttpStub {
    pub fn new(responses: Vec<StubResponse>) -> Self {
        Self { responses }
    }

    /// The answer to `method url`, if a response matches.
    pub fn answer(&self, method: &str, url: &str) -> Option<&StubResponse> {
        self.responses.iter().find(|r| {
            r.method
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case(method))
                && url.starts_with(&r.url)
        })
    }
}

/// Why a request failed after it was admitted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// Refused before a connection (an address the policy refuses).
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Failed(String),
    #[error("the response body is larger than max_response_bytes ({0})")]
    ResponseTooLarge(u64),
    #[error("no answer within request_timeout ({0:?}): {1}")]
    Timeout(Duration, &'static str),
}

/// The checked address of `entry`: resolved by the host (or the literal),
/// and only an address the policy allows. The connection goes to exactly
/// this address, so a second lookup cannot change it.
pub(crate) async fn resolve(
    policy: &OutboundPolicy,
    entry: &OutboundHost,
) -> Result<SocketAddr, SendError> {
    let timeout = policy.limits.request_timeout;
    let addrs: Vec<IpAddr> = match entry.ip() {
        Some(ip) => vec![ip],
        None => tokio::time::timeout(
            timeout,
            tokio::net::lookup_host((entry.host.as_str(), entry.port)),
        )
        .await
        .map_err(|_| SendError::Timeout(timeout, "resolving the host"))?
        .map_err(|e| SendError::Failed(format!("cannot resolve {}: {e}", entry.host)))?
        .map(|a| a.ip())
        .collect(),
    };
    let mut refusal = None;
    for ip in addrs {
        match policy.check_address(entry, ip) {
            Ok(()) => return Ok(SocketAddr::new(ip, entry.port)),
            Err(why) => refusal = Some(why),
        }
    }
    Err(SendError::Refused(refusal.unwrap_or_else(|| {
        format!("{} resolved to no address", entry.host)
    })))
}

/// Sends `request` (origin-form URI, headers final) to `addr` and reads
/// the answer whole within the policy's timeout and response cap.
pub(crate) async fn send_live(
    policy: &OutboundPolicy,
    entry: &OutboundHost,
    addr: SocketAddr,
    request: Request<Full<Bytes>>,
) -> Result<Response<Bytes>, SendError> {
    let timeout = policy.limits.request_timeout;
    let tcp = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| SendError::Timeout(timeout, "connecting"))?
        .map_err(|e| SendError::Failed(format!("cannot connect to {addr}: {e}")))?;
    let response = match entry.scheme {
        OutboundScheme::Http => exchange(TokioIo::new(tcp), request, timeout).await?,
        OutboundScheme::Https => {
            let tls = tls_connect(entry, tcp, timeout, &policy.extra_roots).await?;
            exchange(TokioIo::new(tls), request, timeout).await?
        }
    };
    read_body(response, policy.limits.max_response_bytes, timeout).await
}

async fn tls_connect(
    entry: &OutboundHost,
    tcp: TcpStream,
    timeout: Duration,
    extra_roots: &[tokio_rustls::rustls::pki_types::CertificateDer<'static>],
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, SendError> {
    use tokio_rustls::rustls::{ClientConfig, RootCertStore, pki_types::ServerName};
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    for cert in extra_roots {
        roots
            .add(cert.clone())
            .map_err(|e| SendError::Failed(format!("an extra root certificate: {e}")))?;
    }
    let config = ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| SendError::Failed(format!("TLS setup: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = ServerName::try_from(entry.host.clone()).map_err(|e| {
        SendError::Failed(format!("`{}` is not a TLS server name: {e}", entry.host))
    })?;
    tokio::time::timeout(
        timeout,
        tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp),
    )
    .await
    .map_err(|_| SendError::Timeout(timeout, "the TLS handshake"))?
    .map_err(|e| SendError::Failed(format!("TLS with {}: {e}", entry.host)))
}

async fn exchange<IO>(
    io: IO,
    request: Request<Full<Bytes>>,
    timeout: Duration,
) -> Result<Response<hyper::body::Incoming>, SendError>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        tokio::time::timeout(timeout, hyper::client::conn::http1::handshake(io))
            .await
            .map_err(|_| SendError::Timeout(timeout, "the HTTP handshake"))?
            .map_err(|e| SendError::Failed(format!("HTTP handshake: {e}")))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "plugin HTTP connection ended");
        }
    });
    tokio::time::timeout(timeout, sender.send_request(request))
        .await
        .map_err(|_| SendError::Timeout(timeout, "waiting for the first byte"))?
        .map_err(|e| SendError::Failed(format!("HTTP: {e}")))
}

/// Reads the body frame by frame: each frame within `timeout`, the whole
/// at most `cap` bytes.
async fn read_body(
    response: Response<hyper::body::Incoming>,
    cap: u64,
    timeout: Duration,
) -> Result<Response<Bytes>, SendError> {
    let (parts, mut body) = response.into_parts();
    let mut out = Vec::new();
    loop {
        let frame = tokio::time::timeout(timeout, body.frame())
            .await
            .map_err(|_| SendError::Timeout(timeout, "between bytes of the body"))?;
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| SendError::Failed(format!("reading the body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if out.len() as u64 + data.len() as u64 > cap {
                return Err(SendError::ResponseTooLarge(cap));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(Response::from_parts(parts, Bytes::from(out)))
}

/// A stub's answer as a response.
pub(crate) fn stub_response(r: &StubResponse, cap: u64) -> Result<Response<Bytes>, SendError> {
    if r.body.len() as u64 > cap {
        return Err(SendError::ResponseTooLarge(cap));
    }
    let mut response = Response::builder().status(r.status);
    for (k, v) in &r.headers {
        response = response.header(k, v);
    }
    response
        .body(Bytes::from(r.body.clone()))
        .map_err(|e| SendError::Failed(format!("bad stub response for {}: {e}", r.url)))
}

/// Headers as (name, value) text pairs.
pub(crate) fn header_pairs(h: &HeaderMap) -> Vec<(String, String)> {
    h.iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}
