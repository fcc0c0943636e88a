//! Wraps each event in a CloudEvents 1.0 JSON envelope (structured mode).
//!
//! Config: `source` (default `outboxd`). The payload must be JSON; it is
//! embedded as `data` without being re-serialised. `traceparent` travels
//! both as a header and as the distributed-tracing extension attribute.

use std::sync::OnceLock;

use outboxd_guest::{Event, Message, Result, Transformer, config};
use serde::Serialize;
use serde_json::value::RawValue;

#[derive(Serialize)]
struct Envelope<'a> {
    specversion: &'static str,
    id: &'a str,
    source: &'a str,
    #[serde(rename = "type")]
    ty: &'a str,
    subject: &'a str,
    time: &'a str,
    datacontenttype: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<&'a str>,
    data: &'a RawValue,
}

fn source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    SOURCE.get_or_init(|| config::get("source").unwrap_or_else(|| "outboxd".into()))
}

struct CloudEvents;

impl Transformer for CloudEvents {
    fn transform(event: Event) -> Result<Vec<Message>> {
        let data: &RawValue = serde_json::from_slice(&event.payload)?;
        let envelope = Envelope {
            specversion: "1.0",
            id: &event.id,
            source: source(),
            ty: &event.event_type,
            subject: &event.aggregate_id,
            time: &event.created_at,
            datacontenttype: "application/json",
            traceparent: event.header("traceparent"),
            data,
        };
        let payload = serde_json::to_vec(&envelope)?;
        Ok(vec![event.forward().with_payload(payload).with_header(
            "content-type",
            "application/cloudevents+json",
        )])
    }
}

outboxd_guest::export_transformer!(CloudEvents);
