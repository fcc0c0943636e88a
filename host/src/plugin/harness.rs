//! The local test harness behind `outboxd plugin test`: run a component on
//! a sample event from a JSON file, without a database or a broker.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::transformer::TransformerPlugin;
use super::{GuestEvent, GuestMessage, Limits, PluginEngine, PluginError, PluginSpec};

/// A sample event file. Only `event_type` and `payload` are required.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SampleEvent {
    #[serde(default)]
    pub id: Option<uuid::Uuid>,
    #[serde(default = "default_aggregate")]
    pub aggregate_id: String,
    pub event_type: String,
    pub payload: serde_json::Value,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub created_at: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(default)]
    pub attempt: u32,
}

fn default_aggregate() -> String {
    "sample-aggregate".into()
}

impl SampleEvent {
    pub fn parse(origin: &str, text: &str) -> Result<Self, String> {
        let de = &mut serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            format!(
                "{origin}: `{}`: {} (expected {{\"event_type\": ..., \"payload\": ..., optional id, aggregate_id, headers, created_at, attempt}})",
                e.path(),
                e.inner()
            )
        })
    }

    pub fn to_guest(&self) -> GuestEvent {
        GuestEvent {
            id: self.id.unwrap_or_else(uuid::Uuid::new_v4).to_string(),
            aggregate_id: self.aggregate_id.clone(),
            event_type: self.event_type.clone(),
            payload: self.payload.to_string().into_bytes(),
            headers: self.headers.clone().into_iter().collect(),
            created_at: self
                .created_at
                .unwrap_or_else(chrono::Utc::now)
                .to_rfc3339(),
            key: self.aggregate_id.clone().into_bytes(),
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
