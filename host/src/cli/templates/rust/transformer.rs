//! {{name}}: a transformer. Adds "tagged_by": "{{name}}" to a JSON object
//! payload; refuses a payload that is not an object, permanently.

use outboxd_guest::{Error, Event, Message, Result, Transformer};
use serde_json::{Map, Value};

struct Plugin;

impl Transformer for Plugin {
    fn transform(event: Event) -> Result<Vec<Message>> {
        let mut doc: Map<String, Value> = event
            .json()
            .map_err(|e| Error::permanent(format!("event {}: {e}", event.id)))?;
        doc.insert("tagged_by".into(), "{{name}}".into());
        Ok(vec![event.forward().with_json(&doc)?])
    }
}

outboxd_guest::export_transformer!(Plugin);
