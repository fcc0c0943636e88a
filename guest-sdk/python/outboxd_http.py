"""Blocking HTTP for outboxd consumer plugins in Python (world consumer-http),
over wasi:http/outgoing-handler. The host sends the request: only to the
plugin's allowed_outbound_hosts, with the Idempotency-Key header set to the
message id.

    res = outboxd_http.post(url, json={"amount_cents": 500})
    if res.status >= 500:
        raise outboxd_guest.retryable(f"provider answered {res.status}")
    charge = res.json()

A transport failure or a refusal raises HttpError naming the URL.
"""

import json as _json
from urllib.parse import urlsplit

from componentize_py_types import Err, Ok
from wit_world.imports import outgoing_handler
from wit_world.imports import streams
from wit_world.imports import wasi_http_types as t

_METHODS = {"GET": t.Method_Get, "POST": t.Method_Post, "PUT": t.Method_Put,
            "DELETE": t.Method_Delete, "PATCH": t.Method_Patch, "HEAD": t.Method_Head}


class HttpError(Exception):
    """The request was refused or failed before an answer arrived."""


class Response:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return _json.loads(self.body)


def _settled(result, url):
    while isinstance(result, (Ok, Err)):
        if isinstance(result, Err):
            raise HttpError(f"{url}: {result.value}")
        result = result.value
    return result


def request(method, url, *, json=None, data=b"", headers=None):
    """Sends one request and returns a Response (status, headers, body)."""
    parts = urlsplit(url)
    entries = [(k.lower(), str(v).encode()) for k, v in (headers or {}).items()]
    if json is not None:
        data = _json.dumps(json).encode()
        if not any(k == "content-type" for k, _ in entries):
            entries.append(("content-type", b"application/json"))
    req = t.OutgoingRequest(t.Fields.from_list(entries))
    req.set_method(_METHODS[method.upper()]())
    req.set_scheme(t.Scheme_Https() if parts.scheme == "https" else t.Scheme_Http())
    req.set_authority(parts.netloc)
    req.set_path_with_query((parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
    body = req.body()
    try:
        # The request goes first; the body follows, streamed to the host.
        future = outgoing_handler.handle(req, None)
        if data:
            with body.write() as out:
                for i in range(0, len(data), 4096):
                    out.blocking_write_and_flush(data[i:i + 4096])
        t.OutgoingBody.finish(body, None)
    except Err as e:
        raise HttpError(f"{method.upper()} {url}: {e.value}") from None
    with future:
        response = _settled(future.get(), url)
        while response is None:
            with future.subscribe() as ready:
                ready.block()
            response = _settled(future.get(), url)
    with response:
        status = response.status()
        with response.headers() as fields:
            headers_out = {k: v.decode(errors="replace") for k, v in fields.entries()}
        incoming = response.consume()
        chunks = []
        with incoming.stream() as stream:
            while True:
                try:
                    chunks.append(stream.blocking_read(65536))
                except Err as e:
                    if isinstance(e.value, streams.StreamError_Closed):
                        break
                    raise HttpError(f"{url}: reading the response: {e.value}") from None
        with t.IncomingBody.finish(incoming):
            pass
    return Response(status, headers_out, b"".join(chunks))


def get(url, **kwargs):
    return request("GET", url, **kwargs)


def post(url, **kwargs):
    return request("POST", url, **kwargs)
