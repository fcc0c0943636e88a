//! `[transport.rabbitmq]`: RabbitMQ (AMQP 0.9.1), for the relay and for
//! consumers.
//!
//! The URL names the server, the user and the virtual host. The password
//! may sit in the URL (a development broker's `guest:guest`), or come from
//! `password_env` / `password_file`, which replace the URL's; loading
//! resolves them into [`RabbitSecret`], whose `Debug` shows no value, and
//! [`RabbitSection::redacted_url`] is the only form of the URL that logs and
//! errors show.

use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use super::duration;
use super::kafka::{read_env, read_file};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RabbitSection {
    /// `amqp://user@host:5672/vhost` or `amqps://…` (TLS); the virtual host
    /// URL-encoded (`%2f` is `/`).
    #[serde(default = "default_url")]
    pub url: RabbitUrl,
    /// The environment variable that holds the password (replaces the
    /// URL's).
    pub password_env: Option<String>,
    /// A file that holds the password (replaces the URL's).
    pub password_file: Option<String>,
    /// PEM roots to trust for `amqps://` besides Mozilla's (a private CA).
    pub ca_file: Option<String>,
    /// Unacknowledged messages a consumer's channel may hold per partition
    /// queue (AMQP `basic.qos`); capped at the consumer's batch size.
    #[serde(default = "default_prefetch")]
    pub prefetch: u16,
    /// How long an idle consumer waits for a delivery before it looks at
    /// its leases and stop signal again.
    #[serde(
        default = "default_fetch_wait",
        deserialize_with = "duration::keys::rabbitmq_fetch_wait"
    )]
    pub fetch_wait: Duration,
    /// Resolved at load from `password_env` / `password_file`.
    #[serde(skip)]
    pub password: Option<RabbitSecret>,
}

/// The broker URL; its `Debug` hides the password.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct RabbitUrl(pub String);

impl std::fmt::Debug for RabbitUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", redact(&self.0))
    }
}

/// A resolved credential; `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct RabbitSecret(pub String);

impl std::fmt::Debug for RabbitSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl Default for RabbitSection {
    fn default() -> Self {
        Self {
            url: default_url(),
            password_env: None,
            password_file: None,
            ca_file: None,
            prefetch: default_prefetch(),
            fetch_wait: default_fetch_wait(),
            password: None,
        }
    }
}

fn default_url() -> RabbitUrl {
    RabbitUrl("amqp://guest:guest@127.0.0.1:5672/%2f".into())
}
fn default_prefetch() -> u16 {
    100
}
fn default_fetch_wait() -> Duration {
    Duration::from_millis(250)
}

/// `url` with the password, if any, replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// Whether `url`'s user info carries a password.
pub(super) fn has_password(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    rest[..end]
        .rsplit_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':'))
}

impl RabbitSection {
    /// The URL as logs and errors show it.
    pub fn redacted_url(&self) -> String {
        redact(&self.url.0)
    }

    /// Whether the connection uses TLS.
    pub fn tls(&self) -> bool {
        self.url.0.starts_with("amqps://")
    }

