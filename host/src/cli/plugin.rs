//! `outboxd plugin test|validate`: a component run on a sample
//! (`plugin_test`) or checked, without the daemon.
//!
//! [`PluginCommand`] also flattens in the registry subcommands (`deploy`,
//! `list`, …), which need the database and run in `cli::registry`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub(super) enum PluginCommand {
    /// Run a component on a sample and print what it did: a transformer's
    /// output messages, or a consumer's statements (with their parameters
    /// and rows), emitted events and outcome, in a transaction that is
    /// rolled back. --expect FILE makes it a golden test.
    Test(Box<super::plugin_test::TestArgs>),
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
    /// Write a ready plugin project: source, build script, sample input,
    /// expected report and README.
    New(super::plugin_new::NewArgs),
    /// Build the plugin project in DIR (default: here), installing the
    /// toolchain piece that is missing.
    Build(super::plugin_build::BuildArgs),
    #[command(flatten)]
    Registry(crate::cli::registry::RegistryCommand),
}

pub(super) async fn plugin_command(
    cmd: &PluginCommand,
    config_file: Option<&std::path::Path>,
    database_url: Option<&str>,
) -> anyhow::Result<ExitCode> {
    use crate::plugin::{EngineConfig, PluginEngine, validate};
    match cmd {
        PluginCommand::New(args) => {
            return super::plugin_new::run(args).map(|()| ExitCode::SUCCESS);
        }
        PluginCommand::Build(args) => {
            return super::plugin_build::run_build(args).map(|()| ExitCode::SUCCESS);
        }
        _ => {}
    }
    let cache = match cmd {
        PluginCommand::Test(t) if t.no_cache => crate::config::CacheDir::Off,
        _ => crate::config::CacheDir::Default,
    };
    let engine = PluginEngine::new(EngineConfig {
        cache_dir: cache.resolve(""),
        ..EngineConfig::default()
    })?;
    match cmd {
        PluginCommand::Test(args) => {
            super::plugin_test::run(&engine, args, config_file, database_url).await
        }
        PluginCommand::Registry(_) => {
            unreachable!("needs the database; dispatched with the config")
        }
        PluginCommand::New(_) | PluginCommand::Build(_) => unreachable!("dispatched above"),
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
