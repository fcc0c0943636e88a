//! Reading the TOML source: error messages that never quote a secret, and
//! the `OUTBOXD__SECTION__KEY` environment overrides.

use super::ConfigError;

/// A TOML error without the quoted source line (toml's own `Display`
/// shows it, and the line may hold a password or token): the message and
/// where it is.
pub(super) fn syntax_message(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim_end();
    match e.span() {
        Some(span) => {
            let before = &text.as_bytes()[..span.start.min(text.len())];
            let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
            let column = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
            format!("{message} (line {line}, column {column})")
        }
        None => message.to_string(),
    }
}

/// Property names whose values are never logged.
pub fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("password")
        || k.contains("secret")
        || k.contains("token")
        || k.ends_with(".key")
        || k.contains("sasl.oauthbearer.config")
}

/// `OUTBOXD__RELAY__BATCH_SIZE=50` sets `relay.batch_size`. Values are read
/// as TOML when they parse (numbers, booleans, arrays) and as strings
/// otherwise. Kafka property names contain dots: `OUTBOXD__TRANSPORT__KAFKA__BOOTSTRAP.SERVERS`.
pub(super) fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<(), ConfigError> {
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix("OUTBOXD__") else {
            continue;
        };
        let path: Vec<String> = rest.split("__").map(|s| s.to_ascii_lowercase()).collect();
        if path.iter().any(|p| p.is_empty()) {
            return Err(ConfigError::Key {
                key: name.clone(),
                message: "empty path segment; use OUTBOXD__SECTION__KEY".into(),
            });
        }
        // Secrets are always strings: a numeric token must not become an
        // integer (and then a type error that quotes it).
        let secret = path.last().is_some_and(|k| is_secret(k)) || path == ["database", "url"];
        let value = if secret {
            toml::Value::String(raw.clone())
        } else {
            format!("v = {raw}")
                .parse::<toml::Table>()
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or(toml::Value::String(raw.clone()))
        };
        let mut cursor = &mut *table;
        for seg in &path[..path.len() - 1] {
            let entry = cursor
                .entry(seg.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            cursor = match entry {
                toml::Value::Table(t) => t,
                _ => {
                    return Err(ConfigError::Key {
                        key: name.clone(),
                        message: format!("`{seg}` is not a section"),
                    });
                }
            };
        }
        if let Some(last) = path.last() {
            cursor.insert(last.clone(), value);
        }
    }
    Ok(())
}
