//! `outboxd route list` and `outboxd route resume NAME`: the webhook
//! routes an endpoint stopped with 410 Gone, and giving one back its
//! deliveries (its waiting events then go out in order).

use std::process::ExitCode;

use clap::Subcommand;

use super::connect;
use crate::config::Config;
use crate::store::outbox::route_pauses;

#[derive(Debug, Subcommand)]
pub(super) enum RouteCommand {
    /// The config's webhook routes and whether each is paused.
    List,
    /// Let a paused webhook route deliver again.
    Resume {
        /// The route's `name`.
        name: String,
    },
}

pub(super) async fn command(config: &Config, cmd: RouteCommand) -> anyhow::Result<ExitCode> {
    let db = connect(config).await?;
    let paused = route_pauses::paused(&db).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot read route_pauses: {e}; run `outboxd migrate` if the database predates it"
        )
    })?;
    let webhooks: Vec<&str> = config
        .routes
        .iter()
        .filter(|r| r.webhook.is_some())
        .filter_map(|r| r.name.as_deref())
        .collect();
    match cmd {
        RouteCommand::List => {
            for name in &webhooks {
                match paused.iter().find(|p| p.route == *name) {
                    Some(p) => println!(
                        "{name}\tpaused since {}\t{}",
                        p.paused_at.to_rfc3339(),
                        p.reason
                    ),
                    None => println!("{name}\tdelivering"),
                }
            }
            for p in paused
                .iter()
                .filter(|p| !webhooks.contains(&p.route.as_str()))
            {
                println!("{}\tpaused, not in this config\t{}", p.route, p.reason);
            }
            Ok(ExitCode::SUCCESS)
        }
        RouteCommand::Resume { name } => {
            if route_pauses::resume(&db, &name).await? {
                println!(
                    "resumed webhook route `{name}`: running relays send its waiting events within seconds, in order"
                );
                return Ok(ExitCode::SUCCESS);
            }
            if webhooks.contains(&name.as_str()) {
                println!("webhook route `{name}` is not paused; nothing to do");
                return Ok(ExitCode::SUCCESS);
            }
            anyhow::bail!(
                "no webhook route `{name}` is paused, and the config has none of that name (its webhook routes: {}); \
                 see `outboxd route list`",
                if webhooks.is_empty() {
                    "none".to_string()
                } else {
                    webhooks.join(", ")
                }
            )
        }
    }
}
