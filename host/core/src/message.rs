//! Broker messages as the host builds and reads them: the headers only the
//! host sets, the message an event (or a plugin's output) becomes, and the
//! message id a consumer deduplicates on.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::event::OutboxEvent;
use crate::route::Router;

/// Header names the relay sets on every message.
pub mod headers {
    pub const MESSAGE_ID: &str = "message-id";
    pub const EVENT_TYPE: &str = "event-type";
    pub const AGGREGATE_ID: &str = "aggregate-id";
    pub const CREATED_AT: &str = "created-at";
    /// The names above: set by the host only, never copied from an event
    /// or a plugin.
    pub const HOST_SET: [&str; 4] = [MESSAGE_ID, EVENT_TYPE, AGGREGATE_ID, CREATED_AT];
}

/// The W3C trace context headers: which trace a message belongs to, and
/// the span it continues.
pub const TRACE_HEADERS: [&str; 2] = ["traceparent", "tracestate"];

/// Puts the event's own trace context back on a transformer's output: a
/// plugin may neither drop it nor replace it with another (forged) one,
/// unless its route sets `plugins_may_set_trace`. An event without a trace
/// context gives outputs none.
pub fn keep_event_trace(
    event_headers: &std::collections::BTreeMap<String, String>,
    output_headers: &mut Vec<(String, String)>,
) {
    output_headers.retain(|(k, _)| !TRACE_HEADERS.contains(&k.as_str()));
    for name in TRACE_HEADERS {
        if let Some(v) = event_headers.get(name) {
            output_headers.push((name.to_string(), v.clone()));
        }
    }
}

/// Split outputs carry the outbox id they came from in this header.
pub const SOURCE_ID_HEADER: &str = "source-message-id";

/// Headers a plugin output never sets: the host's, and the split source.
const RESERVED: [&str; 5] = [
    headers::MESSAGE_ID,
    headers::EVENT_TYPE,
    headers::AGGREGATE_ID,
    headers::CREATED_AT,
    SOURCE_ID_HEADER,
];

/// A message ready for the broker.
#[derive(Debug, Clone, PartialEq)]
pub struct OutgoingMessage {
    pub topic: String,
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
    /// The outbox id (or a deterministic id derived from it).
    pub message_id: Uuid,
    pub created_at: DateTime<Utc>,
}

impl OutgoingMessage {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// A message as a consumer receives it.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
    /// Failed attempts at this message so far in this consumer (0 on the
    /// first delivery). The runner sets it; sources leave it 0.
    pub attempt: u32,
}

impl Delivery {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The message id the inbox deduplicates on.
    pub fn message_id(&self) -> Result<Uuid, String> {
        let raw = self.header(headers::MESSAGE_ID).ok_or_else(|| {
            format!(
                "{}/{}@{}: no `{}` header; only messages published by outboxd (or carrying that header) can be deduplicated",
                self.topic, self.partition, self.offset, headers::MESSAGE_ID
            )
        })?;
        let text = std::str::from_utf8(raw).map_err(|_| {
            format!(
                "{}/{}@{}: `{}` header is not UTF-8",
                self.topic,
                self.partition,
                self.offset,
                headers::MESSAGE_ID
            )
        })?;
        Uuid::parse_str(text).map_err(|e| {
            format!(
                "{}/{}@{}: `{}` header `{text}` is not a uuid ({e})",
                self.topic,
                self.partition,
                self.offset,
                headers::MESSAGE_ID
            )
        })
    }
}

/// One message a transformer returned: the plain mirror of the WIT
/// `outgoing-message`, which the host converts into this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestMessage {
    /// `None` keeps the topic of the event's route.
    pub topic: Option<String>,
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, String)>,
}

/// The message for an event on the plain path (no transformers): keyed by
/// aggregate, carrying the message id, type, aggregate and creation time
/// first, then every event header except those four names, so a producer
/// header cannot stand in for the host's message id.
pub fn message_for_event(router: &Router, ev: &OutboxEvent) -> OutgoingMessage {
    let mut hdrs = Vec::with_capacity(4 + ev.headers.len());
    hdrs.push((
        headers::MESSAGE_ID.to_string(),
        ev.id.0.to_string().into_bytes(),
    ));
    hdrs.push((
        headers::EVENT_TYPE.to_string(),
        ev.event_type.clone().into_bytes(),
    ));
    hdrs.push((
        headers::AGGREGATE_ID.to_string(),
        ev.aggregate_id.clone().into_bytes(),
    ));
    hdrs.push((
        headers::CREATED_AT.to_string(),
        ev.created_at.to_rfc3339().into_bytes(),
    ));
    for (k, v) in &ev.headers {
        if !headers::HOST_SET.contains(&k.as_str()) {
            hdrs.push((k.clone(), v.clone().into_bytes()));
        }
    }
    OutgoingMessage {
        topic: router.topic_for(&ev.event_type).to_string(),
        key: ev.aggregate_id.clone().into_bytes(),
        payload: ev.payload.clone().into_bytes(),
        headers: hdrs,
        message_id: ev.id.0,
        created_at: ev.created_at,
    }
}

