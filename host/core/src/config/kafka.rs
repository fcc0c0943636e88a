//! What outboxd reads itself around `[transport.kafka]` rather than passing
//! to librdkafka: secrets from the environment or a file
//! (`"sasl.password_env"`, `"sasl.password_file"`), `[transport.topics]`
//! (whether `outboxd run` creates the topics it needs), and each group
//! consumer's static-membership instance id.

use std::collections::BTreeMap;
use std::io::Read;

use serde::Deserialize;

use super::{Config, ConfigError, TransportKind, is_secret};

/// The environment variable that gives every Kafka group consumer of a
/// process its `group.instance.id`, unless `consumers[].instance_id` is set.
pub const INSTANCE_ID_ENV: &str = "OUTBOXD_INSTANCE_ID";

/// `[transport.topics]`: what `outboxd run` does when a topic it needs does
/// not exist. It always checks at start; with `create = true` it creates
/// the missing ones with `partitions` and `replication`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicsSection {
    /// Create a missing topic instead of refusing to start.
    #[serde(default)]
    pub create: bool,
    /// Partitions of a topic outboxd creates (required with `create`).
    #[serde(default)]
    pub partitions: Option<i32>,
    /// Replication factor of a topic outboxd creates (required with
    /// `create`; at most the number of brokers).
    #[serde(default)]
    pub replication: Option<i16>,
}

/// How to create a missing topic, when `[transport.topics] create = true`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewTopics {
    pub partitions: i32,
    pub replication: i16,
}

impl TopicsSection {
    /// `Some` when missing topics are to be created.
    pub fn new_topics(&self) -> Option<NewTopics> {
        match (self.create, self.partitions, self.replication) {
            (true, Some(partitions), Some(replication)) => Some(NewTopics {
                partitions,
                replication,
            }),
            _ => None,
        }
    }

    pub(super) fn validate(&self, kind: TransportKind) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| {
            Err(ConfigError::Key {
                key: format!("transport.topics.{key}"),
                message,
            })
        };
        if *self != TopicsSection::default() && kind == TransportKind::Embedded {
            return Err(ConfigError::Key {
                key: "transport.topics".into(),
                message: "applies to transport.kind = \"kafka\", \"nats\", \"rabbitmq\" or \
                          \"redis\" only; remove it"
                    .into(),
            });
        }
        if kind == TransportKind::Rabbitmq {
            // Each topic has one quorum queue per transport.partitions;
            // replication is the queues' initial group size.
            if self.partitions.is_some() {
                return bad(
                    "partitions",
                    "on RabbitMQ every topic has one queue per transport.partitions; remove \
                     this key"
                        .into(),
                );
            }
            if let Some(r) = self.replication
                && r < 1
            {
                return bad(
                    "replication",
                    format!(
                        "{r} is out of range; a quorum queue has 1 or more members (up to the \
                         cluster's nodes)"
                    ),
                );
            }
            return Ok(());
        }
        if kind == TransportKind::Redis {
            // Each topic has one stream per transport.partitions; Redis
            // replicates a whole server, not a stream.
            if self.partitions.is_some() {
                return bad(
                    "partitions",
                    "on Redis every topic has one stream per transport.partitions; remove \
                     this key"
                        .into(),
                );
            }
            if self.replication.is_some() {
                return bad(
                    "replication",
                    "Redis streams have no replication of their own (replicas copy the whole \
                     server); remove this key"
                        .into(),
                );
            }
            return Ok(());
        }
        if kind == TransportKind::Nats {
            // A stream's subjects are TOPIC.PARTITION for each of
            // transport.partitions; replication is the stream's replicas.
            if self.partitions.is_some() {
                return bad(
                    "partitions",
                    "on NATS the partitions of every topic are transport.partitions; remove \
                     this key"
                        .into(),
                );
            }
            if let Some(r) = self.replication
                && !(1..=5).contains(&r)
            {
                return bad(
                    "replication",
                    format!("{r} is out of range; a JetStream stream has 1 to 5 replicas"),
                );
            }
            return Ok(());
        }
        if let Some(p) = self.partitions
            && !(1..=100_000).contains(&p)
        {
            return bad(
                "partitions",
                format!("{p} is out of range; use 1 to 100000"),
            );
        }
        if let Some(r) = self.replication
            && r < 1
        {
            return bad(
                "replication",
                format!("{r} is out of range; use 1 up to the number of brokers"),
            );
        }
        if self.create {
            if self.partitions.is_none() {
                return bad(
                    "partitions",
                    "required with create = true: the partitions of each topic outboxd \
                     creates (a key keeps its partition, so choose for the consumers you \
                     will run)"
                        .into(),
                );
            }
            if self.replication.is_none() {
                return bad(
                    "replication",
                    "required with create = true: the replication factor of each topic \
                     outboxd creates (3 on a production cluster, 1 on a single broker)"
                        .into(),
                );
            }
        }
        Ok(())
    }
}

