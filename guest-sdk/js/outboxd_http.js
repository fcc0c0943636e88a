// Blocking HTTP for outboxd consumer plugins in JavaScript (world
// consumer-http), over wasi:http/outgoing-handler. The host sends the
// request: only to the plugin's allowed_outbound_hosts, with the
// Idempotency-Key header set to the message id.
//
//   const res = post(url, { json: { amount_cents: 500 } });
//   if (res.status >= 500) throw retryable(`provider answered ${res.status}`);
//   const charge = res.json();
//
// A transport failure or a refusal throws an HttpError naming the URL.
import { handle as send } from "wasi:http/outgoing-handler@0.2.12";
import { Fields, OutgoingBody, OutgoingRequest } from "wasi:http/types@0.2.12";

export class HttpError extends Error {
  name = "HttpError";
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

function errorText(e) {
  const p = e?.payload ?? e;
  if (p && typeof p === "object" && "tag" in p) {
    return p.val === undefined ? p.tag : `${p.tag}: ${JSON.stringify(p.val, (_, v) => (typeof v === "bigint" ? Number(v) : v))}`;
  }
  return String(e?.message ?? e);
}

/** Unwraps the `option<result<result<T, error-code>>>` of a future's get(). */
function settled(r, url) {
  while (r && typeof r === "object" && (r.tag === "ok" || r.tag === "err")) {
    if (r.tag === "err") throw new HttpError(`${url}: ${errorText(r.val)}`);
    r = r.val;
  }
  return r;
}

/** Sends one request and returns { status, headers, body, text(), json() }. */
export function request(method, url, { json, body, headers = {} } = {}) {
  const u = new URL(url);
  const entries = Object.entries(headers).map(([k, v]) => [k.toLowerCase(), encoder.encode(String(v))]);
  if (json !== undefined) {
    body = JSON.stringify(json);
    if (!entries.some(([k]) => k === "content-type")) entries.push(["content-type", encoder.encode("application/json")]);
  }
  const bytes = typeof body === "string" ? encoder.encode(body) : body;
  const req = new OutgoingRequest(Fields.fromList(entries));
  req.setMethod({ tag: method.toLowerCase() });
  req.setScheme({ tag: u.protocol === "https:" ? "HTTPS" : "HTTP" });
  req.setAuthority(u.host);
  req.setPathWithQuery(u.pathname + u.search);
  const out = req.body();
  let future;
  try {
    // The request goes first; the body follows, streamed to the host.
    future = send(req, undefined);
    if (bytes && bytes.length > 0) {
      const stream = out.write();
      for (let i = 0; i < bytes.length; i += 4096) stream.blockingWriteAndFlush(bytes.subarray(i, i + 4096));
      stream[Symbol.dispose]();
    }
    OutgoingBody.finish(out, undefined);
  } catch (e) {
    throw new HttpError(`${method.toUpperCase()} ${url}: ${errorText(e)}`);
  }
  let response = settled(future.get(), url);
  while (response === undefined) {
    future.subscribe().block();
    response = settled(future.get(), url);
  }
  const status = response.status();
  const headersOut = {};
  for (const [k, v] of response.headers().entries()) headersOut[k] = decoder.decode(v);
  const incoming = response.consume();
  const input = incoming.stream();
  const chunks = [];
  for (;;) {
    try {
      chunks.push(input.blockingRead(65536n));
    } catch (e) {
      if (e?.payload?.tag === "closed") break;
      throw new HttpError(`${url}: reading the response: ${errorText(e)}`);
    }
  }
  input[Symbol.dispose]();
  const all = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.length;
  }
  return {
    status,
    headers: headersOut,
    body: all,
    text: () => decoder.decode(all),
    json: () => JSON.parse(decoder.decode(all)),
  };
}

export const get = (url, options) => request("get", url, options);
export const post = (url, options) => request("post", url, options);