/// The id of output `index` of a transform: output 0 keeps the outbox id,
/// and output `i ≥ 1` gets the v5 uuid named by `i` in the outbox id's
/// namespace. The id never depends on how many outputs there are, so a
/// republish after a rollout that changed the count (a plugin that now
/// splits, or no longer does) keeps the ids a consumer already has.
pub fn output_message_id(source: Uuid, index: usize) -> Uuid {
    if index == 0 {
        source
    } else {
        Uuid::new_v5(&source, index.to_string().as_bytes())
    }
}

/// Output `index` of `count` that a chain made from `ev`, as a broker
/// message: the id is [`output_message_id`], the host's headers come first,
/// and a plugin header with a host name is dropped (a plugin cannot forge
/// them).
pub fn plugin_message(
    ev: &OutboxEvent,
    route_topic: &str,
    m: GuestMessage,
    index: usize,
    count: usize,
) -> OutgoingMessage {
    let id = output_message_id(ev.id.0, index);
    let mut hdrs = Vec::with_capacity(5 + m.headers.len());
    hdrs.push((headers::MESSAGE_ID.to_string(), id.to_string().into_bytes()));
    hdrs.push((
        headers::EVENT_TYPE.to_string(),
        ev.event_type.clone().into_bytes(),
    ));
    hdrs.push((
        headers::AGGREGATE_ID.to_string(),
        ev.aggregate_id.clone().into_bytes(),
    ));
    hdrs.push((
        headers::CREATED_AT.to_string(),
        ev.created_at.to_rfc3339().into_bytes(),
    ));
    if count > 1 {
        hdrs.push((
            SOURCE_ID_HEADER.to_string(),
            ev.id.0.to_string().into_bytes(),
        ));
    }
    // A plugin cannot forge the host's headers.
    for (k, v) in m.headers {
        if !RESERVED.contains(&k.as_str()) {
            hdrs.push((k, v.into_bytes()));
        }
    }
    OutgoingMessage {
        topic: m.topic.unwrap_or_else(|| route_topic.to_string()),
        key: m.key,
        payload: m.payload,
        headers: hdrs,
        message_id: id,
        created_at: ev.created_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_ids_do_not_depend_on_how_many_outputs_there_are() {
        let source = Uuid::new_v4();
        assert_eq!(output_message_id(source, 0), source);
        assert_eq!(
            output_message_id(source, 2),
            Uuid::new_v5(&source, b"2"),
            "output i >= 1 is uuid_v5(outbox id, i)"
        );
        let ev = OutboxEvent {
            seq: 1,
            id: crate::event::EventId(source),
            aggregate_id: "a".into(),
            event_type: "t".into(),
            payload: "{}".into(),
            headers: Default::default(),
            created_at: chrono::Utc::now(),
            attempts: 0,
            redrive_with: None,
        };
        let out = |index, count| {
            let m = GuestMessage {
                topic: None,
                key: b"a".to_vec(),
                payload: Vec::new(),
                headers: Vec::new(),
            };
            plugin_message(&ev, "t", m, index, count).message_id
        };
        // One output before a rollout, three after it (or the other way).
        assert_eq!(out(0, 1), out(0, 3));
        assert_eq!(out(0, 1), source);
        assert_eq!(out(1, 2), out(1, 3));
    }

    #[test]
    fn a_producer_header_cannot_replace_the_message_id() {
        let id = crate::event::EventId(uuid::Uuid::new_v4());
        let forged = uuid::Uuid::new_v4().to_string();
        let ev = OutboxEvent {
            seq: 1,
            id,
            aggregate_id: "a".into(),
            event_type: "order.confirmed".into(),
            payload: "{}".into(),
            headers: [
                (headers::MESSAGE_ID.to_string(), forged.clone()),
                ("traceparent".to_string(), "00-1".to_string()),
            ]
            .into(),
            created_at: chrono::Utc::now(),
            attempts: 0,
            redrive_with: None,
        };
        let msg = message_for_event(&Router::new(Vec::new()), &ev);
        let ids: Vec<&[u8]> = msg
            .headers
            .iter()
            .filter(|(k, _)| k == headers::MESSAGE_ID)
            .map(|(_, v)| v.as_slice())
            .collect();
        assert_eq!(ids, vec![id.0.to_string().as_bytes()]);
        assert_eq!(msg.header("traceparent"), Some(&b"00-1"[..]));
    }

    #[test]
    fn a_plugin_cannot_drop_or_forge_the_events_trace_context() {
        let event: std::collections::BTreeMap<String, String> = [(
            "traceparent".to_string(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_string(),
        )]
        .into();
        let mut forged = vec![
            (
                "traceparent".to_string(),
                "00-11111111111111111111111111111111-2222222222222222-01".to_string(),
            ),
            ("tracestate".to_string(), "evil=1".to_string()),
            ("x-kept".to_string(), "yes".to_string()),
        ];
        keep_event_trace(&event, &mut forged);
        assert_eq!(
            forged,
            vec![
                ("x-kept".to_string(), "yes".to_string()),
                ("traceparent".to_string(), event["traceparent"].clone()),
            ]
        );
        let mut dropped = vec![("x-kept".to_string(), "yes".to_string())];
        keep_event_trace(&event, &mut dropped);
        assert_eq!(
            dropped[1],
            ("traceparent".to_string(), event["traceparent"].clone())
        );
        let mut invented = vec![("traceparent".to_string(), "00-1-2-01".to_string())];
        keep_event_trace(&Default::default(), &mut invented);
        assert!(
            invented.is_empty(),
            "an event without a trace gives its outputs none"
        );
    }
}