/// Where a secret property's value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Env,
    File,
}

impl Source {
    fn of(key: &str) -> Option<(&str, Source)> {
        key.strip_suffix("_env")
            .map(|base| (base, Source::Env))
            .or_else(|| key.strip_suffix("_file").map(|base| (base, Source::File)))
    }
}

/// A secret file larger than this is refused: a password or a key
/// password is short, and a path to a device must not read forever.
const MAX_SECRET_FILE: u64 = 64 * 1024;

/// Replaces each `"PROPERTY_env"` / `"PROPERTY_file"` of a secret property
/// (`sasl.password`, `ssl.key.password`, ...) with `PROPERTY` itself, read
/// from that environment variable (in `env`) or file. The `_env` / `_file`
/// keys never reach librdkafka, and no error shows what was read.
pub(super) fn resolve_secrets(
    props: &mut BTreeMap<String, String>,
    env: &[(String, String)],
) -> Result<(), ConfigError> {
    let sourced: Vec<(String, String, Source)> = props
        .keys()
        .filter_map(|k| Source::of(k).map(|(base, s)| (k.clone(), base.to_string(), s)))
        .collect();
    for (key, base, source) in sourced {
        let full = format!("transport.kafka.\"{key}\"");
        let bad = |message: String| ConfigError::Key {
            key: full.clone(),
            message,
        };
        if !is_secret(&base) {
            return Err(bad(format!(
                "only a secret property is read from the environment or a file \
                 (sasl.password, ssl.key.password, sasl.oauthbearer.client.secret, ...); \
                 `{base}` is not one: set \"{base}\" itself"
            )));
        }
        let others: Vec<String> = [base.clone(), format!("{base}_env"), format!("{base}_file")]
            .into_iter()
            .filter(|k| *k != key && props.contains_key(k))
            .collect();
        if let Some(other) = others.first() {
            return Err(bad(format!(
                "\"{other}\" is set as well; give \"{base}\" one way only"
            )));
        }
        let Some(from) = props.remove(&key) else {
            continue;
        };
        let value = match source {
            Source::Env => read_env(&from, &base, env).map_err(bad)?,
            Source::File => read_file(&from, &base).map_err(bad)?,
        };
        props.insert(base, value);
    }
    Ok(())
}

pub(super) fn read_env(name: &str, base: &str, env: &[(String, String)]) -> Result<String, String> {
    let name = name.trim();
    if name.is_empty() {
        return Err(format!(
            "is empty; name the environment variable that holds \"{base}\""
        ));
    }
    match env.iter().rev().find(|(k, _)| k == name) {
        Some((_, v)) if !v.is_empty() => Ok(v.clone()),
        Some(_) => Err(format!(
            "the environment variable {name} is empty; export the secret in it, or use \
             \"{base}_file\""
        )),
        None => Err(format!(
            "the environment variable {name} is not set; export it to outboxd's \
             environment (it holds \"{base}\"), or use \"{base}_file\""
        )),
    }
}

/// A regular file's content without its trailing line break.
pub(super) fn read_file(path: &str, base: &str) -> Result<String, String> {
    let unreadable = |why: String| {
        format!(
            "cannot read {path}: {why}; point it at a readable file that holds \"{base}\", \
             or use \"{base}_env\""
        )
    };
    let meta = std::fs::metadata(path).map_err(|e| unreadable(e.to_string()))?;
    if !meta.is_file() {
        return Err(unreadable("not a regular file".into()));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_SECRET_FILE + 1).read_to_end(&mut bytes))
        .map_err(|e| unreadable(e.to_string()))?;
    if bytes.len() as u64 > MAX_SECRET_FILE {
        return Err(unreadable(format!(
            "larger than {} KiB",
            MAX_SECRET_FILE / 1024
        )));
    }
    let text = String::from_utf8(bytes).map_err(|_| unreadable("not UTF-8 text".into()))?;
    let value = text.trim_end_matches(['\n', '\r']);
    if value.is_empty() {
        return Err(unreadable("the file is empty".into()));
    }
    Ok(value.to_string())
}

/// Kafka's rule for a `group.instance.id`: 1 to 249 of `[A-Za-z0-9._-]`.
fn instance_id_problem(id: &str) -> Option<String> {
    if id.is_empty() || id.len() > 249 {
        return Some(format!(
            "`{id}` must be 1 to 249 characters; use a name stable across restarts and unique \
             per process, e.g. the host or pod name"
        ));
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Some(format!(
            "`{id}` may hold only letters, digits, '.', '_' and '-' (Kafka's rule for \
             group.instance.id)"
        ));
    }
    None
}

