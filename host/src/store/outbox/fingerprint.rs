//! The canonical fingerprint behind idempotent operations: the same key must
//! stand for the same aggregate, event type and payload.

use sha2::{Digest, Sha256};

use crate::event::NewEvent;

/// sha256 over the aggregate, the event type and the payload in canonical
/// JSON. serde_json's default map is sorted, so key order in the caller's
/// document does not change the fingerprint. Headers are deliberately left
/// out: a retry usually carries a new traceparent.
pub fn fingerprint(event: &NewEvent) -> String {
    let mut hasher = Sha256::new();
    for part in [event.aggregate_id.as_bytes(), event.event_type.as_bytes()] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hasher.update(canonical_json(&event.payload).as_bytes());
    hex::encode(hasher.finalize())
}

fn canonical_json(value: &serde_json::Value) -> String {
    // serde_json::Map is a BTreeMap unless the preserve_order feature is on,
    // which this crate does not enable; to_string is therefore canonical.
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_order_does_not_matter_but_values_do() {
        let a = NewEvent::new("o1", "t", serde_json::json!({"a": 1, "b": 2}));
        let b = NewEvent::new("o1", "t", serde_json::json!({"b": 2, "a": 1}));
        let c = NewEvent::new("o1", "t", serde_json::json!({"b": 3, "a": 1}));
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&a), fingerprint(&c));
    }
}
