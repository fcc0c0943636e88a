//! The sample message of `outboxd plugin test` on a consumer: a JSON file
//! with the fields of the WIT `message` record.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::plugin::bindings::transformer::outbox::plugin::types::Message;

/// A sample message. Only the payload is required; a missing id is
/// generated (a report shows it as `<message-id>`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SampleMessage {
    #[serde(default)]
    pub id: Option<uuid::Uuid>,
    #[serde(default = "default_topic")]
    pub topic: String,
    /// The partition key (the aggregate id, as the relay publishes it).
    #[serde(default)]
    pub key: Option<String>,
    /// A JSON value, sent as its JSON text; a JSON string is sent as that
    /// text itself (a payload that is not JSON).
    pub payload: serde_json::Value,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Earlier failed attempts.
    #[serde(default)]
    pub attempt: u32,
}

const MESSAGE_KEYS: &str = "{\"payload\": <JSON, or a string sent as text>, optional \"id\": \"<uuid>\", \"topic\", \"key\", \"headers\": {name: value}, \"attempt\"}";

fn default_topic() -> String {
    "sample-topic".into()
}

impl SampleMessage {
    pub fn parse(origin: &str, text: &str) -> Result<Self, String> {
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| format!("{origin}: not JSON: {e} (expected {MESSAGE_KEYS})"))?;
        serde_path_to_error::deserialize(value).map_err(|e| {
            format!(
                "{origin}: `{}`: {} (expected {MESSAGE_KEYS})",
                e.path(),
                e.inner()
            )
        })
    }

    /// The bytes the plugin receives as the payload.
    pub fn payload_bytes(&self) -> Vec<u8> {
        match &self.payload {
            serde_json::Value::String(text) => text.clone().into_bytes(),
            other => other.to_string().into_bytes(),
        }
    }

    /// The WIT message, with `id` as its id.
    pub fn to_guest(&self, id: uuid::Uuid) -> Message {
        Message {
            id: id.to_string(),
            topic: self.topic.clone(),
            key: self.key.clone().map(String::into_bytes),
            payload: self.payload_bytes(),
            headers: self.headers.clone().into_iter().collect(),
            attempt: self.attempt,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SampleMessage;

    #[test]
    fn a_string_payload_is_sent_as_text_and_anything_else_as_json() {
        let text = SampleMessage::parse("m", r#"{"payload": "plain"}"#).expect("accepted");
        assert_eq!(text.payload_bytes(), b"plain");
        let json = SampleMessage::parse("m", r#"{"payload": {"n": 1}, "key": "k"}"#).expect("ok");
        assert_eq!(json.payload_bytes(), br#"{"n":1}"#);
        let guest = json.to_guest(uuid::Uuid::nil());
        assert_eq!(guest.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(guest.topic, "sample-topic");
    }

    #[test]
    fn unknown_keys_and_a_missing_payload_name_the_expected_keys() {
        let typo =
            SampleMessage::parse("m.json", r#"{"payload": 1, "kye": "k"}"#).expect_err("typo");
        assert!(
            typo.contains("m.json") && typo.contains("kye") && typo.contains("\"payload\""),
            "{typo}"
        );
        let missing = SampleMessage::parse("m.json", r#"{"id": null}"#).expect_err("no payload");
        assert!(missing.contains("payload"), "{missing}");
    }
}