/// Gives each Kafka group consumer without `instance_id` the value of
/// [`INSTANCE_ID_ENV`] (when set), and checks every instance id.
pub(super) fn resolve_instance_ids(
    config: &mut Config,
    env: &[(String, String)],
) -> Result<(), ConfigError> {
    let from_env = env
        .iter()
        .rev()
        .find(|(k, _)| k == INSTANCE_ID_ENV)
        .map(|(_, v)| v.trim().to_string());
    let kafka = config.transport.kind == TransportKind::Kafka;
    for (i, c) in config.consumers.iter_mut().enumerate() {
        let key = format!("consumers[{i}].instance_id");
        if let Some(id) = &c.instance_id {
            if !kafka {
                return Err(ConfigError::Key {
                    key,
                    message: "applies to transport.kind = \"kafka\" only; remove it".into(),
                });
            }
            if c.kafka_partitions.is_some() {
                return Err(ConfigError::Key {
                    key,
                    message: "a consumer with kafka_partitions joins no group, so it has no \
                              instance id; remove one of them"
                        .into(),
                });
            }
            if let Some(problem) = instance_id_problem(id) {
                return Err(ConfigError::Key {
                    key,
                    message: problem,
                });
            }
        } else if kafka
            && c.kafka_partitions.is_none()
            && let Some(id) = &from_env
        {
            if let Some(problem) = instance_id_problem(id) {
                return Err(ConfigError::Key {
                    key: INSTANCE_ID_ENV.into(),
                    message: problem,
                });
            }
            c.instance_id = Some(id.clone());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_password_from_the_environment_replaces_its_env_key() {
        let mut p = props(&[("sasl.password_env", "KAFKA_PW"), ("sasl.username", "u")]);
        let env = vec![("KAFKA_PW".to_string(), "s3cret".to_string())];
        resolve_secrets(&mut p, &env).expect("resolved");
        assert_eq!(
            p,
            props(&[("sasl.password", "s3cret"), ("sasl.username", "u")])
        );
    }

    #[test]
    fn a_password_from_a_file_loses_its_line_break() {
        let file = std::env::temp_dir().join(format!("outboxd-pw-{}", uuid::Uuid::new_v4()));
        std::fs::write(&file, "k3y-pass\n").expect("write");
        let mut p = props(&[("ssl.key.password_file", file.to_str().expect("utf-8"))]);
        let resolved = resolve_secrets(&mut p, &[]);
        let _ = std::fs::remove_file(&file);
        resolved.expect("resolved");
        assert_eq!(p, props(&[("ssl.key.password", "k3y-pass")]));
    }

    #[test]
    fn a_missing_source_names_the_key_and_the_fix_and_no_secret() {
        let mut p = props(&[("sasl.password_env", "NOT_SET_ANYWHERE")]);
        let err = resolve_secrets(&mut p, &[]).expect_err("unset").to_string();
        assert!(
            err.contains("transport.kafka.\"sasl.password_env\"")
                && err.contains("NOT_SET_ANYWHERE is not set")
                && err.contains("sasl.password_file"),
            "{err}"
        );
        let mut p = props(&[("sasl.password_file", "/no/such/file")]);
        let err = resolve_secrets(&mut p, &[])
            .expect_err("no file")
            .to_string();
        assert!(
            err.contains("sasl.password_file") && err.contains("cannot read /no/such/file"),
            "{err}"
        );
        let mut p = props(&[("sasl.password_env", "PW"), ("sasl.password", "hunter2")]);
        let env = vec![("PW".to_string(), "hunter3".to_string())];
        let err = resolve_secrets(&mut p, &env).expect_err("both").to_string();
        assert!(
            err.contains("one way only") && !err.contains("hunter"),
            "{err}"
        );
        let mut p = props(&[("bootstrap.servers_env", "B")]);
        let err = resolve_secrets(&mut p, &[])
            .expect_err("not secret")
            .to_string();
        assert!(err.contains("not one"), "{err}");
    }

    #[test]
    fn a_device_or_a_directory_is_no_secret_file() {
        for path in ["/dev/zero", "/"] {
            let mut p = props(&[("sasl.password_file", path)]);
            let err = resolve_secrets(&mut p, &[]).expect_err(path).to_string();
            assert!(err.contains("not a regular file"), "{err}");
        }
    }

    #[test]
    fn instance_ids_follow_kafkas_rule() {
        assert!(instance_id_problem("consumer-1.pod_a").is_none());
        assert!(instance_id_problem("").is_some());
        assert!(instance_id_problem("a b").is_some());
        assert!(instance_id_problem(&"x".repeat(250)).is_some());
    }
}
