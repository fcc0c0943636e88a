//! Hostile: a consumer-http plugin that makes whatever HTTP requests the
//! message carries, as an attacker who controls the plugin would: hosts
//! off the allow-list, other ports and schemes, its own idempotency header
//! (in every case spelling, by `from-list`, `set`, `append`, and deleting
//! it), oversized bodies, more requests than allowed. It ignores every
//! refusal and returns ok, so only the host can stop it; the tests read
//! what reached their server and what the host recorded.
//!
//! Payload: `{"requests": [{"method": "POST", "url": "http://h:p/path",
//! "body_bytes": 0, "key": "evil"}], "sql": "..."}`. With `key`, every
//! header trick is tried with that value. With `sql`, the statement is
//! run with `query` (and its refusal ignored).

use serde::Deserialize;

wit_bindgen::generate!({
    world: "consumer-http",
    path: "../../../wit",
    generate_all,
});

use outbox::plugin::transaction::Value;
use wasi::http::outgoing_handler;
use wasi::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};

#[derive(Deserialize, Default)]
#[serde(default)]
struct Input {
    requests: Vec<Req>,
    sql: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Req {
    method: String,
    url: String,
    body_bytes: usize,
    key: Option<String>,
}

struct Hostile;

impl Guest for Hostile {
    fn handle(tx: &Transaction, message: Message) -> Result<(), PluginError> {
        let input: Input = serde_json::from_slice(&message.payload).unwrap_or_default();
        if let Some(sql) = input.sql {
            let _ignored = tx.query(&sql, &Vec::<Value>::new());
        }
        for r in input.requests {
            let _ignored = send(&r);
        }
        Ok(())
    }
}

/// One request; every error is returned and ignored by the caller.
fn send(r: &Req) -> Result<u16, String> {
    let headers = match &r.key {
        Some(key) => {
            // Every way to name the header: refused or not, keep going.
            let _ = Fields::from_list(&[("Idempotency-Key".into(), key.as_bytes().to_vec())]);
            let f = Fields::new();
            for name in ["Idempotency-Key", "idempotency-key", "IDEMPOTENCY-KEY", "iDeMpOtEnCy-KeY"] {
                let _ = f.set(name, &[key.as_bytes().to_vec()]);
                let _ = f.append(name, key.as_bytes());
            }
            let _ = f.delete("Idempotency-Key");
            let _ = f.append("x-attacker", key.as_bytes());
            f
        }
        None => Fields::new(),
    };
    let request = OutgoingRequest::new(headers);
    let method = match r.method.to_ascii_uppercase().as_str() {
        "GET" | "" => Method::Get,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        other => Method::Other(other.to_string()),
    };
    let _ = request.set_method(&method);
    let (scheme, rest) = r.url.split_once("://").unwrap_or(("https", &r.url));
    let scheme = match scheme {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        other => Scheme::Other(other.to_string()),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let _ = request.set_scheme(Some(&scheme));
    let _ = request.set_authority(Some(authority));
    let _ = request.set_path_with_query(Some(path));
    let body = request.body().map_err(|()| "body taken".to_string())?;
    let future = outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
    {
        let out = body.write().map_err(|()| "no stream".to_string())?;
        let chunk = vec![b'x'; 4096];
        let mut left = r.body_bytes;
        while left > 0 {
            let n = left.min(chunk.len());
            if out.blocking_write_and_flush(&chunk[..n]).is_err() {
                break;
            }
            left -= n;
        }
    }
    let _ = OutgoingBody::finish(body, None);
    future.subscribe().block();
    let response = future
        .get()
        .ok_or("no response")?
        .map_err(|()| "taken".to_string())?
        .map_err(|e| format!("{e:?}"))?;
    let status = response.status();
    if let Ok(body) = response.consume() {
        if let Ok(stream) = body.stream() {
            while stream.blocking_read(65536).is_ok() {}
        }
    }
    Ok(status)
}

export!(Hostile);
