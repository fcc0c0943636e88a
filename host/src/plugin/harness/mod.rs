//! The local test harness behind `outboxd plugin test`: run a component on
//! a sample from a JSON file and report what it did.
//!
//! # Layout
//!
//! - this file: the transformer's sample event ([`SampleEvent`]) and its
//!   run, without a database or a broker;
//! - [`message`]: the consumer's sample message; [`consumer`]: its run in
//!   a transaction that is always rolled back;
//! - [`http_stub`]: a consumer's canned HTTP answers (`--http-stub`);
//! - [`report`]: what a run reports, for both worlds; [`expect`]: the
//!   comparison with a golden report (`--expect`).

pub mod consumer;
pub mod expect;
pub mod http_stub;
pub mod message;
pub mod report;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::bindings::{GuestEvent, GuestMessage};
use super::error::PluginError;
use super::runtime::engine::PluginEngine;
use super::runtime::transformer::TransformerPlugin;
use crate::config::Limits;
use crate::config::PluginSpec;

/// A sample event file, in either of two forms told apart by their keys:
/// - the file form, with snake_case keys (`aggregate_id`, `event_type`,
///   `created_at`) and the payload as a JSON value;
/// - the WIT form, exactly the `event` record that `wit/README.md` shows,
///   with kebab-case keys (`aggregate-id`, `event-type`, `created-at`,
///   `key`), the payload as text and the headers as `[name, value]` pairs.
///
/// Only the event type and the payload are required in either form.
#[derive(Debug, Clone)]
pub struct SampleEvent {
    pub id: Option<uuid::Uuid>,
    pub aggregate_id: String,
    pub event_type: String,
    /// The payload bytes the guest receives.
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
    pub created_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The partition key so far; the aggregate id when absent.
    pub key: Option<String>,
    pub attempt: u32,
}

/// The file form: snake_case keys, the payload as JSON.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileForm {
    #[serde(default)]
    id: Option<uuid::Uuid>,
    #[serde(default = "default_aggregate")]
    aggregate_id: String,
    event_type: String,
    payload: serde_json::Value,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    created_at: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(default)]
    attempt: u32,
}

/// The WIT form: the `event` record's field names, the payload as text.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct WitForm {
    #[serde(default)]
    id: Option<uuid::Uuid>,
    #[serde(default = "default_aggregate")]
    aggregate_id: String,
    event_type: String,
    payload: String,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default)]
    created_at: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    attempt: u32,
}

const FILE_KEYS: &str = "{\"event_type\": ..., \"payload\": <JSON>, optional id, aggregate_id, headers {name: value}, created_at, attempt}";
const WIT_KEYS: &str = "{\"event-type\": ..., \"payload\": \"<text>\", optional id, aggregate-id, headers [[name, value]], created-at, key, attempt}";

/// Keys that only the WIT form has.
const WIT_ONLY: [&str; 4] = ["aggregate-id", "event-type", "created-at", "key"];
/// Keys that only the file form has.
const FILE_ONLY: [&str; 3] = ["aggregate_id", "event_type", "created_at"];

fn default_aggregate() -> String {
    "sample-aggregate".into()
}

impl SampleEvent {
    pub fn parse(origin: &str, text: &str) -> Result<Self, String> {
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| format!("{origin}: not JSON: {e} (expected {FILE_KEYS})"))?;
        let Some(object) = value.as_object() else {
            return Err(format!(
                "{origin}: expected a JSON object, either {FILE_KEYS} or, in the WIT form of wit/README.md, {WIT_KEYS}"
            ));
        };
        let wit = WIT_ONLY.iter().any(|k| object.contains_key(*k));
        let file = FILE_ONLY.iter().any(|k| object.contains_key(*k));
        if wit && file {
            return Err(format!(
                "{origin}: mixes snake_case keys (the file form, {FILE_KEYS}) with kebab-case keys (the WIT form, {WIT_KEYS}); use one form"
            ));
        }
        let fail = |path: String, inner: String, keys: &str| {
            format!("{origin}: `{path}`: {inner} (expected {keys})")
        };
        if wit {
            let w: WitForm = serde_path_to_error::deserialize(value)
                .map_err(|e| fail(e.path().to_string(), e.inner().to_string(), WIT_KEYS))?;
            Ok(Self {
                id: w.id,
                aggregate_id: w.aggregate_id,
                event_type: w.event_type,
                payload: w.payload.into_bytes(),
                headers: w.headers.into_iter().collect(),
                created_at: w.created_at,
                key: w.key,
                attempt: w.attempt,
            })
        } else {
            let f: FileForm = serde_path_to_error::deserialize(value)
                .map_err(|e| fail(e.path().to_string(), e.inner().to_string(), FILE_KEYS))?;
            Ok(Self {
                id: f.id,
                aggregate_id: f.aggregate_id,
                event_type: f.event_type,
                payload: f.payload.to_string().into_bytes(),
                headers: f.headers,
                created_at: f.created_at,
                key: None,
                attempt: f.attempt,
            })
        }
    }

    pub fn to_guest(&self) -> GuestEvent {
        GuestEvent {
            id: self.id.unwrap_or_else(uuid::Uuid::new_v4).to_string(),
            aggregate_id: self.aggregate_id.clone(),
            event_type: self.event_type.clone(),
            payload: self.payload.clone(),
            headers: self.headers.clone().into_iter().collect(),
            created_at: self
                .created_at
                .unwrap_or_else(chrono::Utc::now)
                .to_rfc3339(),
            key: self
                .key
                .clone()
                .unwrap_or_else(|| self.aggregate_id.clone())
                .into_bytes(),
            attempt: self.attempt,
        }
    }
}

