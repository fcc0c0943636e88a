//! The checks a parsed [`Config`] must pass before anything starts: every
//! error names the key and the fix.

use std::net::SocketAddr;
use std::time::Duration;

use super::duration;
use super::{Config, ConfigError, HandlerRef, PluginSource, TransportKind};
use crate::db_url::DbKind;

impl Config {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| {
            Err(ConfigError::Key {
                key: key.into(),
                message,
            })
        };
        if let Err(e) = DbKind::from_url(&self.database.url) {
            return bad("database.url", e.to_string());
        }
        if let Some(url) = &self.telemetry.otlp_endpoint
            && let Some(problem) = super::endpoint_problem(url)
        {
            return bad("telemetry.otlp_endpoint", problem);
        }
        if self.database.max_connections == 0 {
            return bad("database.max_connections", "must be at least 1".into());
        }
        if self.relay.batch_size == 0 || self.relay.batch_size > 10_000 {
            return bad(
                "relay.batch_size",
                format!(
                    "{} is out of range; use 1 to 10000 (default 100)",
                    self.relay.batch_size
                ),
            );
        }
        if self.relay.workers > 64 {
            return bad(
                "relay.workers",
                format!("{} is out of range; use 0 to 64", self.relay.workers),
            );
        }
        if self.relay.workers == 0 && self.consumers.is_empty() {
            return bad(
                "relay.workers",
                "0 runs no relay, and no [[consumers]] are configured, so this process \
                 would do nothing; use 1 to 64, or add a consumer"
                    .into(),
            );
        }
        if self.relay.max_attempts < 1 {
            return bad("relay.max_attempts", "must be at least 1".into());
        }
        if self.relay.publish_timeout.is_zero() {
            return bad("relay.publish_timeout", "must be more than 0".into());
        }
        if self.relay.lease <= self.relay.publish_timeout {
            return bad(
                "relay.lease",
                format!(
                    "{} must exceed relay.publish_timeout ({}), or a slow batch could be claimed twice",
                    duration::format(self.relay.lease),
                    duration::format(self.relay.publish_timeout)
                ),
            );
        }
        self.check_sqlite_relay_lease()?;
        self.check_wal_source()?;
        self.check_pool_size()?;
        let b = self.relay.backoff;
        if !(b.base_seconds > 0.0 && b.max_seconds >= b.base_seconds) {
            return bad(
                "relay.backoff",
                "need 0 < base_seconds <= max_seconds".into(),
            );
        }
        if self.transport.consumer_lease < Duration::from_millis(300) {
            return bad(
                "transport.consumer_lease",
                "use at least \"300ms\" (default \"15s\")".into(),
            );
        }
        if self.transport.partitions < 1 || self.transport.partitions > 1024 {
            return bad("transport.partitions", "use 1 to 1024".into());
        }
        if self.transport.kind == TransportKind::Kafka
            && !self.transport.kafka.contains_key("bootstrap.servers")
        {
            return bad(
                "transport.kafka",
                "set \"bootstrap.servers\" when transport.kind = \"kafka\"".into(),
            );
        }
        self.transport.topics.validate(self.transport.kind)?;
        self.check_listeners()?;
        let r = &self.retention;
        if r.batch_size < 1 || r.published_days <= 0.0 || r.inbox_days <= 0.0 {
            return bad(
                "retention",
                "batch_size, published_days and inbox_days must be positive".into(),
            );
        }
        if r.purge_payload_days
            .is_some_and(|d| d <= 0.0 || d > r.published_days)
        {
            return bad(
                "retention.purge_payload_days",
                "must be positive and at most retention.published_days".into(),
            );
        }
        for (i, rule) in self.reconcile.iter().enumerate() {
            if rule.name.is_empty() || rule.query.trim().is_empty() {
                return bad(
                    &format!("reconcile[{i}]"),
                    "name and query must not be empty".into(),
                );
            }
        }
        for (i, r) in self.routes.iter().enumerate() {
            if let Some(sink) = &r.webhook {
                self.validate_webhook_route(i, r, sink)?;
            } else if r.name.is_some() {
                return bad(
                    &format!("routes[{i}].name"),
                    "only a webhook route has a name; remove it, or add webhook = { url = …, \
                     secret_env = … }"
                        .into(),
                );
            }
            if (r.webhook.is_none() && r.topic.is_empty()) || r.event_type.is_empty() {
                return bad(
                    &format!("routes[{i}]"),
                    "event_type and topic must not be empty".into(),
                );
            }
            if let Some(j) = r.allowed_topics.iter().position(|t| t.trim().is_empty()) {
                return bad(
                    &format!("routes[{i}].allowed_topics[{j}]"),
                    "must not be empty; list topic names, or remove the entry".into(),
                );
            }
        }
        for (i, p) in self.plugins.iter().enumerate() {
            if p.name.is_empty() {
                return bad(&format!("plugins[{i}].name"), "must not be empty".into());
            }
            if self.plugins[..i].iter().any(|q| q.name == p.name) {
                return bad(
                    &format!("plugins[{i}].name"),
                    format!("`{}` is used by an earlier [[plugins]] entry", p.name),
                );
            }
            let path_set = !p.path.as_os_str().is_empty();
            match p.source {
                PluginSource::File if !path_set => {
                    return bad(
                        &format!("plugins[{i}].path"),
                        "is required for a file plugin; or set source = \"registry\" to run the registry's active version".into(),
                    );
                }
                PluginSource::Registry if path_set => {
                    return bad(
                        &format!("plugins[{i}].path"),
                        "a registry plugin takes its component from `outboxd plugin deploy`; remove path".into(),
                    );
                }
                _ => {}
            }
            let l = p.limits;
            if l.timeout.is_zero() || l.timeout > Duration::from_secs(60) {
                return bad(
                    &format!("plugins[{i}].limits.timeout"),
                    format!(
                        "{} is out of range; use \"1ms\" to \"60s\" (default \"50ms\")",
                        duration::format(l.timeout)
                    ),
                );
            }
            if l.memory_mib == 0 || l.memory_mib > 4096 {
                return bad(
                    &format!("plugins[{i}].limits.memory_mib"),
                    format!(
                        "{} is out of range; use 1 to 4096 (default 64)",
                        l.memory_mib
                    ),
                );
            }
            for (j, h) in p.allowed_outbound_hosts.iter().enumerate() {
                if let Err(why) = super::OutboundHost::parse(h) {
                    return bad(
                        &format!("plugins[{i}].allowed_outbound_hosts[{j}]"),
                        format!("{why}; use {}", super::OUTBOUND_HOST_SHAPE),
                    );
                }
            }
            if !p.allowed_outbound_hosts.is_empty()
                && self.routes.iter().any(|r| r.transformers.contains(&p.name))
            {
                return bad(
                    &format!("plugins[{i}].allowed_outbound_hosts"),
                    format!(
                        "`{}` is a route's transformer, and transformers never get network; remove the list (only consumer plugins may call out)",
                        p.name
                    ),
                );
            }
            if let Some((key, why)) = p.http.problem() {
                return bad(&format!("plugins[{i}].http.{key}"), why);
            }
            if l.max_outputs == 0 || l.max_output_bytes == 0 {
                return bad(
                    &format!("plugins[{i}].limits"),
                    "max_outputs and max_output_bytes must be at least 1".into(),
                );
            }
        }
        for (ri, r) in self.routes.iter().enumerate() {
            for (ti, t) in r.transformers.iter().enumerate() {
                if !self.plugins.iter().any(|p| p.name == *t) {
                    return bad(
                        &format!("routes[{ri}].transformers[{ti}]"),
                        format!("no [[plugins]] entry is named `{t}`"),
                    );
                }
            }
        }
        for (i, c) in self.consumers.iter().enumerate() {
            match c.plugin_name() {
                Some(name) if !self.plugins.iter().any(|p| p.name == name) => {
                    return bad(
                        &format!("consumers[{i}].handler"),
                        format!("no [[plugins]] entry is named `{name}`"),
                    );
                }
                Some(name)
                    if self
                        .routes
                        .iter()
                        .any(|r| r.transformers.iter().any(|t| t == name)) =>
                {
                    return bad(
                        &format!("consumers[{i}].handler"),
                        format!(
                            "`{name}` is also a route's transformer; a plugin is a transformer or a consumer, give each its own [[plugins]] entry"
                        ),
                    );
                }
                Some(_) => {}
                // Which native handlers exist is the binary's business: the
                // daemon refuses an unregistered name at start, naming the
                // ones it has. Here only the name's shape is checked.
                None => {
                    if let HandlerRef::Builtin(name) = &c.handler
                        && !is_plain_identifier(name)
                    {
                        return bad(
                            &format!("consumers[{i}].handler"),
                            format!(
                                "`{}` is not a handler name; use plugin:NAME (a [[plugins]] entry) or builtin:NAME (lowercase letters, digits and _)",
                                c.handler
                            ),
                        );
                    }
                }
            }
            c.validate_grants(i, DbKind::from_url(&self.database.url).ok())?;
            if let Some(role) = &c.db_role
                && !is_plain_identifier(role)
            {
                return bad(
                    &format!("consumers[{i}].db_role"),
                    format!("`{role}` is not a plain identifier (lower-case letters, digits, _)"),
                );
            }
            if c.statement_timeout.is_zero() || c.statement_timeout > Duration::from_secs(600) {
                return bad(
                    &format!("consumers[{i}].statement_timeout"),
                    "use \"1ms\" to \"10m\" (default \"5s\")".into(),
                );
            }
            if c.max_statements == 0 || c.max_rows == 0 {
                return bad(
                    &format!("consumers[{i}]"),
                    "max_statements and max_rows must be at least 1".into(),
                );
            }
            if c.batch_in_transaction == 0 || c.batch_in_transaction > 10_000 {
                return bad(
                    &format!("consumers[{i}].batch_in_transaction"),
                    "use 1 to 10000".into(),
                );
            }
            if c.max_attempts == 0 {
                return bad(
                    &format!("consumers[{i}].max_attempts"),
                    "must be at least 1".into(),
                );
            }
            if c.topics.is_empty() {
                return bad(
                    &format!("consumers[{i}].topics"),
                    "list at least one topic".into(),
                );
            }
            if self.transport.kind == TransportKind::Rabbitmq
                && let Some((j, topic)) =
                    self.consumers[..i].iter().enumerate().find_map(|(j, o)| {
                        o.topics
                            .iter()
                            .find(|t| c.topics.contains(t))
                            .map(|t| (j, t))
                    })
            {
                // A queue hands each message to one consumer: two groups on
                // one topic's partition queues would each see part of it.
                return bad(
                    &format!("consumers[{i}].topics"),
                    format!(
                        "`{topic}` is read by consumers[{j}] too; on RabbitMQ a topic's \
                         partition queues serve one consumer group, so each message would reach \
                         only one of them. Publish to a second topic for the second consumer \
                         (a second route, or allowed_topics), or use one consumer"
                    ),
                );
            }
            if let Some(parts) = &c.kafka_partitions {
                let key = format!("consumers[{i}].kafka_partitions");
                if self.transport.kind != TransportKind::Kafka {
                    return bad(
                        &key,
                        "applies to transport.kind = \"kafka\" only; remove it".into(),
                    );
                }
                let mut seen = std::collections::BTreeSet::new();
                if parts.is_empty() || parts.iter().any(|p| *p < 0 || !seen.insert(*p)) {
                    return bad(
                        &key,
                        format!(
                            "{parts:?}: list distinct partition numbers, 0 or more, at least one (or remove the key to join the consumer group)"
                        ),
                    );
                }
            }
        }
        Ok(())
    }
}

