//! Outbound HTTP for consumer plugins, over `wasi:http/outgoing-handler`
//! (the `consumer-http` world).
//!
//! ```ignore
//! use outboxd_guest_consumer::http;
//!
//! let response = http::post("https://api.example.com/charges")
//!     .json(&serde_json::json!({"amount_cents": 1250}))?
//!     .header("Accept", "application/json")
//!     .send()?
//!     .error_for_status()?;          // 4xx → permanent, 5xx → retryable
//! let charge: Charge = response.json()?;
//! ```
//!
//! The host sends the request, and only to a host the plugin's
//! `allowed_outbound_hosts` lists; it adds `Idempotency-Key: <message id>`
//! (a plugin that sets that header itself gets a permanent error naming
//! it). `send` blocks until the whole response body has arrived.
//!
//! Errors: a request the host refuses (host not allowed, bad URL, a header
//! only the host sets, too many requests for one message, body too large)
//! is [`Error::Permanent`];
//! every other failure (DNS, connect, TLS, timeout, reset) is
//! [`Error::Retryable`]. A response of any status is `Ok`: the status is
//! the plugin's to judge, or [`Response::error_for_status`]'s.
//!
//! A plugin that never calls this module imports no `wasi:http` interface:
//! the import functions are linked only when used.

use crate::Error;
use crate::wit::consumer_http::wasi::http::outgoing_handler;
use crate::wit::consumer_http::wasi::http::types::{
    ErrorCode, Fields, HeaderError, IncomingBody, Method, OutgoingBody, OutgoingRequest, Scheme,
};
use crate::wit::consumer_http::wasi::io::streams::StreamError;

/// The largest chunk `blocking-write-and-flush` accepts.
const WRITE_CHUNK: usize = 4096;
const READ_CHUNK: u64 = 64 * 1024;

/// A request being built: `http::post(url)`, then `.json(..)?`,
/// `.header(..)`, `.body(..)`, and `.send()`.
#[derive(Debug, Clone)]
pub struct Request {
    method: Method,
    url: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

/// A GET request to `url` (`http://` or `https://`).
pub fn get(url: impl Into<String>) -> Request {
    Request::new(Method::Get, url)
}

/// A POST request to `url`.
pub fn post(url: impl Into<String>) -> Request {
    Request::new(Method::Post, url)
}

/// A PUT request to `url`.
pub fn put(url: impl Into<String>) -> Request {
    Request::new(Method::Put, url)
}

/// A DELETE request to `url`.
pub fn delete(url: impl Into<String>) -> Request {
    Request::new(Method::Delete, url)
}

/// A complete response: the body has been read to its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// As received; names are lowercase.
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl Request {
    fn new(method: Method, url: impl Into<String>) -> Self {
        Self {
            method,
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// Adds a header (names are case-insensitive; a repeated name adds a value).
    pub fn header(mut self, name: impl Into<String>, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name.into(), value.as_ref().to_vec()));
        self
    }

    /// The raw request body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// A JSON body, with `Content-Type: application/json`.
    pub fn json<T: serde::Serialize + ?Sized>(self, value: &T) -> Result<Self, Error> {
        let body = serde_json::to_vec(value)?;
        Ok(self.header("content-type", "application/json").body(body))
    }

    /// Sends the request and waits for the whole response.
    pub fn send(self) -> Result<Response, Error> {
        let what = format!("{} {}", method_name(&self.method), self.url);
        let (scheme, authority, path) =
            split_url(&self.url).map_err(|e| Error::permanent(format!("http {what}: {e}")))?;
        send(&self, scheme, authority, &path).map_err(|e| e.context(&what))
    }
}

impl Response {
    /// The body as JSON; a body that is not `T` is a permanent error.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        Ok(serde_json::from_slice(&self.body)?)
    }

    /// The body as text.
    pub fn text(&self) -> Result<&str, Error> {
        Ok(core::str::from_utf8(&self.body)?)
    }

    /// The first value of a header (case-insensitive), as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        let (_, v) = self
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))?;
        core::str::from_utf8(v).ok()
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// `Ok(self)` for 1xx-3xx; a 4xx is permanent (the same request fails
    /// again), a 5xx or anything else retryable. The message names the
    /// status and the start of the body.
    pub fn error_for_status(self) -> Result<Self, Error> {
        if self.status < 400 {
            return Ok(self);
        }
        let body = String::from_utf8_lossy(&self.body[..self.body.len().min(200)]).into_owned();
        let message = format!("HTTP status {}: {body}", self.status);
        Err(if (400..500).contains(&self.status) {
            Error::Permanent(message)
        } else {
            Error::Retryable(message)
        })
    }
}

/// Why a send failed, before the URL is added to the message.
enum Failure {
    Refused(String),
    Transport(String),
}

impl Failure {
    fn context(self, what: &str) -> Error {
        match self {
            Failure::Refused(m) => Error::Permanent(format!("http {what}: refused: {m}")),
            Failure::Transport(m) => Error::Retryable(format!("http {what}: {m}")),
        }
    }
}

