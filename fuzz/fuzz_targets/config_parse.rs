//! Config parsing: any text (and any `OUTBOXD__` overrides) gives a config
//! or an error, never a panic. The input is TOML, optionally followed by a
//! NUL byte and `KEY=VALUE` lines that become `OUTBOXD__KEY` variables.
#![no_main]

use libfuzzer_sys::fuzz_target;
use outboxd_core::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (toml, env) = text.split_once('\0').unwrap_or((text, ""));
    let env: Vec<(String, String)> = env
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (format!("OUTBOXD__{k}"), v.to_string()))
        .collect();
    match Config::from_toml("fuzz.toml", toml, env) {
        Ok(config) => {
            // A valid config keeps the promises `validate` makes.
            assert!(config.relay.batch_size >= 1 && config.relay.batch_size <= 10_000);
            assert!(config.relay.lease > config.relay.publish_timeout);
            if config.admin.enabled {
                assert!(config.admin.token.as_ref().is_some_and(|t| t.len() >= 16));
            }
            let _ = config.redacted_kafka();
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
