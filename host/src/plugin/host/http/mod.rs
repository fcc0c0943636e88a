//! `wasi:http/outgoing-handler` for consumer plugins: the host sends every
//! request itself. Shaped like the other capabilities: [`HttpState`] in
//! the Store, the view wasmtime's bindings need ([`WasiHttpView`]), and
//! [`add_to_linker`]. Only the consumer's Linker has it.
//!
//! A request is checked in this order, and refused at the first failure,
//! before any connection is opened: a call is in progress with a policy
//! that lists hosts; the message's request count is under
//! `max_requests_per_message`; scheme, host and port are a listed entry
//! ([`policy`]); the body is within `max_request_bytes`; the resolved
//! address is not special unless listed literally. Then the audit intent
//! is committed, the host connects to the checked address, and the answer
//! is read whole within `request_timeout` and `max_response_bytes`. The
//! plugin's own idempotency header, in any case, cannot be set: the name
//! is forbidden in its `fields`, and the host overwrites it with the
//! message id. Redirects are not followed by the host.

pub mod policy;
pub mod record;
pub mod transport;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http::HeaderValue;
use http::header::HOST;
use http_body_util::{BodyExt, Full};
use wasmtime::component::Linker;
use wasmtime_wasi_http::{
    DEFAULT_FORBIDDEN_HEADERS, Error as HttpError, ForbiddenHeaderFilter, RequestOptions, WasiBody,
    WasiHttpCtx, WasiHttpHooks, WasiHttpView,
};

pub use self::policy::OutboundPolicy;
pub use self::record::HttpRecord;
use self::transport::SendError;
pub use self::transport::{HttpStub, StubResponse, Transport};
use crate::plugin::error::PluginError;

/// What one `handle` call's requests run under: set before the call,
/// taken back after it ([`HttpState::begin`], [`HttpState::finish`]).
#[derive(Debug, Clone)]
pub struct HttpCall {
    pub policy: Arc<OutboundPolicy>,
    /// The message id: the idempotency header's value. For a split or
    /// emitted message, that message's own id.
    pub message_id: String,
    /// The consumer's name, for the audit.
    pub consumer: String,
    /// `NAME@VERSION`, for the audit and metrics.
    pub plugin: String,
    pub transport: Transport,
    /// Where live requests' intents are committed before they are sent.
    /// `None` refuses live requests: no request leaves without its record.
    pub audit: Option<crate::store::Db>,
}

/// The HTTP capability of a consumer's Store.
pub struct HttpState {
    ctx: WasiHttpCtx,
    hooks: Hooks,
}

impl Default for HttpState {
    fn default() -> Self {
        Self {
            ctx: WasiHttpCtx::new(),
            hooks: Hooks::default(),
        }
    }
}

impl HttpState {
    /// Arms the capability for one `handle` call.
    pub fn begin(&mut self, call: HttpCall) {
        self.hooks = Hooks {
            call: Some(Arc::new(call)),
            live: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            ..Hooks::default()
        };
    }

    /// Disarms it and returns every request of the call, in order. A
    /// request still in flight (the plugin did not wait for it) shows no
    /// outcome.
    pub fn finish(&mut self) -> Vec<HttpRecord> {
        self.hooks
            .live
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let log = std::mem::take(&mut self.hooks.log);
        self.hooks = Hooks::default();
        log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// The view wasmtime's `wasi:http` bindings take.
    pub fn view<'a>(
        &'a mut self,
        table: &'a mut wasmtime::component::ResourceTable,
    ) -> wasmtime_wasi_http::WasiHttpCtxView<'a> {
        wasmtime_wasi_http::WasiHttpCtxView {
            ctx: &mut self.ctx,
            table,
            hooks: &mut self.hooks,
        }
    }
}

/// Links `wasi:http/outgoing-handler` and `wasi:http/types` (WASI's io and
/// clocks come from the sandbox's Linker).
pub fn add_to_linker<T: WasiHttpView + 'static>(linker: &mut Linker<T>) -> Result<(), PluginError> {
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)
        .map_err(|e| PluginError::Invalid(format!("cannot link wasi:http: {e}")))
}

