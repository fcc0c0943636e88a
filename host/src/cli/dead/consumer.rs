//! `outboxd dead list|show|redrive|discard --consumer NAME`: a consumer's
//! dead letters and the messages parked behind them.
//!
//! A redrive or a discard only changes the rows' state; the consumer, where
//! `outboxd run` runs it, applies what was released in order per key.

use std::process::ExitCode;

use super::DeadCommand;
use crate::cli::connect;
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
            dry_run,
            limit,
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
            if dry_run {
                let Some(configured) = configured else {
                    anyhow::bail!(
                        "a dry run needs consumer `{consumer}` in the config, to run its plugin"
                    );
                };
                return dry_run_redrive(config, &db, configured, &target, with.as_deref(), limit)
                    .await;
            }
            if let Some(with) = &with {
                consumer_dead::check_with(&db, configured.and_then(|c| c.plugin_name()), with)
                    .await?;
            }
            let faults = crate::cli::faults_from_env()?;
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

/// `dead redrive --consumer NAME --dry-run`: runs the selected dead letters
/// (the `dead` ones; parked messages follow them) through the consumer's
/// plugin, on `with`'s version or the active one, each in a transaction
/// that is rolled back, and prints each one's outcome and the plugin's
/// statements.
async fn dry_run_redrive(
    config: &Config,
    db: &crate::store::Db,
    consumer: &crate::config::ConsumerSection,
    target: &Target,
    with: Option<&str>,
    limit: i64,
) -> anyhow::Result<ExitCode> {
    use crate::consumer::Processed;
    use crate::ops::fix_forward;
    use crate::settings::ConfigExt;
    let name = consumer.name.as_str();
    let ids: Vec<i64> = match target {
        Target::Id(id) => vec![*id],
        Target::Key(k) => consumer_dead::list(db, name, Some(k), limit)
            .await?
            .into_iter()
            .filter(|r| r.state == crate::store::inbox::dead_letters::DEAD)
            .map(|r| r.id)
            .collect(),
        Target::All => consumer_dead::list(db, name, None, limit)
            .await?
            .into_iter()
            .filter(|r| r.state == crate::store::inbox::dead_letters::DEAD)
            .map(|r| r.id)
            .collect(),
    };
    let mut letters = Vec::with_capacity(ids.len());
    for id in ids {
        letters.push(consumer_dead::show(db, name, id).await?);
    }
    let engine = crate::plugin::PluginEngine::new(config.plugin_engine_config())?;
    let runs = fix_forward::consumer_dry_run(db, engine, consumer, &config.plugins, &letters, with)
        .await?;
    if runs.is_empty() {
        println!("no dead letters of consumer {name} match");
    }
    for (letter, r) in letters.iter().zip(&runs) {
        println!(
            "dead letter {}  {}/{}@{}  through {}",
            r.id,
            letter.topic,
            letter.partition,
            letter.offset,
            r.run.handled_by.as_deref().unwrap_or("no version")
        );
        match &r.run.outcome {
            Ok(Processed::Handled) => {
                println!("  would apply it: the effect commits with its inbox mark")
            }
            Ok(Processed::Duplicate) => {
                println!("  would skip it: the inbox has this message already")
            }
            Err(e) => println!("  would fail ({e})"),
        }
        for s in &r.run.statements {
            println!(
                "  {:<7} {}  -> {}",
                format!("{:?}", s.kind).to_lowercase(),
                s.text.split_whitespace().collect::<Vec<_>>().join(" "),
                s.outcome
            );
        }
    }
    println!("dry run: every transaction was rolled back; nothing was applied or changed");
    Ok(ExitCode::SUCCESS)
}