impl Config {
    /// The admin API and the metrics listener: valid addresses, not the
    /// same one, and tokens that can be told apart and not guessed.
    fn check_listeners(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| {
            Err(ConfigError::Key {
                key: key.into(),
                message,
            })
        };
        let parse = |key: &str, addr: &str, example: &str| {
            addr.parse::<SocketAddr>().map_err(|_| ConfigError::Key {
                key: key.into(),
                message: format!("`{addr}` is not an address such as {example}"),
            })
        };
        let admin = &self.admin;
        let admin_addr = match admin.enabled {
            true => Some(parse("admin.listen", &admin.listen, "127.0.0.1:9464")?),
            false => None,
        };
        let metrics_addr = match &self.metrics.listen {
            Some(addr) => Some(parse("metrics.listen", addr, "127.0.0.1:9465")?),
            None => None,
        };
        if let (Some(a), Some(m)) = (admin_addr, metrics_addr)
            && same_port(a, m)
        {
            return bad(
                "metrics.listen",
                format!(
                    "`{m}` is where admin.listen (`{a}`) listens already; give the metrics \
                     listener a port of its own, such as 127.0.0.1:9465"
                ),
            );
        }
        if admin.enabled {
            match &admin.token {
                Some(t) if t.len() >= MIN_TOKEN => {}
                _ => {
                    return bad(
                        "admin.token",
                        "the admin API needs a bearer token of at least 16 characters; set OUTBOXD__ADMIN__TOKEN".into(),
                    );
                }
            }
        }
        let Some(scrape) = &admin.metrics_token else {
            return Ok(());
        };
        if !admin.enabled {
            return bad(
                "admin.metrics_token",
                "reaches /metrics on the admin API, which is off; set admin.enabled = true, \
                 or scrape [metrics] listen (no token), or remove admin.metrics_token"
                    .into(),
            );
        }
        if scrape.is_empty() {
            return bad(
                "admin.metrics_token",
                "is empty; set OUTBOXD__ADMIN__METRICS_TOKEN to a token of at least 16 characters, or unset it".into(),
            );
        }
        if scrape.len() < MIN_TOKEN {
            return bad(
                "admin.metrics_token",
                "is shorter than 16 characters; set OUTBOXD__ADMIN__METRICS_TOKEN to a longer one"
                    .into(),
            );
        }
        if admin.token.as_deref() == Some(scrape.as_str()) {
            return bad(
                "admin.metrics_token",
                "is the same as admin.token, so a scraper would hold the whole admin API; \
                 give it a token of its own"
                    .into(),
            );
        }
        Ok(())
    }
}