#[derive(Default)]
struct Hooks {
    call: Option<Arc<HttpCall>>,
    /// Requests this call has started (refused ones included).
    started: u32,
    log: Arc<Mutex<Vec<HttpRecord>>>,
    /// True while the `handle` call runs: a request the plugin left in
    /// flight is not sent once the call has returned.
    live: Arc<std::sync::atomic::AtomicBool>,
}

type SendFuture = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), HttpError>> + Send>,
                ),
                HttpError,
            >,
        > + Send,
>;

impl WasiHttpHooks for Hooks {
    fn forbidden_header_filter(&mut self) -> ForbiddenHeaderFilter {
        let own = self.call.as_ref().map(|c| c.policy.header.clone());
        Arc::new(move |name| DEFAULT_FORBIDDEN_HEADERS.contains(name) || own.as_ref() == Some(name))
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        _options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> SendFuture {
        let start = Instant::now();
        let url = request.uri().to_string();
        let index = push(&self.log, HttpRecord::new(request.method().as_str(), &url));
        let log = self.log.clone();
        let refuse = move |why: String| -> SendFuture {
            tracing::warn!(url = %url, reason = %why, "plugin HTTP request refused");
            update(&log, index, |r| {
                r.refused = true;
                r.error = Some(why);
                r.duration = start.elapsed();
            });
            Box::new(async { Err(HttpError::HttpRequestDenied) })
        };
        let Some(call) = self.call.clone() else {
            return refuse("an HTTP request outside a handle call".into());
        };
        if !call.policy.is_enabled() {
            return refuse(format!(
                "this plugin has no network: {} is empty",
                call.policy.key
            ));
        }
        self.started += 1;
        let max = call.policy.limits.max_requests_per_message;
        if self.started > max {
            return refuse(format!(
                "request {} of this message: plugins[].http.max_requests_per_message is {max}",
                self.started
            ));
        }
        let target = match call.policy.admit(request.uri()) {
            Ok(t) => t,
            Err(why) => return refuse(why),
        };
        let log = self.log.clone();
        let live = self.live.clone();
        Box::new(async move {
            let result = send(&call, &target, request, &log, index, &live).await;
            update(&log, index, |r| {
                r.duration = start.elapsed();
                match &result {
                    Ok(resp) => {
                        r.status = Some(resp.status().as_u16());
                        r.response_headers = transport::header_pairs(resp.headers());
                        r.response_body = resp.body().to_vec();
                    }
                    Err(e) => {
                        r.refused = matches!(e, SendError::Refused(_));
                        r.error = Some(e.to_string());
                    }
                }
            });
            let response = result.map_err(|e| {
                tracing::warn!(plugin = %call.plugin, error = %e, "plugin HTTP request failed");
                match e {
                    SendError::Refused(_) => HttpError::HttpRequestDenied,
                    SendError::ResponseTooLarge(n) => HttpError::HttpResponseBodySize(Some(n)),
                    SendError::Timeout(..) => HttpError::ConnectionTimeout,
                    SendError::Failed(m) => HttpError::InternalError(Some(m)),
                }
            })?;
            let response =
                response.map(|b| Full::new(b).map_err(|never| match never {}).boxed_unsync());
            let io: Box<dyn Future<Output = Result<(), HttpError>> + Send> =
                Box::new(async { Ok(()) });
            Ok((response, io))
        })
    }
}

/// The admitted request's way to an answer: final headers, body within
/// its cap, then the stub or the audited network.
async fn send(
    call: &HttpCall,
    target: &policy::Target,
    request: http::Request<WasiBody>,
    log: &Arc<Mutex<Vec<HttpRecord>>>,
    index: usize,
    live: &std::sync::atomic::AtomicBool,
) -> Result<http::Response<Bytes>, SendError> {
    let ended = || {
        SendError::Refused(
            "the handle call that made this request has returned; the request is not sent".into(),
        )
    };
    let limits = &call.policy.limits;
    let (mut parts, body) = request.into_parts();
    // The plugin cannot name this header (it is forbidden in its fields);
    // remove it anyway, every case variant being one HeaderName.
    parts.headers.remove(&call.policy.header);
    let key = HeaderValue::from_str(&call.message_id)
        .map_err(|_| SendError::Refused("the message id is not a header value".into()))?;
    parts.headers.insert(call.policy.header.clone(), key);
    let entry = &target.entry;
    let authority = entry.authority();
    parts.headers.insert(
        HOST,
        HeaderValue::from_str(&authority).map_err(|_| SendError::Refused("bad host".into()))?,
    );
    let body = read_request_body(body, limits.max_request_bytes, limits.request_timeout).await?;
    // The framing is the host's: the body is whole, so its length is known.
    parts.headers.remove(http::header::TRANSFER_ENCODING);
    parts.headers.insert(
        http::header::CONTENT_LENGTH,
        HeaderValue::from(body.len() as u64),
    );
    update(log, index, |r| {
        r.headers = transport::header_pairs(&parts.headers);
        r.body = body.to_vec();
    });
    if let Transport::Shadow = &call.transport {
        return Err(SendError::Refused(
            "a shadow run or dry run sends no HTTP request (it must have no external effect)"
                .into(),
        ));
    }
    if let Transport::Stub(stub) = &call.transport {
        update(log, index, |r| r.stubbed = true);
        let url = log.lock().map(|l| l[index].url.clone()).unwrap_or_default();
        let answer = stub.answer(parts.method.as_str(), &url).ok_or_else(|| {
            SendError::Failed(format!("no stub response matches {} {url}", parts.method))
        })?;
        return transport::stub_response(answer, limits.max_response_bytes);
    }
    let Some(db) = &call.audit else {
        return Err(SendError::Refused(
            "live requests need the audit database; none was given to this call".into(),
        ));
    };
    let addr = transport::resolve(&call.policy, entry).await?;
    if !live.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ended());
    }
    let audit_id = crate::store::inbox::outbound::write_intent(
        db,
        &crate::store::inbox::outbound::Intent {
            message_id: &call.message_id,
            consumer: &call.consumer,
            plugin: &call.plugin,
            method: parts.method.as_str(),
            scheme: entry.scheme.as_str(),
            host: &entry.host,
            port: entry.port,
            path: &target.path,
        },
    )
    .await
    .map_err(|e| {
        SendError::Refused(format!(
            "the audit intent could not be written, the request is not sent: {e}"
        ))
    })?;
    update(log, index, |r| r.audit_id = Some(audit_id));
    if !live.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ended());
    }
    parts.uri = target
        .path
        .parse()
        .map_err(|_| SendError::Refused(format!("bad path {}", target.path)))?;
    let request = http::Request::from_parts(parts, Full::new(body));
    transport::send_live(&call.policy, entry, addr, request).await
}

async fn read_request_body(
    mut body: WasiBody,
    cap: u64,
    timeout: std::time::Duration,
) -> Result<Bytes, SendError> {
    let mut out = Vec::new();
    loop {
        let frame = tokio::time::timeout(timeout, body.frame())
            .await
            .map_err(|_| SendError::Timeout(timeout, "waiting for the plugin's request body"))?;
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| SendError::Failed(format!("the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if out.len() as u64 + data.len() as u64 > cap {
                return Err(SendError::Refused(format!(
                    "the request body is larger than plugins[].http.max_request_bytes ({cap})"
                )));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(out))
}

fn push(log: &Arc<Mutex<Vec<HttpRecord>>>, r: HttpRecord) -> usize {
    let mut l = log.lock().unwrap_or_else(|p| p.into_inner());
    l.push(r);
    l.len() - 1
}

fn update(log: &Arc<Mutex<Vec<HttpRecord>>>, index: usize, f: impl FnOnce(&mut HttpRecord)) {
    let mut l = log.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = l.get_mut(index) {
        f(r);
    }
}