    /// Checks the URL's shape and reads the password from where the config
    /// says.
    pub(super) fn resolve_secrets(&mut self, env: &[(String, String)]) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| ConfigError::Key {
            key: format!("transport.rabbitmq.{key}"),
            message,
        };
        let url = self.url.0.trim();
        if !(url.starts_with("amqp://") || url.starts_with("amqps://")) {
            return Err(bad(
                "url",
                format!(
                    "`{}` is not an AMQP URL; write amqp://user@host:5672/%2f (or amqps:// for TLS)",
                    redact(url)
                ),
            ));
        }
        if self.ca_file.is_some() && !self.tls() {
            return Err(bad(
                "ca_file",
                "applies to amqps:// URLs only; use amqps:// or remove ca_file".into(),
            ));
        }
        if self.prefetch == 0 {
            return Err(bad(
                "prefetch",
                "0 would let the broker push without bound; use 1 or more (the default is 100)"
                    .into(),
            ));
        }
        self.password = match (&self.password_env, &self.password_file) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "password_env",
                    "password_file is set as well; give the password one way only".into(),
                ));
            }
            (Some(name), None) => Some(RabbitSecret(
                read_env(name, "password", env).map_err(|m| bad("password_env", m))?,
            )),
            (None, Some(path)) => Some(RabbitSecret(
                read_file(path, "password").map_err(|m| bad("password_file", m))?,
            )),
            (None, None) => None,
        };
        if self.password.is_some() && has_password(url) {
            return Err(bad(
                "url",
                "holds a password and password_env/password_file is set too; remove the \
                 password from the URL (amqp://user@host/...)"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// The exchange a topic's messages are published to (direct; the routing
/// key is the partition).
pub fn exchange_name(topic: &str) -> String {
    topic.to_string()
}

/// The quorum queue of `topic`'s `partition`.
pub fn queue_name(topic: &str, partition: i32) -> String {
    format!("{topic}.{partition}")
}

/// Why a topic cannot name an exchange and its queues, if it cannot: AMQP
/// names are at most 255 bytes, and the `amq.` prefix is the broker's.
pub fn topic_problem(topic: &str) -> Option<String> {
    if topic.is_empty() {
        return Some("is empty".into());
    }
    if topic.starts_with("amq.") {
        return Some("starts with `amq.`, which RabbitMQ keeps for its own exchanges".into());
    }
    if topic.len() > 240 {
        return Some("is longer than 240 bytes; AMQP queue names hold 255 at most".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_shows_no_password() {
        assert_eq!(
            redact("amqp://app:s3cret@mq.internal:5672/%2f"),
            "amqp://app:***@mq.internal:5672/%2f"
        );
        assert_eq!(redact("amqps://app@mq/%2f"), "amqps://app@mq/%2f");
        assert_eq!(redact("amqp://mq:5672"), "amqp://mq:5672");
        let s = RabbitSection {
            url: RabbitUrl("amqp://app:s3cret@mq/%2f".into()),
            ..RabbitSection::default()
        };
        assert!(!format!("{s:?}").contains("s3cret"), "{s:?}");
    }

    #[test]
    fn the_password_comes_one_way_and_never_shows() {
        let env = vec![("MQ_PW".to_string(), "hunter2".to_string())];
        let mut s = RabbitSection {
            url: RabbitUrl("amqp://app@mq/%2f".into()),
            password_env: Some("MQ_PW".into()),
            ..RabbitSection::default()
        };
        s.resolve_secrets(&env).expect("resolved");
        assert_eq!(s.password, Some(RabbitSecret("hunter2".into())));
        assert!(!format!("{s:?}").contains("hunter2"));
        let mut s = RabbitSection {
            url: RabbitUrl("amqp://app:other@mq/%2f".into()),
            password_env: Some("MQ_PW".into()),
            ..RabbitSection::default()
        };
        let e = s.resolve_secrets(&env).expect_err("two ways").to_string();
        assert!(
            e.contains("transport.rabbitmq.url") && !e.contains("other"),
            "{e}"
        );
        let mut s = RabbitSection {
            url: RabbitUrl("amqp://app@mq/%2f".into()),
            password_env: Some("NOT_SET".into()),
            ..RabbitSection::default()
        };
        let e = s.resolve_secrets(&env).expect_err("unset").to_string();
        assert!(
            e.contains("transport.rabbitmq.password_env") && e.contains("NOT_SET"),
            "{e}"
        );
        let mut s = RabbitSection {
            url: RabbitUrl("http://app:pw@mq/".into()),
            ..RabbitSection::default()
        };
        let e = s.resolve_secrets(&env).expect_err("scheme").to_string();
        assert!(e.contains("not an AMQP URL") && !e.contains(":pw@"), "{e}");
        let mut s = RabbitSection {
            ca_file: Some("/ca.pem".into()),
            ..RabbitSection::default()
        };
        let e = s
            .resolve_secrets(&env)
            .expect_err("ca without tls")
            .to_string();
        assert!(e.contains("amqps://"), "{e}");
    }

    #[test]
    fn a_config_over_rabbitmq_loads_and_two_groups_on_one_topic_are_refused() {
        let base = r#"
[transport]
kind = "rabbitmq"
partitions = 4
[transport.rabbitmq]
url = "amqp://app@mq.internal:5672/%2f"
password_env = "MQ_PW"
[transport.topics]
create = true
replication = 3
[[routes]]
event_type = "order.*"
topic = "orders"
[[consumers]]
name = "billing"
topics = ["orders"]
handler = "builtin:billing"
"#;
        let env = [("MQ_PW".to_string(), "pw-secret-9".to_string())];
        let c = crate::config::Config::from_toml("t.toml", base, env.clone()).expect("loads");
        assert_eq!(c.transport.kind, crate::config::TransportKind::Rabbitmq);
        assert_eq!(
            c.transport.rabbitmq.password,
            Some(RabbitSecret("pw-secret-9".into()))
        );
        let two = format!(
            "{base}[[consumers]]\nname = \"audit\"\ntopics = [\"orders\"]\nhandler = \"builtin:audit\"\n"
        );
        let e = crate::config::Config::from_toml("t.toml", &two, env.clone())
            .expect_err("two groups on one topic")
            .to_string();
        assert!(
            e.contains("consumers[1].topics")
                && e.contains("`orders`")
                && e.contains("second topic"),
            "{e}"
        );
        let bad = base.replace("replication = 3", "replication = 3\npartitions = 8");
        let e = crate::config::Config::from_toml("t.toml", &bad, env)
            .expect_err("topics.partitions on rabbitmq")
            .to_string();
        assert!(e.contains("transport.topics.partitions"), "{e}");
    }

    #[test]
    fn topics_name_exchanges_and_partition_queues() {
        assert_eq!(exchange_name("orders.created"), "orders.created");
        assert_eq!(queue_name("orders.created", 3), "orders.created.3");
        assert!(topic_problem("amq.direct").is_some());
        assert!(topic_problem("orders").is_none());
    }
}
