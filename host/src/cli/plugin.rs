//! `outboxd plugin test|validate`: a component run or checked without a
//! database or a broker.
//!
//! [`PluginCommand`] also flattens in the registry subcommands (`deploy`,
//! `list`, …), which need the database and run in `cli::registry`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub(super) enum PluginCommand {
    /// Run a transformer component on a sample event and print its outputs
    /// (or its error).
    Test {
        /// The component (.wasm).
        wasm: PathBuf,
        /// A JSON file: the event record as wit/README.md shows it
        /// (kebab-case keys, payload as text), or {"event_type": ...,
        /// "payload": <JSON>, "headers": {...}}.
        #[arg(long, value_name = "FILE")]
        event: PathBuf,
        /// Compile the component even when the compiled-component cache
        /// (~/.cache/outboxd/components) holds it.
        #[arg(long)]
        no_cache: bool,
        /// A plugin setting as KEY=VALUE (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        settings: Vec<String>,
        /// The call deadline.
        #[arg(long, default_value_t = 50)]
        timeout_ms: u64,
        /// The memory cap.
        #[arg(long, default_value_t = 64)]
        memory_mib: u64,
    },
    /// Check that a file is a component, which world it implements, its WIT
    /// version, and that its imports are allowed.
    Validate {
        wasm: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// An `allowed_outbound_hosts` entry the plugin will have
        /// (repeatable): a consumer importing wasi:http needs at least one.
        #[arg(long = "allow-host", value_name = "URL")]
        allow_hosts: Vec<String>,
    },
    #[command(flatten)]
    Registry(crate::cli::registry::RegistryCommand),
}

pub(super) async fn plugin_command(cmd: &PluginCommand) -> anyhow::Result<ExitCode> {
    use crate::plugin::{EngineConfig, Limits, PluginEngine, harness, validate};
    let cache = match cmd {
        PluginCommand::Test { no_cache: true, .. } => crate::config::CacheDir::Off,
        _ => crate::config::CacheDir::Default,
    };
    let engine = PluginEngine::new(EngineConfig {
        cache_dir: cache.resolve(""),
        ..EngineConfig::default()
    })?;
    match cmd {
        PluginCommand::Test {
            wasm,
            event,
            settings,
            timeout_ms,
            memory_mib,
            no_cache: _,
        } => {
            let text = std::fs::read_to_string(event)
                .with_context(|| format!("cannot read --event {}", event.display()))?;
            let sample = harness::SampleEvent::parse(&event.display().to_string(), &text)
                .map_err(anyhow::Error::msg)?;
            let mut config = std::collections::BTreeMap::new();
            for kv in settings {
                let (k, v) = kv
                    .split_once('=')
                    .with_context(|| format!("--set `{kv}` must look like KEY=VALUE"))?;
                config.insert(k.to_string(), v.to_string());
            }
            let limits = Limits {
                timeout: std::time::Duration::from_millis(*timeout_ms),
                memory_mib: *memory_mib,
                ..Limits::default()
            };
            match harness::run_once(&engine, wasm, &sample, limits, config).await {
                Ok(messages) if messages.is_empty() => {
                    println!("filtered: the plugin returned no messages");
                    Ok(ExitCode::SUCCESS)
                }
                Ok(messages) => {
                    for (i, m) in messages.iter().enumerate() {
                        let payload = String::from_utf8_lossy(&m.payload);
                        let pretty = serde_json::from_slice::<serde_json::Value>(&m.payload)
                            .and_then(|v| serde_json::to_string_pretty(&v))
                            .unwrap_or_else(|_| payload.into_owned());
                        println!("message {i}:");
                        println!(
                            "  topic:   {}",
                            m.topic.as_deref().unwrap_or("(the route's topic)")
                        );
                        println!("  key:     {}", String::from_utf8_lossy(&m.key));
                        for (k, v) in &m.headers {
                            println!("  header:  {k}: {v}");
                        }
                        println!("  payload: {}", pretty.replace('\n', "\n           "));
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    println!("error ({}): {e}", e.kind().name());
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        PluginCommand::Registry(_) => {
            unreachable!("needs the database; dispatched with the config")
        }
        PluginCommand::Validate {
            wasm,
            json,
            allow_hosts,
        } => {
            for h in allow_hosts {
                outboxd_core::config::OutboundHost::parse(h).map_err(|e| {
                    anyhow::anyhow!(
                        "--allow-host {h}: {e}; use {}",
                        outboxd_core::config::OUTBOUND_HOST_SHAPE
                    )
                })?;
            }
            let bytes =
                std::fs::read(wasm).with_context(|| format!("cannot read {}", wasm.display()))?;
            let v = validate::validate_with_hosts(&engine, &bytes, allow_hosts)?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("file:        {} (a component)", wasm.display());
                println!("world:       {}", v.world.unwrap_or("(none recognised)"));
                println!(
                    "wit version: {}",
                    v.wit_version.as_deref().unwrap_or(
                        "(no outbox:plugin import; the export type-checks against 0.1.0 if no problem is listed)"
                    )
                );
                println!("imports:");
                for (name, verdict) in &v.imports {
                    let verdict = match verdict {
                        validate::Verdict::Allowed => "allowed".to_string(),
                        validate::Verdict::Denied(why) => format!("linked, denied: {why}"),
                        validate::Verdict::Missing => "NOT PROVIDED".to_string(),
                    };
                    println!("  {name:<45} {verdict}");
                }
                if v.is_ok() {
                    println!("ok: runs in this outboxd ({})", validate::WIT_PACKAGE);
                } else {
                    for p in &v.problems {
                        println!("problem: {p}");
                    }
                }
            }
            Ok(if v.is_ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}
