//! `webhook = { … }` on a route: the route sends each message as a signed
//! HTTP POST instead of publishing it to a topic.
//!
//! The signing secret comes from the environment or a file
//! (`secret_env`, `secret_file`), never from the config text; loading
//! resolves it into [`WebhookSecret`], whose `Debug` shows no value.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use super::duration;
use super::kafka::{read_env, read_file};

/// Where and how a webhook route sends.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSink {
    /// `https://host[:port]/path` (or `http://`); no user information.
    pub url: String,
    /// The environment variable that holds the signing secret(s).
    pub secret_env: Option<String>,
    /// A file that holds the signing secret(s).
    pub secret_file: Option<String>,
    /// The request's `Content-Type`.
    #[serde(default = "default_content_type")]
    pub content_type: String,
    /// Per request: connect, TLS, first byte and between bytes.
    #[serde(
        default = "default_timeout",
        deserialize_with = "duration::keys::webhook_timeout"
    )]
    pub timeout: Duration,
    /// Largest response body read; a larger one fails the request.
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: u64,
    /// PEM roots to trust besides Mozilla's webpki roots (a private CA).
    pub ca_file: Option<String>,
    /// Resolved at load from `secret_env` / `secret_file`.
    #[serde(skip)]
    pub secret: Option<WebhookSecret>,
}

fn default_content_type() -> String {
    "application/json".into()
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_max_response_bytes() -> u64 {
    64 * 1024
}

/// The secret text: one or more space-separated `whsec_…` secrets.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret(pub String);

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(***)")
    }
}

impl WebhookSink {
    /// A sink to `url` with the given secret text and the defaults.
    pub fn new(url: impl Into<String>, secret: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            secret_env: None,
            secret_file: None,
            content_type: default_content_type(),
            timeout: default_timeout(),
            max_response_bytes: default_max_response_bytes(),
            ca_file: None,
            secret: Some(WebhookSecret(secret.into())),
        }
    }

    /// Reads the secret from where the config says (`key` is the
    /// route's key, e.g. `routes[2].webhook`).
    pub(super) fn resolve_secret(
        &mut self,
        key: &str,
        env: &[(String, String)],
    ) -> Result<(), ConfigError> {
        let bad = |k: &str, message: String| ConfigError::Key {
            key: format!("{key}.{k}"),
            message,
        };
        self.secret = Some(WebhookSecret(match (&self.secret_env, &self.secret_file) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "secret_env",
                    "secret_file is set as well; give the secret one way only".into(),
                ));
            }
            (Some(name), None) => {
                read_env(name, "secret", env).map_err(|m| bad("secret_env", m))?
            }
            (None, Some(path)) => read_file(path, "secret").map_err(|m| bad("secret_file", m))?,
            (None, None) => {
                return Err(bad(
                    "secret_env",
                    "a webhook route needs a signing secret; set secret_env (an environment \
                     variable holding `whsec_…`) or secret_file"
                        .into(),
                ));
            }
        }));
        Ok(())
    }

    /// What is wrong with this sink, as (key under the sink, reason).
    pub fn problem(&self) -> Option<(&'static str, String)> {
        let url = self.url.trim();
        let Some((scheme, rest)) = url.split_once("://") else {
            return Some((
                "url",
                format!("`{url}` has no scheme; use \"https://host/path\" or \"http://host/path\""),
            ));
        };
        if !matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https") {
            return Some((
                "url",
                format!(
                    "scheme `{scheme}` is not http or https; a webhook is an HTTP POST, e.g. \
                     \"https://billing.internal/hooks/orders\""
                ),
            ));
        }
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        if authority.contains('@') {
            return Some((
                "url",
                "has user information; put no credentials in the URL (the request is signed \
                 with the route's secret)"
                    .into(),
            ));
        }
        if authority.is_empty() {
            return Some(("url", format!("`{url}` has no host")));
        }
        if rest.contains('#') {
            return Some(("url", format!("`{url}` has a fragment; remove it")));
        }
        if self.content_type.trim().is_empty() || self.content_type.contains(['\r', '\n']) {
            return Some((
                "content_type",
                "must be a media type such as \"application/json\"".into(),
            ));
        }
        if self.max_response_bytes == 0 {
            return Some((
                "max_response_bytes",
                "must be at least 1 (default 65536)".into(),
            ));
        }
        None
    }
}

/// Whether `name` may name a webhook route: it appears in metrics, in
/// `outboxd dead` and in `outboxd route resume NAME`.
pub fn route_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some(
            "a webhook route needs a name (for metrics, `outboxd dead` and \
             `outboxd route resume`); add name = \"…\""
                .into(),
        );
    }
    if name.len() > 100
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Some(format!(
            "`{name}` is not a route name; use up to 100 letters, digits, '-', '_' and '.'"
        ));
    }
    None
}