/// The shortest bearer token the admin API takes.
const MIN_TOKEN: usize = 16;

/// Whether two listeners would ask for one port: the same port (not 0, the
/// OS's pick) on the same address, or on the wildcard and any address.
fn same_port(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// The shortest `relay.lease` a SQLite relay can keep renewing.
const MIN_SQLITE_LEASE: Duration = Duration::from_secs(1);

impl Config {
    /// SQLite: a batch in flight renews its lease every third of it, and
    /// a renewal is a write, so it may queue behind other writers for the
    /// database's one write lock; a lease shorter than a second could
    /// expire while its renewal waits, and the batch would be claimed twice.
    /// `relay.source = "wal"` reads Postgres's logical replication stream:
    /// SQLite has none, and the slot and publication names go into SQL
    /// and the replication protocol as identifiers.
    fn check_wal_source(&self) -> Result<(), ConfigError> {
        use super::RelaySource;
        let bad = |key: &str, message: String| {
            Err(ConfigError::Key {
                key: key.into(),
                message,
            })
        };
        if self.relay.source != RelaySource::Wal {
            return Ok(());
        }
        if DbKind::from_url(&self.database.url).ok() == Some(DbKind::Sqlite) {
            return bad(
                "relay.source",
                "\"wal\" reads Postgres's write-ahead log; SQLite has none. Use relay.source = \"poll\" (the default) on SQLite".into(),
            );
        }
        let w = &self.relay.wal;
        for (key, name) in [
            ("relay.wal.slot", &w.slot),
            ("relay.wal.publication", &w.publication),
        ] {
            let ok = !name.is_empty()
                && name.len() <= 63
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                && !name.as_bytes()[0].is_ascii_digit();
            if !ok {
                return bad(
                    key,
                    format!(
                        "`{name}` is not a valid name: use 1 to 63 lowercase letters, digits and underscores, not starting with a digit"
                    ),
                );
            }
        }
        if w.standby_retry.is_zero() || w.status_interval.is_zero() {
            return bad(
                "relay.wal",
                "standby_retry and status_interval must be more than 0 (defaults \"1s\")".into(),
            );
        }
        if w.sender_timeout < Duration::from_secs(1) {
            return bad(
                "relay.wal.sender_timeout",
                "use at least \"1s\" (default \"10s\"): the server drops a reader that is silent this long".into(),
            );
        }
        if w.max_lag_bytes < 16 << 20 {
            return bad(
                "relay.wal.max_lag_bytes",
                format!(
                    "{} is below one WAL segment's worth of headroom; use at least 16777216 (16 MiB; default 1073741824)",
                    w.max_lag_bytes
                ),
            );
        }
        Ok(())
    }

    fn check_sqlite_relay_lease(&self) -> Result<(), ConfigError> {
        if DbKind::from_url(&self.database.url).ok() != Some(DbKind::Sqlite)
            || self.relay.lease >= MIN_SQLITE_LEASE
        {
            return Ok(());
        }
        Err(ConfigError::Key {
            key: "relay.lease".into(),
            message: format!(
                "{} is too short to renew: a SQLite relay renews its claim every third of its lease while a batch is in flight, and a renewal may wait for the write lock; use at least {} ms (\"{}\"; default \"30s\")",
                duration::format(self.relay.lease),
                MIN_SQLITE_LEASE.as_millis(),
                duration::format(MIN_SQLITE_LEASE)
            ),
        })
    }
}

impl Config {
    /// `database.max_connections` must cover what the process holds at
    /// once ([`super::PoolBudget`]), or a worker holding a connection waits
    /// for one that the others hold (a Postgres claim waiting for the
    /// embedded transport's writer, say) until its timeout.
    fn check_pool_size(&self) -> Result<(), ConfigError> {
        let b = self.pool_budget();
        let have = self.database.max_connections;
        if have >= b.minimum() {
            return Ok(());
        }
        let mut holders = Vec::new();
        if b.relay > 0 {
            holders.push(format!(
                "relay.workers = {}{} hold {}",
                self.relay.workers,
                if self.relay.pipeline {
                    " with relay.pipeline = true (two batches each)"
                } else {
                    ""
                },
                b.relay
            ));
        }
        if b.group_writer > 0 {
            holders.push("the embedded transport's group-commit writer 1".into());
        }
        if b.listeners > 0 {
            holders.push(format!("Postgres LISTEN connections {}", b.listeners));
        }
        match b.consumers {
            0 => {}
            1 => holders.push("consumers[0] at least 1".into()),
            n => holders.push(format!("consumers[0..{}] at least 1 each ({n})", n - 1)),
        }
        holders.push(format!(
            "{} for retention, reconciliation and the admin API",
            b.spare
        ));
        Err(ConfigError::Key {
            key: "database.max_connections".into(),
            message: format!(
                "{have} is less than this process holds at once: {}; set database.max_connections to at least {}, or lower relay.workers, set relay.pipeline = false, or run fewer [[consumers]] in this process",
                holders.join(", "),
                b.minimum()
            ),
        })
    }
}

/// A role name is spliced into `SET LOCAL ROLE "…"`, so only plain
/// identifiers are accepted.
pub(super) fn is_plain_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && s.len() <= 63
}

