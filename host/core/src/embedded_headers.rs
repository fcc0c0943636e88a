//! Headers as the embedded transport stores them: a JSON array of
//! `[name, hex(value)]` pairs, so values may be any bytes.

/// Encodes `headers` for the `transport_messages.headers` column.
pub fn headers_json(headers: &[(String, Vec<u8>)]) -> String {
    let list: Vec<serde_json::Value> = headers
        .iter()
        .map(|(k, v)| serde_json::json!([k, hex::encode(v)]))
        .collect();
    serde_json::Value::Array(list).to_string()
}

/// The inverse of [`headers_json`]; entries that are not such a pair are
/// skipped rather than failing the message.
pub fn parse_headers(text: &str) -> Vec<(String, Vec<u8>)> {
    let Ok(serde_json::Value::Array(items)) = serde_json::from_str::<serde_json::Value>(text)
    else {
        return Vec::new();
    };
    items
        .into_iter()
        .filter_map(|item| {
            let pair = item.as_array()?;
            let name = pair.first()?.as_str()?.to_string();
            let value = hex::decode(pair.get(1)?.as_str()?).ok()?;
            Some((name, value))
        })
        .collect()
}
