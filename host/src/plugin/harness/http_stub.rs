//! `outboxd plugin test --http-stub FILE`: canned answers to a consumer's
//! HTTP requests, so a test opens no connection. The file is a JSON list,
//! tried in order; the first entry whose method (if given) and URL (exact,
//! or a prefix of the request's) match answers:
//!
//! ```json
//! [{"method": "POST", "url": "https://api.example.com/charges",
//!   "status": 201, "headers": {"content-type": "application/json"},
//!   "body": {"id": "ch_1"}}]
//! ```
//!
//! A `body` that is a JSON string is sent as that text; any other JSON
//! value as its JSON text.

use std::collections::BTreeMap;

use serde::Deserialize;

/// One canned answer, as the file writes it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StubEntry {
    #[serde(default)]
    pub method: Option<String>,
    pub url: String,
    pub status: u16,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub body: Option<serde_json::Value>,
}

const STUB_SHAPE: &str = "[{\"method\"?: \"POST\", \"url\": \"https://host/path (exact or prefix)\", \"status\": 200, \"headers\"?: {name: value}, \"body\"?: <JSON, or a string sent as text>}]";

impl StubEntry {
    /// The body's bytes.
    pub fn body_bytes(&self) -> Vec<u8> {
        match &self.body {
            None => Vec::new(),
            Some(serde_json::Value::String(text)) => text.clone().into_bytes(),
            Some(other) => other.to_string().into_bytes(),
        }
    }
}

/// Parses a stub file; an error names the file, the entry and the shape.
pub fn parse(origin: &str, text: &str) -> Result<Vec<StubEntry>, String> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| format!("{origin}: not JSON: {e} (expected {STUB_SHAPE})"))?;
    let entries: Vec<StubEntry> = serde_path_to_error::deserialize(value).map_err(|e| {
        format!(
            "{origin}: `{}`: {} (expected {STUB_SHAPE})",
            e.path(),
            e.inner()
        )
    })?;
    for (i, e) in entries.iter().enumerate() {
        if !(e.url.starts_with("http://") || e.url.starts_with("https://")) {
            return Err(format!(
                "{origin}: `[{i}].url`: `{}` is not an http:// or https:// URL (expected {STUB_SHAPE})",
                e.url
            ));
        }
        if !(100..=599).contains(&e.status) {
            return Err(format!(
                "{origin}: `[{i}].status`: {} is not an HTTP status (100 to 599)",
                e.status
            ));
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_stub_file_takes_json_or_text_bodies() {
        let entries = parse(
            "s.json",
            r#"[{"url": "http://127.0.0.1:9/a", "status": 201, "body": {"id": 1}},
                {"method": "GET", "url": "https://x.example/", "status": 404, "body": "gone", "headers": {"a": "b"}}]"#,
        )
        .expect("accepted");
        assert_eq!(entries[0].body_bytes(), br#"{"id":1}"#);
        assert_eq!(entries[1].body_bytes(), b"gone");
        assert_eq!(entries[1].method.as_deref(), Some("GET"));
    }

    #[test]
    fn a_bad_entry_is_named_with_the_expected_shape() {
        let typo = parse(
            "s.json",
            r#"[{"url": "http://a/", "status": 200, "bdy": 1}]"#,
        )
        .expect_err("typo");
        assert!(
            typo.contains("s.json") && typo.contains("bdy") && typo.contains("\"url\""),
            "{typo}"
        );
        let scheme =
            parse("s.json", r#"[{"url": "ftp://a/", "status": 200}]"#).expect_err("scheme");
        assert!(
            scheme.contains("[0].url") && scheme.contains("ftp://a/"),
            "{scheme}"
        );
        let status =
            parse("s.json", r#"[{"url": "http://a/", "status": 42}]"#).expect_err("status");
        assert!(status.contains("[0].status"), "{status}");
    }
}
