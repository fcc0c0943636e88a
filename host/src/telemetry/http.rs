//! The OTLP exporter's HTTP client: one plain HTTP/1.1 POST per export on
//! the hyper that axum already links, run on the process's tokio runtime.
//! The SDK's batch processor exports from a thread of its own and blocks
//! on the returned future, which only waits for the task on the runtime.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};

#[derive(Debug, Clone)]
pub(super) struct ExportClient {
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

impl ExportClient {
    /// A client on the current runtime; an error outside one.
    pub(super) fn new(timeout: Duration) -> Result<Self, String> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| format!("telemetry must start inside the tokio runtime ({e})"))?;
        Ok(Self { runtime, timeout })
    }
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let timeout = self.timeout;
        let task = self
            .runtime
            .spawn(async move { tokio::time::timeout(timeout, post(request)).await });
        match task.await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(format!("the collector did not answer within {timeout:?}").into()),
            Err(e) => Err(format!("the export task stopped: {e}").into()),
        }
    }
}

async fn post(request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
    let (mut parts, body) = request.into_parts();
    let authority = parts
        .uri
        .authority()
        .cloned()
        .ok_or_else(|| format!("OTLP endpoint `{}` names no host", parts.uri))?;
    let port = authority.port_u16().unwrap_or(80);
    let stream = tokio::net::TcpStream::connect((authority.host(), port)).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let connection = tokio::spawn(connection);
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
    let response = sender
        .send_request(Request::from_parts(parts, Full::new(body)))
        .await?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await?.to_bytes();
    drop(sender);
    let _ = connection.await;
    Ok(Response::from_parts(parts, body))
}
