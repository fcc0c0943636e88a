//! `[transport.redis]`: Redis Streams, for the relay and for consumers.
//!
//! The URL names the server, the ACL user and the database. The password
//! may sit in the URL (`redis://:pw@host`, a development server's), or come
//! from `password_env` / `password_file`; loading resolves it into
//! [`RedisSecret`], whose `Debug` shows no value, and [`RedisUrl`]'s
//! `Debug` and `Display` are the only forms of the URL that logs and errors
//! show (the password as `***`).

use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use super::kafka::{read_env, read_file};
use super::rabbitmq::{has_password, redact};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSection {
    /// `redis://[user@]host:6379[/db]`, or `rediss://…` for TLS.
    #[serde(default = "default_url")]
    pub url: RedisUrl,
    /// The environment variable that holds the password.
    pub password_env: Option<String>,
    /// A file that holds the password.
    pub password_file: Option<String>,
    /// PEM roots to trust for `rediss://` instead of Mozilla's (a private
    /// CA).
    pub ca_file: Option<String>,
    /// The most entries each partition's stream keeps (`XADD … MAXLEN ~`):
    /// older ones are trimmed, read or not, so it must exceed the largest
    /// backlog a consumer may fall behind by.
    #[serde(default = "default_maxlen")]
    pub maxlen: u64,
    /// How long an idle consumer's read blocks for new entries.
    #[serde(default = "default_fetch_wait", deserialize_with = "fetch_wait")]
    pub fetch_wait: Duration,
    /// Entries a consumer reads from a partition's stream at a time.
    #[serde(default = "default_batch")]
    pub batch: usize,
    /// Resolved at load from `password_env` / `password_file`.
    #[serde(skip)]
    pub password: Option<RedisSecret>,
}

/// The server URL; its `Debug` and `Display` hide the password.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct RedisUrl(pub String);

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", redact(&self.0))
    }
}

impl std::fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact(&self.0))
    }
}

/// A resolved credential; `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisSecret(pub String);

impl std::fmt::Debug for RedisSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl Default for RedisSection {
    fn default() -> Self {
        Self {
            url: default_url(),
            password_env: None,
            password_file: None,
            ca_file: None,
            maxlen: default_maxlen(),
            fetch_wait: default_fetch_wait(),
            batch: default_batch(),
            password: None,
        }
    }
}

fn default_url() -> RedisUrl {
    RedisUrl("redis://127.0.0.1:6379".into())
}
fn default_maxlen() -> u64 {
    1_000_000
}
fn default_fetch_wait() -> Duration {
    Duration::from_millis(250)
}
fn default_batch() -> usize {
    100
}

fn fetch_wait<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    super::duration::read(
        d,
        "transport.redis.fetch_wait",
        "transport.redis.fetch_wait",
    )
}

impl RedisSection {
    /// Whether the connection uses TLS.
    pub fn tls(&self) -> bool {
        self.url.0.trim().starts_with("rediss://")
    }

