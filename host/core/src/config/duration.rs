//! Durations in the config are humantime strings: `"500ms"`, `"30s"`,
//! `"2m"`, `"1m 30s"`. For one release, each key's old `*_ms` name with a
//! number of milliseconds is read too, and leaves a deprecation warning
//! naming the new key ([`super::Config::deprecations`]); a bare number under
//! the new name is read as milliseconds with the same warning.

use std::cell::RefCell;
use std::time::Duration;

use serde::Deserializer;
use serde::de::{Error, Visitor};

thread_local! {
    /// Warnings of the config being parsed on this thread.
    static DEPRECATIONS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// The warnings of the last parse on this thread, emptied.
pub(crate) fn take_deprecations() -> Vec<String> {
    DEPRECATIONS.with(|d| std::mem::take(&mut *d.borrow_mut()))
}

/// `d` as the config writes it.
pub fn format(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

struct DurationVisitor {
    key: &'static str,
    old: &'static str,
}

impl DurationVisitor {
    fn millis<E: Error>(&self, ms: i128) -> Result<Duration, E> {
        let ms = u64::try_from(ms)
            .map_err(|_| E::custom(format!("{ms} is not a duration in milliseconds")))?;
        let d = Duration::from_millis(ms);
        DEPRECATIONS.with(|w| {
            w.borrow_mut().push(format!(
                "config key `{}` (milliseconds) is deprecated: write `{} = \"{}\"`; it is read for this release",
                self.old,
                self.key,
                format(d)
            ))
        });
        Ok(d)
    }
}

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "a duration such as \"500ms\", \"30s\" or \"2m\"")
    }

    fn visit_i64<E: Error>(self, v: i64) -> Result<Duration, E> {
        self.millis(v.into())
    }

    fn visit_u64<E: Error>(self, v: u64) -> Result<Duration, E> {
        self.millis(v.into())
    }

    fn visit_str<E: Error>(self, v: &str) -> Result<Duration, E> {
        // An environment override arrives as text: a number there is the
        // old key's milliseconds too.
        if let Ok(ms) = v.trim().parse::<i128>() {
            return self.millis(ms);
        }
        humantime::parse_duration(v.trim()).map_err(|e| {
            E::custom(format!(
                "`{v}` is not a duration ({e}): write it like \"500ms\", \"30s\" or \"2m\""
            ))
        })
    }
}

/// Reads one duration key; `key` is its name and `old` its old `*_ms`
/// name, both as the warning shows them.
pub(crate) fn read<'de, D: Deserializer<'de>>(
    d: D,
    key: &'static str,
    old: &'static str,
) -> Result<Duration, D::Error> {
    d.deserialize_any(DurationVisitor { key, old })
}

/// A deserializer function per duration key, so each knows its names.
macro_rules! duration_keys {
    ($($fn:ident: $key:literal, $old:literal;)*) => {
        $(
            pub(crate) fn $fn<'de, D: serde::Deserializer<'de>>(
                d: D,
            ) -> Result<std::time::Duration, D::Error> {
                $crate::config::duration::read(d, $key, $old)
            }
        )*
    };
}

pub(crate) mod keys {
    duration_keys! {
        consumer_lease: "transport.consumer_lease", "transport.consumer_lease_ms";
        poll_interval: "relay.poll_interval", "relay.poll_interval_ms";
        publish_timeout: "relay.publish_timeout", "relay.publish_timeout_ms";
        lease: "relay.lease", "relay.lease_ms";
        plugin_timeout: "plugins[].limits.timeout", "plugins[].limits.timeout_ms";
        statement_timeout: "consumers[].statement_timeout", "consumers[].statement_timeout_ms";
        // A new key: a bare number is read as milliseconds with a warning
        // that shows the duration to write instead.
        kafka_stall_timeout: "consumers[].kafka_stall_timeout", "consumers[].kafka_stall_timeout";
        http_request_timeout: "plugins[].http.request_timeout", "plugins[].http.request_timeout";
        wal_standby_retry: "relay.wal.standby_retry", "relay.wal.standby_retry";
        wal_sender_timeout: "relay.wal.sender_timeout", "relay.wal.sender_timeout";
        wal_status_interval: "relay.wal.status_interval", "relay.wal.status_interval";
        nats_ack_wait: "transport.nats.ack_wait", "transport.nats.ack_wait";
        nats_fetch_wait: "transport.nats.fetch_wait", "transport.nats.fetch_wait";
        rabbitmq_fetch_wait: "transport.rabbitmq.fetch_wait", "transport.rabbitmq.fetch_wait";
        webhook_timeout: "routes[].webhook.timeout", "routes[].webhook.timeout";
    }

    /// `plugin_runtime.registry_poll`, which may be left out.
    pub(crate) fn registry_poll<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<std::time::Duration>, D::Error> {
        super::read(
            d,
            "plugin_runtime.registry_poll",
            "plugin_runtime.registry_poll_ms",
        )
        .map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct T {
        #[serde(
            rename = "poll_interval",
            alias = "poll_interval_ms",
            deserialize_with = "keys::poll_interval"
        )]
        poll: Duration,
    }

    fn parse(text: &str) -> Result<(Duration, Vec<String>), String> {
        take_deprecations();
        let t: T = toml::from_str(text).map_err(|e| e.to_string())?;
        Ok((t.poll, take_deprecations()))
    }

    #[test]
    fn strings_are_durations_and_old_milliseconds_warn() {
        assert_eq!(
            parse("poll_interval = \"500ms\"").expect("500ms"),
            (Duration::from_millis(500), vec![])
        );
        assert_eq!(
            parse("poll_interval = \"1m 30s\"").expect("1m 30s").0,
            Duration::from_secs(90)
        );
        let (d, warnings) = parse("poll_interval_ms = 250").expect("the old key");
        assert_eq!(d, Duration::from_millis(250));
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].contains("relay.poll_interval_ms")
                && warnings[0].contains("relay.poll_interval = \"250ms\""),
            "{warnings:?}"
        );
        let err = parse("poll_interval = \"soon\"").expect_err("not a duration");
        assert!(
            err.contains("`soon` is not a duration") && err.contains("\"30s\""),
            "{err}"
        );
        assert!(parse("poll_interval = -5").is_err());
    }
}
