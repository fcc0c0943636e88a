//! The relay's event decoding and header handling, and the consumer's view
//! of an incoming message: stored header JSON → event → broker message →
//! embedded-transport storage → delivery → message id. Never panics; the
//! message id a consumer deduplicates on is always the outbox id (or the
//! derived id of a plugin output), whatever headers the producer or a
//! plugin wrote; the embedded transport's header encoding round-trips any
//! bytes.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use outboxd_core::embedded_headers::{headers_json, parse_headers as parse_embedded};
use outboxd_core::event::{EventId, OutboxEvent, parse_headers};
use outboxd_core::message::{
    Delivery, GuestMessage, OutgoingMessage, headers, message_for_event, output_message_id,
    plugin_message,
};
use outboxd_core::route::{Route, Router};

#[derive(Debug, Arbitrary)]
struct Input {
    /// The outbox row's `headers` column as text (usually JSON).
    stored_headers: String,
    id: u128,
    aggregate_id: String,
    event_type: String,
    payload: String,
    created_at_secs: i32,
    /// Headers a transformer returned, and how many outputs it made.
    plugin_headers: Vec<(String, String)>,
    plugin_key: Vec<u8>,
    output: (u8, u8),
    /// A message as some other producer may have sent it (non-UTF-8 values).
    foreign_headers: Vec<(String, Vec<u8>)>,
    foreign_key: Option<Vec<u8>>,
}

fn delivery(msg: &OutgoingMessage, offset: i64) -> Delivery {
    // As the embedded transport stores and returns it.
    let stored = headers_json(&msg.headers);
    let back = parse_embedded(&stored);
    assert_eq!(back, msg.headers, "embedded header round trip");
    Delivery {
        attempt: 0,
        topic: msg.topic.clone(),
        partition: 0,
        offset,
        key: Some(msg.key.clone()),
        payload: msg.payload.clone(),
        headers: back,
    }
}

fn assert_host_headers_once(msg: &OutgoingMessage) {
    for name in headers::HOST_SET {
        let n = msg.headers.iter().filter(|(k, _)| k == name).count();
        assert_eq!(n, 1, "header {name} appears {n} times: {:?}", msg.headers);
    }
}

fuzz_target!(|input: Input| {
    let headers = match parse_headers(7, &input.stored_headers) {
        Ok(h) => h,
        Err(e) => {
            assert!(e.starts_with("outbox row 7:"), "{e}");
            BTreeMap::new()
        }
    };
    let created_at =
        chrono::DateTime::from_timestamp(i64::from(input.created_at_secs), 0).unwrap_or_default();
    let ev = OutboxEvent {
        seq: 7,
        id: EventId(uuid::Uuid::from_u128(input.id)),
        aggregate_id: input.aggregate_id,
        event_type: input.event_type,
        payload: input.payload,
        headers,
        created_at,
        attempts: 0,
        redrive_with: None,
    };
    let router = Router::new(vec![Route::new("order.*", "orders")]);

    // The plain path.
    let msg = message_for_event(&router, &ev);
    assert_host_headers_once(&msg);
    assert_eq!(msg.message_id, ev.id.0);
    let d = delivery(&msg, 1);
    assert_eq!(d.message_id(), Ok(ev.id.0));

    // The transformer path.
    let count = usize::from(input.output.1 % 4) + 1;
    let index = usize::from(input.output.0) % count;
    let guest = GuestMessage {
        topic: None,
        key: input.plugin_key,
        payload: Vec::new(),
        headers: input.plugin_headers,
    };
    let msg = plugin_message(&ev, "orders", guest.clone(), index, count);
    assert_host_headers_once(&msg);
    // Output 0 keeps the outbox id, output i >= 1 is uuid_v5(outbox id, i),
    // whatever the number of outputs.
    let want = if index == 0 {
        ev.id.0
    } else {
        uuid::Uuid::new_v5(&ev.id.0, index.to_string().as_bytes())
    };
    assert_eq!(msg.message_id, want);
    assert_eq!(output_message_id(ev.id.0, index), want);
    let other_count = plugin_message(&ev, "orders", guest, index, count + 1);
    assert_eq!(other_count.message_id, want);
    assert_eq!(delivery(&msg, 2).message_id(), Ok(want));

    // A message from elsewhere: any header bytes, any key.
    let foreign = Delivery {
        attempt: 0,
        topic: "t".into(),
        partition: 3,
        offset: 4,
        key: input.foreign_key,
        payload: Vec::new(),
        headers: input.foreign_headers,
    };
    match foreign.message_id() {
        Ok(id) => {
            let raw = foreign
                .header(headers::MESSAGE_ID)
                .expect("a header was parsed");
            let text = std::str::from_utf8(raw).expect("parsed means UTF-8");
            assert_eq!(uuid::Uuid::parse_str(text), Ok(id));
        }
        Err(e) => assert!(e.starts_with("t/3@4: "), "{e}"),
    }
    let back = parse_embedded(&headers_json(&foreign.headers));
    assert_eq!(back, foreign.headers);
});
