//! `outboxd dead list|show|redrive|discard`: the dead events of the outbox.

use std::process::ExitCode;

use clap::Subcommand;

use super::connect;
use crate::config::Config;

#[derive(Debug, Subcommand)]
pub(super) enum DeadCommand {
    /// List dead events, oldest first.
    List {
        /// Only this event type or pattern (order.*).
        #[arg(long = "type")]
        event_type: Option<String>,
        #[arg(long)]
        aggregate: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// Show one dead event in full, as JSON.
    Show { seq: i64 },
    /// Make dead events pending again with zero attempts.
    Redrive {
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
    /// Finish a dead event without publishing it, recording why.
    Discard {
        seq: i64,
        #[arg(long)]
        reason: String,
    },
}

pub(super) async fn dead_command(config: &Config, cmd: DeadCommand) -> anyhow::Result<ExitCode> {
    use crate::ops::dead::{self, DeadFilter};
    let db = connect(config).await?;
    match cmd {
        DeadCommand::List {
            event_type,
            aggregate,
            limit,
        } => {
            let filter = DeadFilter {
                seq: None,
                event_type,
                aggregate_id: aggregate,
            };
            let events = dead::list(&db, &filter, limit).await?;
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
        DeadCommand::Show { seq } => match dead::get(&db, seq).await? {
            Some(e) => println!("{}", serde_json::to_string_pretty(&e)?),
            None => anyhow::bail!("outbox row {seq} is not a dead event (see `outboxd dead list`)"),
        },
        DeadCommand::Redrive {
            seq,
            event_type,
            aggregate,
            all,
        } => {
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
        DeadCommand::Discard { seq, reason } => {
            dead::discard(&db, seq, &reason, chrono::Utc::now()).await?;
            println!("discarded outbox row {seq}: {reason}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
