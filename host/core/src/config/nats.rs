//! `[transport.nats]`: NATS JetStream, for the relay and for consumers.
//!
//! Credentials come from the environment or files (`password_env`,
//! `password_file`, `token_env`, `token_file`, `creds_file`), never from
//! the config text itself, and loading resolves them into [`NatsSecret`],
//! whose `Debug` shows no value.

use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use super::duration;
use super::kafka::{read_env, read_file};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsSection {
    /// `nats://host:4222` (plain, or TLS when the server requires it) or
    /// `tls://host:4222` (TLS always); several servers comma-separated.
    #[serde(default = "default_url")]
    pub url: String,
    /// User name for user/password authentication.
    pub user: Option<String>,
    /// The environment variable that holds the password.
    pub password_env: Option<String>,
    /// A file that holds the password.
    pub password_file: Option<String>,
    /// The environment variable that holds a token.
    pub token_env: Option<String>,
    /// A file that holds a token.
    pub token_file: Option<String>,
    /// A `.creds` file (JWT and NKEY seed), as `nsc` writes it.
    pub creds_file: Option<String>,
    /// PEM roots to trust besides the system's webpki roots (a private CA).
    pub ca_file: Option<String>,
    /// Require TLS even for a `nats://` URL.
    #[serde(default)]
    pub tls_required: bool,
    /// How long JetStream waits for a consumer's ack before it redelivers.
    #[serde(
        default = "default_ack_wait",
        deserialize_with = "duration::keys::nats_ack_wait"
    )]
    pub ack_wait: Duration,
    /// How long an idle consumer's pull waits for new messages.
    #[serde(
        default = "default_fetch_wait",
        deserialize_with = "duration::keys::nats_fetch_wait"
    )]
    pub fetch_wait: Duration,
    /// JetStream's duplicate window on the streams outboxd creates: a
    /// message re-published with the same id within it is dropped.
    #[serde(default = "default_duplicate_window", with = "humantime_serde_compat")]
    pub duplicate_window: Duration,
    /// Resolved at load from `password_env` / `password_file`.
    #[serde(skip)]
    pub password: Option<NatsSecret>,
    /// Resolved at load from `token_env` / `token_file`.
    #[serde(skip)]
    pub token: Option<NatsSecret>,
}

/// A resolved credential; `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct NatsSecret(pub String);

impl std::fmt::Debug for NatsSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl Default for NatsSection {
    fn default() -> Self {
        Self {
            url: default_url(),
            user: None,
            password_env: None,
            password_file: None,
            token_env: None,
            token_file: None,
            creds_file: None,
            ca_file: None,
            tls_required: false,
            ack_wait: default_ack_wait(),
            fetch_wait: default_fetch_wait(),
            duplicate_window: default_duplicate_window(),
            password: None,
            token: None,
        }
    }
}

fn default_url() -> String {
    "nats://127.0.0.1:4222".into()
}
fn default_ack_wait() -> Duration {
    Duration::from_secs(30)
}
fn default_fetch_wait() -> Duration {
    Duration::from_millis(250)
}
fn default_duplicate_window() -> Duration {
    Duration::from_secs(120)
}

/// `duplicate_window` as a humantime string.
mod humantime_serde_compat {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(text.trim()).map_err(|e| {
            serde::de::Error::custom(format!(
                "`{text}` is not a duration ({e}); write it like \"2m\" or \"90s\""
            ))
        })
    }
}

impl NatsSection {
    /// Reads the password and the token from where the config says, and
    /// checks that the credentials are given one way each.
    pub(super) fn resolve_secrets(&mut self, env: &[(String, String)]) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| ConfigError::Key {
            key: format!("transport.nats.{key}"),
            message,
        };
        self.password = match (&self.password_env, &self.password_file) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "password_env",
                    "password_file is set as well; give the password one way only".into(),
                ));
            }
            (Some(name), None) => Some(NatsSecret(
                read_env(name, "password", env).map_err(|m| bad("password_env", m))?,
            )),
            (None, Some(path)) => Some(NatsSecret(
                read_file(path, "password").map_err(|m| bad("password_file", m))?,
            )),
            (None, None) => None,
        };
        self.token = match (&self.token_env, &self.token_file) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "token_env",
                    "token_file is set as well; give the token one way only".into(),
                ));
            }
            (Some(name), None) => Some(NatsSecret(
                read_env(name, "token", env).map_err(|m| bad("token_env", m))?,
            )),
            (None, Some(path)) => Some(NatsSecret(
                read_file(path, "token").map_err(|m| bad("token_file", m))?,
            )),
            (None, None) => None,
        };
        if self.password.is_some() && self.user.is_none() {
            return Err(bad(
                "user",
                "a password is set but no user; set transport.nats.user".into(),
            ));
        }
        if self.user.is_some() && self.password.is_none() {
            return Err(bad(
                "password_env",
                "a user is set but no password; set transport.nats.password_env or password_file"
                    .into(),
            ));
        }
        let ways = [
            self.password.is_some(),
            self.token.is_some(),
            self.creds_file.is_some(),
        ]
        .iter()
        .filter(|w| **w)
        .count();
        if ways > 1 {
            return Err(bad(
                "creds_file",
                "give one way to authenticate: user and password, a token, or a creds file".into(),
            ));
        }
        Ok(())
    }
}

