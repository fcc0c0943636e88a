//! `outboxd plugin deploy|list|activate|rollback|retire|shadow`: the
//! registry from the command line. Glue only; the work is in
//! [`crate::plugin::lifecycle::registry`].

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;

use crate::config::Config;
use crate::config::PluginSpec;
use crate::plugin::PluginEngine;
use crate::plugin::harness::SampleEvent;
use crate::plugin::lifecycle::registry::Deployed;
use crate::plugin::lifecycle::registry::Registry;
use crate::settings::ConfigExt;
use crate::store::Db;
use crate::store::registry::PluginRecord;

#[derive(Debug, Clone, Subcommand)]
pub enum RegistryCommand {
    /// Check a component and store it as the next version of a plugin (a
    /// candidate: nothing runs it until `activate` or `shadow`).
    Deploy {
        wasm: PathBuf,
        #[arg(long)]
        name: String,
        /// A sample event file, or a directory of `*.json` sample events;
        /// each must transform without an error.
        #[arg(long, value_name = "DIR|FILE")]
        samples: Option<PathBuf>,
        /// Recorded as deployed_by.
        #[arg(long, value_name = "WHO", default_value = "cli")]
        by: String,
        /// Activate the version right after deploying it.
        #[arg(long)]
        activate: bool,
    },
    /// Every stored version with its state and shadow counters.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Make VERSION the active version of NAME on every host.
    Activate {
        name: String,
        version: i64,
        #[arg(long, value_name = "WHO", default_value = "cli")]
        by: String,
    },
    /// Re-activate the version that was active before the current one.
    Rollback {
        name: String,
        #[arg(long, value_name = "WHO", default_value = "cli")]
        by: String,
    },
    /// Retire a version that is not active; it can never run again.
    Retire { name: String, version: i64 },
    /// Run a candidate in shadow next to the active version: its outputs are
    /// compared, never published.
    Shadow {
        name: String,
        version: i64,
        /// Stop the shadow run instead.
        #[arg(long)]
        off: bool,
        /// Promote after this many events with no mismatch and no error.
        #[arg(long, value_name = "N")]
        auto_promote_after: Option<i64>,
    },
}

pub async fn run(config: &Config, db: Db, cmd: &RegistryCommand) -> anyhow::Result<ExitCode> {
    let registry = Registry::new(db);
    let record = match cmd {
        RegistryCommand::Deploy {
            wasm,
            name,
            samples,
            by,
            activate,
        } => {
            let bytes =
                std::fs::read(wasm).with_context(|| format!("cannot read {}", wasm.display()))?;
            let samples = match samples {
                Some(path) => read_samples(path)?,
                None => Vec::new(),
            };
            let spec = config
                .plugins
                .iter()
                .find(|s| s.name == *name)
                .cloned()
                .unwrap_or_else(|| PluginSpec::new(name, wasm));
            let engine = PluginEngine::new(config.plugin_engine_config())?;
            let expected_world = if config
                .consumers
                .iter()
                .any(|c| c.plugin_name() == Some(name.as_str()))
            {
                Some("consumer")
            } else if config.routes.iter().any(|r| r.transformers.contains(name)) {
                Some("transformer")
            } else {
                None
            };
            let deployed = match registry
                .deploy_as(&engine, &spec, &bytes, &samples, by, expected_world)
                .await
            {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("error: {e}");
                    return Ok(ExitCode::FAILURE);
                }
            };
            let r = match &deployed {
                Deployed::Created(r) => {
                    println!(
                        "deployed {} (sha256 {}) as a candidate",
                        r.label(),
                        r.sha256
                    );
                    r.clone()
                }
                Deployed::Unchanged(r) => {
                    println!(
                        "unchanged: these bytes are already {} ({})",
                        r.label(),
                        r.state
                    );
                    r.clone()
                }
            };
            if *activate {
                registry.activate(name, r.version, by).await?
            } else {
                r
            }
        }
        RegistryCommand::List { json } => {
            let records = registry.list().await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&records)?);
            } else {
                print_table(&records);
            }
            return Ok(ExitCode::SUCCESS);
        }
        RegistryCommand::Activate { name, version, by } => {
            registry.activate(name, *version, by).await?
        }
        RegistryCommand::Rollback { name, by } => registry.rollback(name, by).await?,
        RegistryCommand::Retire { name, version } => registry.retire(name, *version).await?,
        RegistryCommand::Shadow {
            name,
            version,
            off,
            auto_promote_after,
        } => {
            registry
                .shadow(name, *version, !off, *auto_promote_after)
                .await?
        }
    };
    let shadow = if record.shadow { ", in shadow" } else { "" };
    println!("{}: {}{shadow}", record.label(), record.state);
    Ok(ExitCode::SUCCESS)
}

fn read_samples(path: &Path) -> anyhow::Result<Vec<SampleEvent>> {
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("cannot read {}", path.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_path_buf()]
    };
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read {}", f.display()))?;
            SampleEvent::parse(&f.display().to_string(), &text).map_err(anyhow::Error::msg)
        })
        .collect()
}

fn print_table(records: &[PluginRecord]) {
    println!(
        "{:<20} {:>4} {:<10} {:<7} {:<12} {:<20} {:>8} {:>8} {:>6}",
        "NAME", "VER", "STATE", "SHADOW", "SHA256", "DEPLOYED BY", "MATCHES", "MISMATCH", "ERRORS"
    );
    for r in records {
        let s = &r.shadow_stats;
        println!(
            "{:<20} {:>4} {:<10} {:<7} {:<12} {:<20} {:>8} {:>8} {:>6}",
            r.name,
            r.version,
            r.state,
            if r.shadow { "yes" } else { "" },
            &r.sha256[..12],
            r.deployed_by,
            s.matches,
            s.mismatches,
            s.errors
        );
        for sample in &s.samples {
            println!("    mismatch: {sample}");
        }
    }
}