    /// Checks the URL's shape and the limits, and reads the password from
    /// where the config says.
    pub(super) fn resolve_secrets(&mut self, env: &[(String, String)]) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| ConfigError::Key {
            key: format!("transport.redis.{key}"),
            message,
        };
        let url = self.url.0.trim();
        if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
            return Err(bad(
                "url",
                format!(
                    "`{}` is not a Redis URL; write redis://host:6379 (or rediss://host:6379 \
                     for TLS)",
                    redact(url)
                ),
            ));
        }
        if self.ca_file.is_some() && !self.tls() {
            return Err(bad(
                "ca_file",
                "applies to rediss:// URLs only; use rediss:// or remove ca_file".into(),
            ));
        }
        if self.maxlen < 100 {
            return Err(bad(
                "maxlen",
                format!(
                    "{} would trim entries before a consumer reads them; use 100 or more (the \
                     default is 1000000), above the largest backlog a consumer may have",
                    self.maxlen
                ),
            ));
        }
        if !(1..=10_000).contains(&self.batch) {
            return Err(bad(
                "batch",
                format!(
                    "{} is out of range; use 1 to 10000 (the default is 100)",
                    self.batch
                ),
            ));
        }
        self.password = match (&self.password_env, &self.password_file) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "password_env",
                    "password_file is set as well; give the password one way only".into(),
                ));
            }
            (Some(name), None) => Some(RedisSecret(
                read_env(name, "password", env).map_err(|m| bad("password_env", m))?,
            )),
            (None, Some(path)) => Some(RedisSecret(
                read_file(path, "password").map_err(|m| bad("password_file", m))?,
            )),
            (None, None) => None,
        };
        if self.password.is_some() && has_password(url) {
            return Err(bad(
                "url",
                "holds a password and password_env/password_file is set too; remove the \
                 password from the URL (redis://user@host:6379)"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// The stream that carries `topic`'s `partition`: `TOPIC:PARTITION`.
pub fn stream_key(topic: &str, partition: i32) -> String {
    format!("{topic}:{partition}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_shows_no_password() {
        let u = RedisUrl("redis://:s3cret@cache.internal:6379/0".into());
        assert_eq!(u.to_string(), "redis://:***@cache.internal:6379/0");
        assert!(!format!("{u:?}").contains("s3cret"));
        let u = RedisUrl("rediss://app:s3cret@cache:6380".into());
        assert_eq!(u.to_string(), "rediss://app:***@cache:6380");
        let s = RedisSection {
            url: RedisUrl("redis://app:s3cret@cache".into()),
            ..RedisSection::default()
        };
        assert!(!format!("{s:?}").contains("s3cret"), "{s:?}");
    }

    #[test]
    fn bad_settings_name_the_key_and_the_fix_and_show_no_secret() {
        let env = vec![("REDIS_PW".to_string(), "hunter2".to_string())];
        let mut s = RedisSection {
            url: RedisUrl("redis://app@cache:6379".into()),
            password_env: Some("REDIS_PW".into()),
            ..RedisSection::default()
        };
        s.resolve_secrets(&env).expect("resolved");
        assert_eq!(s.password, Some(RedisSecret("hunter2".into())));
        assert!(!format!("{s:?}").contains("hunter2"));
        let check = |s: RedisSection, key: &str, fix: &str| {
            let mut s = s;
            let e = s.resolve_secrets(&env).expect_err(key).to_string();
            assert!(
                e.contains(&format!("transport.redis.{key}")) && e.contains(fix),
                "{e}"
            );
            assert!(!e.contains("hunter2") && !e.contains(":pw@"), "{e}");
        };
        check(
            RedisSection {
                url: RedisUrl("http://app:pw@cache:6379".into()),
                ..RedisSection::default()
            },
            "url",
            "redis://host:6379",
        );
        check(
            RedisSection {
                url: RedisUrl("redis://app:pw@cache".into()),
                password_env: Some("REDIS_PW".into()),
                ..RedisSection::default()
            },
            "url",
            "remove the password from the URL",
        );
        check(
            RedisSection {
                password_env: Some("NOT_SET".into()),
                ..RedisSection::default()
            },
            "password_env",
            "NOT_SET",
        );
        check(
            RedisSection {
                ca_file: Some("/ca.pem".into()),
                ..RedisSection::default()
            },
            "ca_file",
            "rediss://",
        );
        check(
            RedisSection {
                maxlen: 0,
                ..RedisSection::default()
            },
            "maxlen",
            "use 100 or more",
        );
        check(
            RedisSection {
                batch: 0,
                ..RedisSection::default()
            },
            "batch",
            "use 1 to 10000",
        );
    }

    #[test]
    fn a_config_over_redis_loads() {
        let text = r#"
[transport]
kind = "redis"
partitions = 4
[transport.redis]
url = "rediss://app@cache.internal:6380"
password_env = "REDIS_PW"
maxlen = 50000
fetch_wait = "100ms"
[transport.topics]
create = true
[[consumers]]
name = "billing"
topics = ["orders"]
handler = "builtin:billing"
"#;
        let env = [("REDIS_PW".to_string(), "pw-secret-9".to_string())];
        let c = crate::config::Config::from_toml("t.toml", text, env.clone()).expect("loads");
        assert_eq!(c.transport.kind, crate::config::TransportKind::Redis);
        let r = &c.transport.redis;
        assert_eq!(r.password, Some(RedisSecret("pw-secret-9".into())));
        assert_eq!(
            (r.maxlen, r.fetch_wait),
            (50_000, Duration::from_millis(100))
        );
        assert!(r.tls());
        assert!(!format!("{c:?}").contains("pw-secret-9"));
        let e = crate::config::Config::from_toml(
            "t.toml",
            &text.replace("create = true", "create = true\nreplication = 3"),
            env,
        )
        .expect_err("replication on redis")
        .to_string();
        assert!(e.contains("transport.topics.replication"), "{e}");
    }
}