/// Refusals the same request gets again; everything else may pass later.
impl From<ErrorCode> for Failure {
    fn from(code: ErrorCode) -> Self {
        match code {
            ErrorCode::HttpRequestDenied
            | ErrorCode::HttpRequestUriInvalid
            | ErrorCode::HttpRequestBodySize(_)
            | ErrorCode::HttpRequestMethodInvalid => Failure::Refused(format!("{code:?}")),
            ErrorCode::InternalError(Some(m)) => Failure::Transport(m),
            other => Failure::Transport(format!("{other:?}")),
        }
    }
}

fn send(
    request: &Request,
    scheme: Scheme,
    authority: &str,
    path: &str,
) -> Result<Response, Failure> {
    let bad = |what: &str| Failure::Refused(format!("invalid {what}"));
    let headers = Fields::from_list(&request.headers).map_err(|e| match e {
        HeaderError::Forbidden => Failure::Refused(
            "a header only the host sets (the idempotency key, host, hop-by-hop headers)".into(),
        ),
        other => Failure::Refused(format!("invalid header: {other:?}")),
    })?;
    let outgoing = OutgoingRequest::new(headers);
    outgoing
        .set_method(&request.method)
        .map_err(|()| bad("method"))?;
    outgoing
        .set_scheme(Some(&scheme))
        .map_err(|()| bad("scheme"))?;
    outgoing
        .set_authority(Some(authority))
        .map_err(|()| bad("authority"))?;
    outgoing
        .set_path_with_query(Some(path))
        .map_err(|()| bad("path"))?;
    let body = outgoing.body().map_err(|()| bad("body"))?;

    // Handle first, then stream the body: the host reads it as it comes.
    let future = outgoing_handler::handle(outgoing, None)?;
    let sent = write_body(&body, &request.body)
        .and_then(|()| OutgoingBody::finish(body, None).map_err(Failure::from));

    // A request the host refused fails its future at once, and the body
    // stream then reads as closed: the future's error says why.
    future.subscribe().block();
    let response = match future.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(code))) => return Err(code.into()),
        Some(Err(())) => return Err(Failure::Transport("response already taken".into())),
        None => return Err(Failure::Transport("no response after the pollable was ready".into())),
    };
    sent?;
    let status = response.status();
    let headers = response.headers().entries(); // the child `fields` drops here
    let incoming = response
        .consume()
        .map_err(|()| Failure::Transport("no body".into()))?;
    let body = read_all(&incoming)?;
    drop(IncomingBody::finish(incoming));
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// Writes `bytes` to the request body; the stream (a child of the body)
/// is dropped before the body is finished.
fn write_body(body: &OutgoingBody, bytes: &[u8]) -> Result<(), Failure> {
    let stream = body.write().map_err(|()| Failure::Refused("invalid body stream".into()))?;
    for chunk in bytes.chunks(WRITE_CHUNK) {
        stream.blocking_write_and_flush(chunk).map_err(stream_failure)?;
    }
    Ok(())
}

fn read_all(incoming: &IncomingBody) -> Result<Vec<u8>, Failure> {
    let stream = incoming
        .stream()
        .map_err(|()| Failure::Transport("no body stream".into()))?;
    let mut body = Vec::new();
    loop {
        match stream.blocking_read(READ_CHUNK) {
            Ok(chunk) => body.extend_from_slice(&chunk),
            Err(StreamError::Closed) => return Ok(body),
            Err(e) => return Err(stream_failure(e)),
        }
    }
}

fn stream_failure(e: StreamError) -> Failure {
    match e {
        StreamError::Closed => Failure::Transport("stream closed early".into()),
        StreamError::LastOperationFailed(err) => {
            match crate::wit::consumer_http::wasi::http::types::http_error_code(&err) {
                Some(code) => code.into(),
                None => Failure::Transport(err.to_debug_string()),
            }
        }
    }
}

fn method_name(method: &Method) -> &str {
    match method {
        Method::Get => "GET",
        Method::Post => "POST",
        Method::Put => "PUT",
        Method::Delete => "DELETE",
        Method::Head => "HEAD",
        Method::Patch => "PATCH",
        Method::Options => "OPTIONS",
        Method::Connect => "CONNECT",
        Method::Trace => "TRACE",
        Method::Other(m) => m,
    }
}

/// `scheme://authority[/path][?query]` → its three parts; the path
/// defaults to `/`.
fn split_url(url: &str) -> Result<(Scheme, &str, String), String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| "the URL must start with http:// or https://".to_string())?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        other => return Err(format!("scheme `{other}` is not http or https")),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() || authority.contains('@') {
        return Err("the URL needs a host (and no user info)".into());
    }
    let path = path.split('#').next().unwrap_or_default();
    let path = match path {
        "" => "/".to_string(),
        p if p.starts_with('?') => format!("/{p}"),
        _ => path.to_string(),
    };
    Ok((scheme, authority, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_scheme_authority_and_path() {
        let (s, a, p) = split_url("https://api.example.com:8443/v1/charges?x=1#f").unwrap();
        assert!(matches!(s, Scheme::Https));
        assert_eq!((a, p.as_str()), ("api.example.com:8443", "/v1/charges?x=1"));
        let (_, a, p) = split_url("http://127.0.0.1:8080").unwrap();
        assert_eq!((a, p.as_str()), ("127.0.0.1:8080", "/"));
        assert!(split_url("ftp://x/").unwrap_err().contains("ftp"));
        assert!(split_url("example.com/x").is_err());
        assert!(split_url("http://user@host/").is_err());
    }
}