impl Config {
    /// A webhook route: a valid name no other route or topic uses, no
    /// topic, a sink whose URL and limits hold.
    fn validate_webhook_route(
        &self,
        i: usize,
        r: &crate::route::Route,
        sink: &super::webhook::WebhookSink,
    ) -> Result<(), ConfigError> {
        let bad = |key: String, message: String| Err(ConfigError::Key { key, message });
        let name = r.name.as_deref().unwrap_or("");
        if let Some(problem) = super::webhook::route_name_problem(name) {
            return bad(format!("routes[{i}].name"), problem);
        }
        if !r.topic.is_empty() {
            return bad(
                format!("routes[{i}].topic"),
                format!(
                    "a webhook route has no topic (it sends to its url); remove topic = \"{}\", \
                     or make a second route for the topic",
                    r.topic
                ),
            );
        }
        if let Some(j) = self.routes[..i]
            .iter()
            .position(|o| o.webhook.is_some() && o.name.as_deref() == Some(name))
        {
            return bad(
                format!("routes[{i}].name"),
                format!(
                    "`{name}` is also the name of routes[{j}]; give each webhook route its own name"
                ),
            );
        }
        let topics = self
            .routes
            .iter()
            .filter(|o| o.webhook.is_none())
            .flat_map(|o| std::iter::once(&o.topic).chain(&o.allowed_topics))
            .chain(self.consumers.iter().flat_map(|c| &c.topics));
        if topics.into_iter().any(|t| t == name) {
            return bad(
                format!("routes[{i}].name"),
                format!(
                    "`{name}` is also a topic of this config; a webhook route's name must not be \
                     a topic name (messages to it would go to the webhook), rename one"
                ),
            );
        }
        if let Some((key, problem)) = sink.problem() {
            return bad(format!("routes[{i}].webhook.{key}"), problem);
        }
        Ok(())
    }
}
