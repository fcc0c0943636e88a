//! `outboxd outbound list`: the HTTP requests consumer plugins sent, from
//! the `outbound_calls` audit, grouped by idempotency key; with
//! `--unresolved`, only the keys reconciliation must check with the
//! provider (see `ops/outbound.rs` and docs/runbook.md).

use std::process::ExitCode;

use clap::Subcommand;

use super::connect;
use crate::config::Config;
use crate::ops::outbound::{self, Filter, KeyCalls};

#[derive(Debug, Subcommand)]
pub(super) enum OutboundCommand {
    /// List outbound calls by idempotency key (= the message id), oldest
    /// key first.
    List {
        /// Only keys with a call that has no recorded outcome, or with the
        /// same request sent more than once: ask the provider about these.
        #[arg(long)]
        unresolved: bool,
        /// Only this idempotency key.
        #[arg(long, value_name = "KEY")]
        key: Option<String>,
        /// Only the calls of this message id.
        #[arg(long, value_name = "ID")]
        message: Option<String>,
        /// At most this many keys.
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

pub(super) async fn command(config: &Config, cmd: OutboundCommand) -> anyhow::Result<ExitCode> {
    let OutboundCommand::List {
        unresolved,
        key,
        message,
        limit,
        json,
    } = cmd;
    if limit < 1 {
        anyhow::bail!("--limit must be at least 1, got {limit}");
    }
    let db = connect(config).await?;
    let filter = Filter {
        key,
        message_id: message,
        unresolved,
        limit,
    };
    let keys = outbound::list(&db, &filter).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot read outbound_calls: {e}; run `outboxd migrate` if the database predates it"
        )
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&keys)?);
    } else {
        print_text(&keys, unresolved);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_text(keys: &[KeyCalls], unresolved: bool) {
    if keys.is_empty() {
        println!(
            "{}",
            if unresolved {
                "no unresolved outbound calls"
            } else {
                "no outbound calls"
            }
        );
    }
    for k in keys {
        let verdict = if k.unresolved { "UNRESOLVED" } else { "ok" };
        println!("key {}  {verdict}", k.idempotency_key);
        for reason in &k.reasons {
            println!("  ! {reason}");
        }
        for c in &k.calls {
            let outcome = match (&c.status, &c.error) {
                (Some(s), _) => format!("{s}"),
                (None, Some(e)) => format!("error: {e}"),
                (None, None) => "NO OUTCOME".into(),
            };
            let took = c
                .duration_ms
                .map(|ms| format!(" in {ms} ms"))
                .unwrap_or_default();
            println!(
                "  {}  {} {}  {outcome}{took}  message {}  {} ({})",
                c.started_at.format("%Y-%m-%d %H:%M:%S%.3f"),
                c.method,
                c.url,
                c.message_id,
                c.consumer,
                c.plugin
            );
        }
    }
}