/// The JetStream stream that carries `topic`: stream names cannot hold
/// `.`, `*`, `>`, whitespace or path separators, so each character
/// outside `[A-Za-z0-9_-]` becomes `_` (`orders.created` →
/// `orders_created`). Two topics that map to one stream are refused at
/// start ([`stream_names`]).
pub fn stream_name(topic: &str) -> String {
    topic
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Why a topic cannot be a NATS subject prefix, if it cannot: subjects are
/// dot-separated tokens without wildcards or whitespace.
pub fn topic_problem(topic: &str) -> Option<String> {
    if topic.is_empty() {
        return Some("is empty".into());
    }
    if topic
        .chars()
        .any(|c| c.is_whitespace() || c == '*' || c == '>')
    {
        return Some("holds whitespace, `*` or `>`, which NATS subjects cannot".into());
    }
    if topic.split('.').any(str::is_empty) {
        return Some("has an empty subject token (a leading, trailing or double `.`)".into());
    }
    None
}

/// Each topic's stream name, refusing two topics that map to one stream
/// and topics that are no valid subject.
pub fn stream_names<'a>(
    topics: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for topic in topics {
        if let Some(why) = topic_problem(topic) {
            return Err(format!("topic `{topic}` {why}; rename it for NATS"));
        }
        let stream = stream_name(topic);
        if let Some((other, _)) = out.iter().find(|(t, s)| *s == stream && t != topic) {
            return Err(format!(
                "topics `{other}` and `{topic}` both map to the JetStream stream `{stream}` \
                 (stream names turn `.` and other characters into `_`); rename one of them"
            ));
        }
        if !out.iter().any(|(t, _)| t == topic) {
            out.push((topic.to_string(), stream));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_map_to_stream_names_and_collisions_are_refused() {
        assert_eq!(stream_name("orders.created"), "orders_created");
        assert_eq!(stream_name("billing-v2"), "billing-v2");
        let ok = stream_names(["orders.created", "orders", "orders.created"]).expect("ok");
        assert_eq!(
            ok,
            vec![
                ("orders.created".to_string(), "orders_created".to_string()),
                ("orders".to_string(), "orders".to_string())
            ]
        );
        let e = stream_names(["orders.created", "orders_created"]).expect_err("collision");
        assert!(
            e.contains("orders.created") && e.contains("orders_created") && e.contains("rename"),
            "{e}"
        );
        let e = stream_names(["orders.*"]).expect_err("wildcard");
        assert!(e.contains("`orders.*`"), "{e}");
        let e = stream_names(["orders..x"]).expect_err("empty token");
        assert!(e.contains("empty subject token"), "{e}");
    }

    #[test]
    fn credentials_come_one_way_each_and_never_show() {
        let env = vec![("NATS_PW".to_string(), "hunter2".to_string())];
        let mut s = NatsSection {
            user: Some("outboxd".into()),
            password_env: Some("NATS_PW".into()),
            ..NatsSection::default()
        };
        s.resolve_secrets(&env).expect("resolved");
        assert_eq!(s.password, Some(NatsSecret("hunter2".into())));
        assert!(!format!("{s:?}").contains("hunter2"));
        let mut s = NatsSection {
            user: Some("outboxd".into()),
            password_env: Some("NOT_SET".into()),
            ..NatsSection::default()
        };
        let e = s.resolve_secrets(&env).expect_err("unset").to_string();
        assert!(
            e.contains("transport.nats.password_env") && e.contains("NOT_SET"),
            "{e}"
        );
        assert!(!e.contains("hunter2"));
        let mut s = NatsSection {
            password_env: Some("NATS_PW".into()),
            ..NatsSection::default()
        };
        let e = s.resolve_secrets(&env).expect_err("no user").to_string();
        assert!(e.contains("transport.nats.user"), "{e}");
        let mut s = NatsSection {
            token_env: Some("NATS_PW".into()),
            creds_file: Some("/x.creds".into()),
            ..NatsSection::default()
        };
        let e = s.resolve_secrets(&env).expect_err("two ways").to_string();
        assert!(e.contains("one way"), "{e}");
    }
}
