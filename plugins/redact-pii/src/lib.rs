//! Drops or masks payload fields named in the plugin's config.
//!
//! Config: `drop` and `mask`, comma-separated field paths such as
//! `customer.email, card`. A path walks objects by key; a masked value
//! becomes `"***"`. Missing fields are fine. The payload must be JSON.

use std::sync::OnceLock;

use outboxd_guest::{Event, Message, Result, Transformer, config};
use serde_json::Value;

struct Rules {
    drop: Vec<Vec<String>>,
    mask: Vec<Vec<String>>,
}

fn rules() -> &'static Rules {
    static RULES: OnceLock<Rules> = OnceLock::new();
    RULES.get_or_init(|| {
        let paths = |key| {
            config::list(key)
                .into_iter()
                .map(|p| p.split('.').map(str::to_string).collect())
                .collect()
        };
        Rules {
            drop: paths("drop"),
            mask: paths("mask"),
        }
    })
}

/// The object holding the last segment of `path`, and that segment.
fn parent<'a>(
    root: &'a mut Value,
    path: &'a [String],
) -> Option<(&'a mut serde_json::Map<String, Value>, &'a str)> {
    let (last, init) = path.split_last()?;
    let mut cur = root;
    for seg in init {
        cur = cur.as_object_mut()?.get_mut(seg)?;
    }
    Some((cur.as_object_mut()?, last.as_str()))
}

struct RedactPii;

impl Transformer for RedactPii {
    fn transform(event: Event) -> Result<Vec<Message>> {
        let mut doc: Value = event.json()?;
        let rules = rules();
        for path in &rules.drop {
            if let Some((obj, key)) = parent(&mut doc, path) {
                obj.remove(key);
            }
        }
        for path in &rules.mask {
            if let Some((obj, key)) = parent(&mut doc, path) {
                if let Some(v) = obj.get_mut(key) {
                    *v = Value::String("***".into());
                }
            }
        }
        Ok(vec![event.forward().with_json(&doc)?])
    }
}

outboxd_guest::export_transformer!(RedactPii);