/// Loads `wasm` with `limits` and `config` and runs it once on `event`.
pub async fn run_once(
    engine: &PluginEngine,
    wasm: &Path,
    event: &SampleEvent,
    limits: Limits,
    config: BTreeMap<String, String>,
) -> Result<Vec<GuestMessage>, PluginError> {
    let mut spec = PluginSpec::new("test", wasm);
    spec.limits = limits;
    spec.config = config;
    let plugin = TransformerPlugin::load(engine, &spec)?;
    plugin.transform(&event.to_guest()).await
}

/// [`run_once`], reported: the output messages or the error, with the
/// event id and time the harness made up listed as generated.
pub async fn transformer_report(
    engine: &PluginEngine,
    wasm: &Path,
    event: &SampleEvent,
    limits: Limits,
    config: BTreeMap<String, String>,
) -> Result<report::TransformerReport, PluginError> {
    let mut spec = PluginSpec::new("test", wasm);
    spec.limits = limits;
    spec.config = config;
    let plugin = TransformerPlugin::load(engine, &spec)?;
    let guest = event.to_guest();
    let mut generated = BTreeMap::new();
    if event.id.is_none() {
        generated.insert("<event-id>".to_string(), guest.id.clone());
    }
    if event.created_at.is_none() {
        generated.insert("<created-at>".to_string(), guest.created_at.clone());
    }
    let start = std::time::Instant::now();
    let result = plugin.transform(&guest).await;
    let duration_ms = start.elapsed().as_millis() as u64;
    let (messages, outcome) = match result {
        Ok(messages) if messages.is_empty() => (
            Vec::new(),
            report::Outcome {
                result: "filtered".into(),
                message: Some("the plugin returned no messages".into()),
                then: "drop",
            },
        ),
        Ok(messages) => (
            messages
                .into_iter()
                .map(|m| report::MessageOut {
                    topic: m.topic,
                    key: String::from_utf8_lossy(&m.key).into_owned(),
                    headers: m.headers.into_iter().collect(),
                    payload: report::payload_json(&m.payload),
                })
                .collect(),
            report::Outcome::ok("publish"),
        ),
        Err(e) => (Vec::new(), report::Outcome::failed(&e)),
    };
    Ok(report::TransformerReport {
        world: "transformer",
        messages,
        outcome,
        duration_ms,
        generated,
    })
}

#[cfg(test)]
mod tests {
    use super::SampleEvent;

    #[test]
    fn the_event_shown_in_wit_readme_is_accepted() {
        let readme = include_str!("../../../../wit/README.md");
        let start = readme
            .find("{\"id\": \"6f1c1d2e")
            .expect("wit/README.md shows a sample event");
        let end = start + readme[start..].find("}\n").expect("the sample ends") + 1;
        let e = SampleEvent::parse("wit/README.md", &readme[start..end]).expect("accepted");
        assert_eq!(e.aggregate_id, "order-7");
        assert_eq!(e.event_type, "order.confirmed");
        assert_eq!(e.payload, br#"{"total":42}"#);
        assert_eq!(
            e.headers.get("traceparent").map(String::as_str),
            Some("00-4bf9...-01")
        );
        assert_eq!(e.to_guest().key, b"order-7");
    }

    #[test]
    fn the_file_form_takes_the_payload_as_json() {
        let e = SampleEvent::parse(
            "f",
            r#"{"event_type": "a", "aggregate_id": "x", "payload": {"n": 1}, "headers": {"h": "v"}}"#,
        )
        .expect("accepted");
        assert_eq!(e.payload, br#"{"n":1}"#);
        assert_eq!(e.to_guest().key, b"x");
    }

    #[test]
    fn mixed_forms_and_unknown_keys_are_refused_with_the_expected_keys() {
        let mixed = SampleEvent::parse(
            "f",
            r#"{"event-type": "a", "event_type": "a", "payload": "x"}"#,
        )
        .expect_err("mixed");
        assert!(mixed.contains("use one form"), "{mixed}");
        let unknown = SampleEvent::parse("f", r#"{"event_type": "a", "payload": 1, "typo": 2}"#)
            .expect_err("unknown key");
        assert!(
            unknown.contains("typo") && unknown.contains("event_type"),
            "{unknown}"
        );
        let wit_payload = SampleEvent::parse("f", r#"{"event-type": "a", "payload": {"n": 1}}"#)
            .expect_err("the WIT form's payload is text");
        assert!(
            wit_payload.contains("payload") && wit_payload.contains("<text>"),
            "{wit_payload}"
        );
    }
}
