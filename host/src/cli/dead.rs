//! `outboxd dead list|show|redrive|discard`: the dead events of the outbox,
//! or with `--consumer NAME` that consumer's dead letters
//! (`cli/consumer_dead.rs`). A consumer dead letter's id and an outbox row's
//! seq are distinct namespaces; `--consumer` selects which one.

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
        /// Fix-forward: run the redriven messages through this registry
        /// version (a candidate included), not the active one.
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
    if let Some(consumer) = cmd.consumer() {
        let consumer = consumer.to_string();
        return super::consumer_dead::command(config, &consumer, cmd).await;
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
            ..
        } => {
            if with.is_some() {
                anyhow::bail!(
                    "--with on relay events is not supported yet; use it with --consumer"
                );
            }
            if seq.is_none() && event_type.is_none() && aggregate.is_none() && !all {
                anyhow::bail!(
                    "say which dead events to redrive: --seq N, --type T, --aggregate A, or --all"
                );
            }
            let n = dead::redrive(
                &db,
                &DeadFilter {
                    seq,
                    event_type,
                    aggregate_id: aggregate,
                },
                chrono::Utc::now(),
            )
            .await?;
            println!("redrove {n} dead event(s); the relay will publish them now");
        }
        DeadCommand::Discard { seq, reason, .. } => {
            dead::discard(&db, seq, &reason, chrono::Utc::now()).await?;
            println!("discarded outbox row {seq}: {reason}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
