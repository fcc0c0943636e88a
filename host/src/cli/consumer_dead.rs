//! `outboxd dead list|show|redrive|discard --consumer NAME`: a consumer's
//! dead letters and the messages parked behind them.
//!
//! A redrive or a discard only changes the rows' state; the consumer, where
//! `outboxd run` runs it, applies what was released in order per key.

use std::process::ExitCode;

use super::connect;
use super::dead::DeadCommand;
use crate::config::Config;
use crate::ops::consumer_dead::{self, Target};

pub(super) async fn command(
    config: &Config,
    consumer: &str,
    cmd: DeadCommand,
) -> anyhow::Result<ExitCode> {
    let configured = config.consumers.iter().find(|c| c.name == consumer);
    let db = connect(config).await?;
    if configured.is_none()
        && consumer_dead::list(&db, consumer, None, 1)
            .await?
            .is_empty()
    {
        let names: Vec<&str> = config.consumers.iter().map(|c| c.name.as_str()).collect();
        anyhow::bail!(
            "no consumer named `{consumer}` in the config, and no dead letters of one (consumers: {})",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        );
    }
    match cmd {
        DeadCommand::List {
            key,
            json,
            limit,
            event_type,
            aggregate,
            ..
        } => {
            if event_type.is_some() || aggregate.is_some() {
                anyhow::bail!(
                    "--type and --aggregate select relay events; with --consumer, select by --key"
                );
            }
            let rows = consumer_dead::list(&db, consumer, key.as_deref(), limit).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
                return Ok(ExitCode::SUCCESS);
            }
            if rows.is_empty() {
                println!("no dead letters or parked messages for consumer {consumer}");
            }
            for r in rows {
                let key = match &r.key {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Null => "-".into(),
                    other => other.to_string(),
                };
                println!(
                    "{:>8}  {:<7}  {}  key {:<20} {}/{}@{}  attempts {:<3} {}",
                    r.id,
                    r.state,
                    r.dead_at.format("%Y-%m-%d %H:%M:%S"),
                    key,
                    r.topic,
                    r.partition,
                    r.offset,
                    r.attempts,
                    if r.state == "parked" {
                        "waits behind its key's dead letter".to_string()
                    } else {
                        format!("{} ({})", r.error, r.handler)
                    }
                );
            }
        }
        DeadCommand::Show { seq: id, .. } => {
            let row = consumer_dead::show(&db, consumer, id).await?;
            println!("{}", serde_json::to_string_pretty(&row)?);
        }
        DeadCommand::Redrive {
            id,
            key,
            with,
            seq,
            event_type,
            aggregate,
            all,
            ..
        } => {
            if seq.is_some() || event_type.is_some() || aggregate.is_some() {
                anyhow::bail!(
                    "--seq, --type and --aggregate select relay events; with --consumer, say --id N, --key K or --all"
                );
            }
            let target = match (id, key, all) {
                (Some(id), None, false) => Target::Id(id),
                (None, Some(k), false) => Target::Key(k),
                (None, None, true) => Target::All,
                _ => anyhow::bail!(
                    "say which dead letters of consumer {consumer} to redrive: --id N, --key K, or --all"
                ),
            };
            if let Some(with) = &with {
                consumer_dead::check_with(&db, configured.and_then(|c| c.plugin_name()), with)
                    .await?;
            }
            let faults = super::faults_from_env()?;
            let n =
                consumer_dead::redrive(&db, consumer, &target, with.as_deref(), &faults).await?;
            let through = with.map(|w| format!(" through {w}")).unwrap_or_default();
            println!(
                "released {n} dead letter(s) of consumer {consumer}{through}; the running consumer applies them, and the messages parked behind them, in order"
            );
        }
        DeadCommand::Discard {
            seq: id, reason, ..
        } => {
            let d = consumer_dead::discard(&db, consumer, id, &reason, chrono::Utc::now()).await?;
            println!(
                "discarded dead letter {id} of consumer {consumer}: {reason}; {} parked message(s) behind it now run in order",
                d.released
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
