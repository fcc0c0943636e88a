//! Hostile: the misbehaviours the other hostile plugins do not cover, one
//! per payload field, so one component exercises each sandbox wall.
//!
//! - `{"fork": D}`: fork-bomb-style recursion, every call makes two more
//!   down to depth `D` (2^D calls). A small `D` finishes; a large one runs
//!   into the call deadline.
//! - `{"recurse": N}`: plain recursion `N` frames deep, each with a frame
//!   the optimiser cannot remove. A huge `N` overflows the wasm stack.
//! - `{"host_calls": N}`: calls the `config.get` import `N` times; `null`
//!   calls it forever.
//! - `{"topic": "t", "key": "k"}`: re-keys the event onto another topic;
//!   `{"key_bytes": [255, 0]}` re-keys it with a key that is not UTF-8 (keys
//!   are `list<u8>`, so that is allowed).
//! - `{"bad_utf8": "topic" | "header"}`: returns a topic or a header value
//!   that is not UTF-8 (see [`not_utf8`]).
//! - `{"trace": "drop"}` drops the trace context headers; `{"trace": V}`
//!   replaces `traceparent` with `V` (a forged trace).
//!
//! Without any of them it forwards the event.

use outboxd_guest::{Event, Message, Result, Transformer, config};
use serde::Deserialize;

#[derive(Deserialize, Default)]
#[serde(default)]
struct Input {
    fork: Option<u32>,
    recurse: Option<u64>,
    /// `Some(None)` is an explicit `null`: call forever.
    #[serde(deserialize_with = "present")]
    host_calls: Option<Option<u64>>,
    topic: Option<String>,
    key: Option<String>,
    key_bytes: Option<Vec<u8>>,
    bad_utf8: Option<String>,
    trace: Option<String>,
}

fn present<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Option<u64>>, D::Error> {
    Option::<u64>::deserialize(d).map(Some)
}

/// 2^depth calls, none of which the optimiser may fold away.
fn fork(depth: u32) -> u64 {
    if depth == 0 {
        return std::hint::black_box(1);
    }
    std::hint::black_box(fork(depth - 1)) + std::hint::black_box(fork(depth - 1))
}

/// `n` nested frames of 1 KiB each.
fn recurse(n: u64) -> u64 {
    let frame = std::hint::black_box([n as u8; 1024]);
    if n == 0 {
        return u64::from(frame[0]);
    }
    recurse(n - 1) + u64::from(std::hint::black_box(frame)[1023])
}

/// A `String` holding bytes that are not UTF-8. Safe Rust cannot make one,
/// and the WIT type of topics and header values is `string`, which the
/// canonical ABI requires to be valid UTF-8; a hostile guest ignores both.
/// The generated bindings lower the bytes as they are, so this is exactly
/// what a hand-written export could put across the boundary.
fn not_utf8() -> String {
    let bytes = vec![b'o', b'r', b'd', 0xFF, 0xFE, b's'];
    // SAFETY: deliberately unsound; the string is only handed to the host,
    // whose canonical-ABI lift must refuse it. No guest code reads it.
    #[allow(
        unsafe_code,
        reason = "a hostile plugin: the invalid string is the test"
    )]
    unsafe {
        String::from_utf8_unchecked(bytes)
    }
}

struct Misbehave;

impl Transformer for Misbehave {
    fn transform(event: Event) -> Result<Vec<Message>> {
        let input: Input = event.json()?;
        let mut msg = event.forward();
        if let Some(depth) = input.fork {
            msg = msg.with_header("fork-calls", fork(depth).to_string());
        }
        if let Some(n) = input.recurse {
            msg = msg.with_header("recursed", recurse(n).to_string());
        }
        if let Some(limit) = input.host_calls {
            let mut calls = 0u64;
            while limit.is_none_or(|n| calls < n) {
                std::hint::black_box(config::get("anything"));
                calls += 1;
            }
            msg = msg.with_header("host-calls", calls.to_string());
        }
        if let Some(topic) = input.topic {
            msg = msg.with_topic(topic);
        }
        if let Some(key) = input.key {
            msg = msg.with_key(key.into_bytes());
        }
        if let Some(key) = input.key_bytes {
            msg = msg.with_key(key);
        }
        match input.bad_utf8.as_deref() {
            Some("topic") => msg.topic = Some(not_utf8()),
            Some("header") => msg.headers.push(("x-bad".into(), not_utf8())),
            _ => {}
        }
        match input.trace.as_deref() {
            Some("drop") => msg
                .headers
                .retain(|(k, _)| k != "traceparent" && k != "tracestate"),
            Some(forged) => {
                msg.headers.retain(|(k, _)| k != "traceparent");
                msg.headers.push(("traceparent".into(), forged.into()));
            }
            None => {}
        }
        Ok(vec![msg])
    }
}

outboxd_guest::export_transformer!(Misbehave);
