//! `outboxd dead list|show|redrive|discard`: the dead events of the outbox,
//! or with `--consumer NAME` that consumer's dead letters
//! (`cli/dead/consumer.rs`). A consumer dead letter's id and an outbox row's
//! seq are distinct namespaces; `--consumer` selects which one.

mod consumer;

use std::process::ExitCode;

use clap::Subcommand;

use super::connect;
use crate::config::Config;

#[derive(Debug, Subcommand)]
pub(super) enum DeadCommand {
    /// List dead events, oldest first.
    List {
        /// A consumer's dead letters and parked messages instead.
        #[arg(long)]
        consumer: Option<String>,
        /// With --consumer: only this key.
        #[arg(long, requires = "consumer")]
        key: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Only this event type or pattern (order.*).
        #[arg(long = "type")]
        event_type: Option<String>,
        #[arg(long)]
        aggregate: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// Show one dead event in full, as JSON (with --consumer, that
    /// consumer's dead letter ID: payload, headers, error, attempts, version).
    Show {
        #[arg(long)]
        consumer: Option<String>,
        #[arg(value_name = "SEQ|ID")]
        seq: i64,
    },
    /// Make dead events pending again with zero attempts (with --consumer,
    /// release that consumer's dead letters, which it then applies in order
    /// per key, the messages parked behind them following).
    Redrive {
        #[arg(long)]
        consumer: Option<String>,
        /// With --consumer: one dead letter by id.
        #[arg(long, requires = "consumer", conflicts_with_all = ["key", "all", "seq"])]
        id: Option<i64>,
        /// With --consumer: every dead letter of this key.
        #[arg(long, requires = "consumer", conflicts_with_all = ["all"])]
        key: Option<String>,
        /// Fix-forward: run the redriven events through this registry
        /// version of one of their route's transformers (with --consumer,
        /// of the consumer's plugin), a candidate included, instead of the
        /// active one, without activating it.
        #[arg(long = "with", value_name = "NAME@VERSION")]
        with: Option<String>,
        /// One event by seq.
        #[arg(long, conflicts_with_all = ["event_type", "aggregate", "all"])]
        seq: Option<i64>,
        #[arg(long = "type")]
        event_type: Option<String>,
        #[arg(long)]
        aggregate: Option<String>,
        /// Every dead event (required when no other filter is given).
        #[arg(long)]
        all: bool,
        /// Show what they would publish (per event: topic, key, headers,
        /// payload, or the error; with --consumer, per message: the outcome
        /// and the plugin's statements, in a transaction rolled back),
        /// changing nothing.
        #[arg(long)]
        dry_run: bool,
        /// With --dry-run: at most this many events, oldest first.
        #[arg(long, default_value_t = 50, requires = "dry_run")]
        limit: i64,
    },
    /// Finish a dead event without publishing it, recording why (with
    /// --consumer, resolve that consumer's dead letter ID unapplied; the
    /// messages parked behind it then run in order).
    Discard {
        #[arg(long)]
        consumer: Option<String>,
        #[arg(value_name = "SEQ|ID")]
        seq: i64,
        #[arg(long)]
        reason: String,
    },
}

impl DeadCommand {
    fn consumer(&self) -> Option<&str> {
        match self {
            DeadCommand::List { consumer, .. }
            | DeadCommand::Show { consumer, .. }
            | DeadCommand::Redrive { consumer, .. }
            | DeadCommand::Discard { consumer, .. } => consumer.as_deref(),
        }
    }
}

pub(super) async fn dead_command(config: &Config, cmd: DeadCommand) -> anyhow::Result<ExitCode> {
    use crate::ops::dead::{self, DeadFilter};
    use crate::ops::fix_forward;
    use crate::settings::ConfigExt;
    if let Some(consumer) = cmd.consumer() {
        let consumer = consumer.to_string();
        return consumer::command(config, &consumer, cmd).await;
    }
    let db = connect(config).await?;
    match cmd {
        DeadCommand::List {
            event_type,
            aggregate,
            limit,
            json,
            ..
        } => {
            let filter = DeadFilter {
                seq: None,
                event_type,
                aggregate_id: aggregate,
            };
            let events = dead::list(&db, &filter, limit).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&events)?);
                return Ok(ExitCode::SUCCESS);
            }
            if events.is_empty() {
                println!("no dead events");
            }
            for e in events {
                println!(
                    "{:>8}  {}  {:<24} {:<20} attempts {:<3} blocking {:<4} {}",
                    e.seq,
                    e.dead_at.format("%Y-%m-%d %H:%M:%S"),
                    e.event_type,
                    e.aggregate_id,
                    e.attempts,
                    e.blocking,
                    e.dead_reason
                );
            }
        }
        DeadCommand::Show { seq, .. } => match dead::get(&db, seq).await? {
            Some(e) => println!("{}", serde_json::to_string_pretty(&e)?),
            None => anyhow::bail!("outbox row {seq} is not a dead event (see `outboxd dead list`)"),
        },
        DeadCommand::Redrive {
            seq,
            event_type,
            aggregate,
            all,
            with,
            dry_run,
            limit,
            ..
        } => {
            if seq.is_none() && event_type.is_none() && aggregate.is_none() && !all {
                anyhow::bail!(
                    "say which dead events to redrive: --seq N, --type T, --aggregate A, or --all"
                );
            }
            let filter = DeadFilter {
                seq,
                event_type,
                aggregate_id: aggregate,
            };
            let pipeline = fix_forward::Pipeline {
                routes: &config.routes,
                plugins: &config.plugins,
            };
            if dry_run {
                let engine = crate::plugin::PluginEngine::new(config.plugin_engine_config())?;
                let events =
                    fix_forward::dry_run(&db, engine, pipeline, &filter, with.as_deref(), limit)
                        .await?;
                print_dry_run(&events, with.as_deref());
                return Ok(ExitCode::SUCCESS);
            }
            let n = match &with {
                Some(label) => {
                    fix_forward::redrive_with(&db, pipeline, &filter, label, chrono::Utc::now())
                        .await?
                }
                None => dead::redrive(&db, &filter, chrono::Utc::now()).await?,
            };
            match with {
                Some(label) => println!(
                    "redrove {n} dead event(s) through {label}; the relay will publish them now (live traffic stays on the active version)"
                ),
                None => println!("redrove {n} dead event(s); the relay will publish them now"),
            }
        }
        DeadCommand::Discard { seq, reason, .. } => {
            dead::discard(&db, seq, &reason, chrono::Utc::now()).await?;
            println!("discarded outbox row {seq}: {reason}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints a redrive's dry run: per event, what the relay would publish
/// (topic, key, headers, payload), or that it would drop it, or the error.
fn print_dry_run(events: &[crate::ops::fix_forward::DryRunEvent], with: Option<&str>) {
    use crate::ops::fix_forward::DryRunOutcome;
    let text = |bytes: &[u8]| match std::str::from_utf8(bytes) {
        Ok(t) => t.to_string(),
        Err(_) => format!("hex:{}", hex::encode(bytes)),
    };
    if events.is_empty() {
        println!("no dead events match");
    }
    for e in events {
        let through = if e.chain.is_empty() {
            "no plugins".to_string()
        } else {
            e.chain.clone()
        };
        println!(
            "seq {}  {}  aggregate {}  through {through}",
            e.seq, e.event_type, e.aggregate_id
        );
        match &e.outcome {
            DryRunOutcome::Publish(messages) => {
                println!("  would publish {} message(s):", messages.len());
                for (i, m) in messages.iter().enumerate() {
                    println!(
                        "  [{i}] topic {}  key {}  message-id {}",
                        m.topic,
                        text(&m.key),
                        m.message_id
                    );
                    for (name, value) in &m.headers {
                        println!("      header {name}: {}", text(value));
                    }
                    println!("      payload {}", text(&m.payload));
                }
            }
            DryRunOutcome::Dropped => {
                println!("  would drop it: the chain returned no message (marked filtered)")
            }
            DryRunOutcome::Failed { error, permanent } => println!(
                "  would fail ({}): {error}",
                if *permanent {
                    "permanent: dead again"
                } else {
                    "retryable"
                }
            ),
        }
    }
    match with {
        Some(label) => println!("dry run through {label}: nothing was published or changed"),
        None => println!("dry run on the active versions: nothing was published or changed"),
    }
}
