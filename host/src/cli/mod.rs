//! The command line: parses flags, loads the config, and calls the library.
//! This is the only place (with `main`) that uses `anyhow`.

use std::path::PathBuf;
use std::process::ExitCode;

mod dead;
mod outbound;
mod plugin;
mod plugin_build;
mod plugin_new;
mod plugin_test;
mod registry;
mod route;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio::sync::watch;

use crate::config::{Config, LogFormat};
use crate::daemon::Daemon;
use crate::db_url::redact_url;
use crate::event::{Enqueued, NewEvent};
use crate::fault::Faults;
use crate::store::plugin_sql::roles::PluginRoles;
use crate::store::{AnyStore, Db, InboxTx, OutboxStore, migrate};
use dead::DeadCommand;
use outbound::OutboundCommand;
use plugin::PluginCommand;

const ABOUT: &str = "outboxd: a transactional outbox, relay and inbox.

Your service writes its business change and an event row in one local
transaction (`outboxd enqueue`, the Rust `enqueue` API, or the SQL function
outbox_enqueue). `outboxd run` relays those rows to a broker at least once,
in order per aggregate, and consumers record each message id in an inbox in
the same transaction as their effect, so a duplicate has no effect.

Start here:
  cargo run -p outboxd-demo         the example: the whole pipeline on SQLite
  outboxd migrate --config F        create or upgrade the tables
  outboxd run --config F            relay and consume until SIGTERM
  outboxd stats --config F          backlog, oldest age, dead events

Config is a TOML file (see README.md); every key can be overridden with
OUTBOXD__SECTION__KEY, e.g. OUTBOXD__DATABASE__URL=postgres://u@h/db.";

#[derive(Debug, Parser)]
#[command(name = "outboxd", version, about = ABOUT, long_about = ABOUT)]
struct Cli {
    /// TOML config file. Without it, defaults apply (SQLite file outboxd.db).
    #[arg(long, short, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Overrides database.url (sqlite://PATH or postgres://USER@HOST/DB).
    #[arg(long, global = true, value_name = "URL")]
    database_url: Option<String>,
    /// Log as JSON lines instead of human-readable text.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run relay workers and consumers until SIGTERM or SIGINT (a second
    /// signal forces the exit).
    Run,
    /// Apply pending migrations and exit. On Postgres, also creates or
    /// repairs the consumer plugins' roles when the login may create roles.
    Migrate,
    /// Postgres: create or repair each consumer plugin's role
    /// (`consumers[].db_role`) so it holds exactly `consumers[].tables`.
    PluginRoles {
        /// Print the SQL instead of running it (for a superuser to run).
        #[arg(long)]
        print: bool,
    },
    /// Print outbox health: pending, oldest pending age, failing, dead,
    /// blocked aggregates.
    Stats {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Add one event to the outbox from the shell.
    Enqueue {
        /// The entity the event is about; its events stay in order.
        #[arg(long)]
        aggregate: String,
        /// The event type, e.g. order.confirmed.
        #[arg(long = "type")]
        event_type: String,
        /// The payload, a JSON document.
        #[arg(long)]
        payload: String,
        /// A header as NAME=VALUE (repeatable), e.g. traceparent=00-...
        #[arg(long = "header", value_name = "NAME=VALUE")]
        headers: Vec<String>,
        /// Operation key: repeating it with the same payload is a no-op.
        #[arg(long)]
        key: Option<String>,
        /// Tenant that scopes the operation key.
        #[arg(long, default_value = "")]
        tenant: String,
    },
    /// The example service's demo is its own binary, `outboxd-demo`
    /// (`cargo run -p outboxd-demo`); this runs it when it is installed
    /// next to `outboxd`.
    Demo {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<String>,
    },
    /// Work with Wasm plugins without a database or a broker.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Apply retention now: delete old published rows and inbox entries in
    /// small batches (dead rows are never deleted).
    Cleanup,
    /// Benchmarks that print numbers (see BENCHMARKS.md). They are their
    /// own binary, `outboxd-bench`; this runs it when it is installed next
    /// to `outboxd`.
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<String>,
    },
    /// Inspect and act on dead events (the relay gave up on them).
    #[command(subcommand)]
    Dead(DeadCommand),
    /// Webhook routes: which are paused (their endpoint answered 410 Gone)
    /// and resuming one.
    #[command(subcommand)]
    Route(route::RouteCommand),
    /// What consumer plugins did outside the database: their HTTP requests
    /// (`outbound_calls`), by idempotency key.
    #[command(subcommand)]
    Outbound(OutboundCommand),
    /// Run the configured reconciliation queries and report business rows
    /// that have no event.
    Reconcile {
        /// Enqueue the missing events too.
        #[arg(long)]
        enqueue: bool,
    },
}

/// The `outboxd` binary: no native handlers, so its consumers are plugins.
pub fn main() -> ExitCode {
    main_with(Daemon::default())
}

/// The `outboxd` command line around `daemon`, for a binary of your own
/// that registers native handlers
/// (`main_with(Daemon::builder().handler("billing", BillingHandler).build())`).
pub fn main_with(daemon: Daemon) -> ExitCode {
    let cli = Cli::parse();
    run_main(dispatch(cli, daemon))
}

/// Runs a binary's async `main` on a multi-thread runtime and prints its
/// error, if any, as the command line does; shared by the `outboxd`,
/// `outboxd-demo` and `outboxd-bench` binaries.
pub fn run_main(main: impl std::future::Future<Output = anyhow::Result<ExitCode>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(main) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn load_config(cli: &Cli) -> anyhow::Result<Config> {
    let mut config = Config::load(cli.config.as_deref(), std::env::vars())?;
    if let Some(url) = &cli.database_url {
        config = config.with_database_url(url)?;
    }
    if cli.log_json {
        config.log.format = LogFormat::Json;
    }
    Ok(config)
}

fn init_logging(format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(log_filter())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Human => builder.try_init(),
    };
}

/// `info`, with sqlx's statement logs at `warn`, and the replication
/// client's and lapin's own logs off: the WAL relay logs each of its errors
/// with what it does next (a standby would otherwise log one "slot is
/// active" error a second), and the RabbitMQ publisher and consumers report
/// a closed channel with the fix (lapin logs every closed channel as an
/// ERROR, the start's probes for a missing queue too). `OUTBOXD_LOG`
/// replaces it.
fn log_filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_env("OUTBOXD_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,sqlx=warn,pgwire_replication=off,lapin=off")
    })
}

fn faults_from_env() -> anyhow::Result<Faults> {
    match std::env::var("OUTBOXD_FAULT") {
        Ok(spec) if !spec.is_empty() => {
            Faults::parse(&spec).map_err(|e| anyhow::anyhow!("OUTBOXD_FAULT: {e}"))
        }
        _ => Ok(Faults::none()),
    }
}

async fn dispatch(cli: Cli, daemon: Daemon) -> anyhow::Result<ExitCode> {
    match &cli.command {
        Command::Bench { args } => return forward("outboxd-bench", "outboxd-bench", args),
        Command::Demo { args } => {
            let args: Vec<String> = std::iter::once("demo".to_string())
                .chain(args.iter().cloned())
                .collect();
            return forward("outboxd-demo", "outboxd-demo", &args);
        }
        _ => {}
    }
    if let Command::Plugin(cmd) = &cli.command
        && !matches!(cmd, PluginCommand::Registry(_))
    {
        init_logging(LogFormat::Human);
        return plugin::plugin_command(cmd, cli.config.as_deref(), cli.database_url.as_deref())
            .await;
    }
    let config = load_config(&cli)?;
    init_logging(config.log.format);
    // Sends the spans left when the command returns (SIGTERM included).
    let _telemetry = crate::telemetry::Telemetry::start(&config.telemetry)?;
    for deprecated in &config.deprecations {
        tracing::warn!("{deprecated}");
    }
    let faults = faults_from_env()?;
    match cli.command {
        Command::Run => {
            let (tx, rx) = watch::channel(false);
            tokio::spawn(watch_signals(tx));
            daemon.run(config, faults, rx).await?;
            tracing::info!("stopped cleanly");
            Ok(ExitCode::SUCCESS)
        }
        Command::PluginRoles { print } => {
            let db = connect(&config).await?;
            let Some(roles) = PluginRoles::of(&db) else {
                println!(
                    "SQLite needs no roles: the authorizer confines plugin SQL to consumers[].tables"
                );
                return Ok(ExitCode::SUCCESS);
            };
            if print {
                print!("{}", roles.print_sql(&config.consumers).await?);
                return Ok(ExitCode::SUCCESS);
            }
            migrate(&db).await?;
            let ran = roles
                .provision(&config.consumers)
                .await
                .map_err(anyhow::Error::msg)?;
            for s in &ran {
                println!("{s};");
            }
            for (i, c) in config.consumers.iter().enumerate() {
                if c.plugin_name().is_some() {
                    roles.check(i, c).await?;
                    println!("consumer `{}`: role ok", c.name);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate => {
            let db = connect(&config).await?;
            let report = migrate(&db).await?;
            if let Some(roles) = PluginRoles::of(&db)
                && config
                    .consumers
                    .iter()
                    .any(|c| c.plugin_name().is_some() && c.db_role.is_some())
            {
                if roles.may_create().await? {
                    roles
                        .provision(&config.consumers)
                        .await
                        .map_err(anyhow::Error::msg)?;
                    println!("consumer plugin roles are provisioned");
                } else {
                    println!(
                        "this login may not create roles: have a superuser run the SQL of `outboxd plugin-roles --print`"
                    );
                }
            }
            if report.applied.is_empty() {
                println!("schema is up to date (version {})", report.current);
            } else {
                println!(
                    "applied {} (now at version {})",
                    report.applied.join(", "),
                    report.current
                );
            }
            if config.relay.source == crate::config::RelaySource::Wal {
                let wal = &config.relay.wal;
                let made = crate::store::outbox::wal::ensure(&db, wal).await?;
                println!(
                    "WAL relay: publication `{}` {}, replication slot `{}` {}",
                    wal.publication,
                    if made.created_publication {
                        "created"
                    } else {
                        "checked"
                    },
                    wal.slot,
                    if made.created_slot {
                        "created"
                    } else {
                        "checked"
                    },
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Stats { json } => {
            let db = connect(&config).await?;
            let now = chrono::Utc::now();
            let stats = AnyStore::new(&db, std::time::Duration::from_secs(30))
                .stats(now)
                .await?;
            let consumers = crate::ops::consumer_dead::summary(&db).await?;
            let wal = match config.relay.source {
                crate::config::RelaySource::Wal => Some(
                    crate::store::outbox::wal_status::slot_status(&db, &config.relay.wal.slot)
                        .await?,
                ),
                crate::config::RelaySource::Poll => None,
            };
            let connections = crate::store::backend::pg_tls::connections(&db).await?;
            if json {
                let mut v = serde_json::to_value(&stats)?;
                v["consumers"] = serde_json::to_value(&consumers)?;
                if let Some(connections) = &connections {
                    v["connections"] = serde_json::to_value(connections)?;
                }
                if let Some(slot) = &wal {
                    v["wal_slot"] = serde_json::to_value(slot)?;
                }
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("pending               {}", stats.pending);
                println!(
                    "oldest pending age    {:.1} s",
                    stats.oldest_pending_age_seconds
                );
                println!("failing (>=5 tries)   {}", stats.failing);
                println!("dead                  {}", stats.dead);
                println!(
                    "blocked aggregates    {} ({} events waiting)",
                    stats.blocked_aggregates, stats.blocked_events
                );
                println!("published             {}", stats.published);
                if let Some(slot) = &wal {
                    print_wal_slot(&config.relay.wal.slot, slot.as_ref());
                }
                for c in connections.iter().flatten() {
                    println!(
                        "connections           {} {} ({})",
                        c.connections,
                        c.application_name,
                        match (&c.encrypted, &c.version) {
                            (true, Some(v)) => format!("encrypted, {v}"),
                            (true, None) => "encrypted".to_string(),
                            (false, _) => "NOT encrypted".to_string(),
                        }
                    );
                }
                for c in &consumers {
                    let since = c
                        .oldest_parked_at
                        .map(|t| format!(", oldest since {}", t.format("%Y-%m-%d %H:%M:%S")))
                        .unwrap_or_default();
                    println!(
                        "consumer {:<13} dead letters {}, parked keys {} ({} messages waiting{since})",
                        c.consumer, c.dead, c.parked_keys, c.parked_messages
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Enqueue {
            aggregate,
            event_type,
            payload,
            headers,
            key,
            tenant,
        } => {
            let payload: serde_json::Value = serde_json::from_str(&payload)
                .with_context(|| format!("--payload is not valid JSON: {payload}"))?;
            let mut event = NewEvent::new(aggregate, event_type, payload);
            for h in headers {
                let (k, v) = h
                    .split_once('=')
                    .with_context(|| format!("--header `{h}` must look like NAME=VALUE"))?;
                event = event.with_header(k, v);
            }
            if let Some(key) = key {
                event = event.with_operation_key(tenant, key);
            }
            let db = connect(&config).await?;
            if config.database.migrate_on_start {
                migrate(&db).await?;
            }
            let mut tx = InboxTx::begin(&db).await?;
            let result = tx.enqueue(event).await?;
            faults
                .check(crate::fault::FaultPoint::AfterInsertBeforeCommit)
                .await?;
            tx.commit().await?;
            match result {
                Enqueued::Created(id) => println!("enqueued {id}"),
                Enqueued::Repeat(id) => {
                    println!("repeat of {id} (operation key already used with this payload)")
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin(PluginCommand::Registry(cmd)) => {
            let db = connect(&config).await?;
            if config.database.migrate_on_start {
                migrate(&db).await?;
            }
            crate::cli::registry::run(&config, db, &cmd).await
        }
        Command::Demo { .. } | Command::Bench { .. } | Command::Plugin(_) => {
            unreachable!("handled above")
        }
        Command::Cleanup => {
            let db = connect(&config).await?;
            let report =
                crate::ops::retention::cleanup(&db, &config.retention, chrono::Utc::now()).await?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Reconcile { enqueue } => {
            if config.reconcile.is_empty() {
                anyhow::bail!(
                    "no [[reconcile]] rules in the config; add one with a name and a query"
                );
            }
            let db = connect(&config).await?;
            let mut reports = Vec::new();
            for rule in &config.reconcile {
                reports.push(crate::ops::reconcile::run_rule(&db, rule, enqueue).await?);
            }
            println!("{}", serde_json::to_string_pretty(&reports)?);
            let missing: usize = reports.iter().map(|r| r.missing - r.enqueued).sum();
            Ok(if missing == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(3)
            })
        }
        Command::Dead(cmd) => dead::dead_command(&config, cmd).await,
        Command::Outbound(cmd) => outbound::command(&config, cmd).await,
        Command::Route(cmd) => route::command(&config, cmd).await,
    }
}

async fn connect(config: &Config) -> anyhow::Result<Db> {
    Db::connect_with(
        &config.database.url,
        config.database.max_connections,
        config.database.sqlite_synchronous,
    )
    .await
    .with_context(|| {
        format!(
            "cannot connect to database.url {}",
            redact_url(&config.database.url)
        )
    })
}

/// First SIGTERM or SIGINT: graceful shutdown. Second: exit at once.
async fn watch_signals(tx: watch::Sender<bool>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop outboxd with SIGKILL");
        return;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::info!("shutdown requested: finishing in-flight work (signal again to force)");
    let _ = tx.send(true);
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    eprintln!("second signal: exiting now");
    std::process::exit(130);
}

/// Runs `binary`, installed next to this executable, with `args`: the demo
/// and the benchmarks live in crates of their own, so the product carries
/// neither; `outboxd demo` and `outboxd bench` still find them.
fn forward(binary: &str, package: &str, args: &[String]) -> anyhow::Result<ExitCode> {
    let here = std::env::current_exe().context("cannot locate the running outboxd executable")?;
    let path = here.with_file_name(binary);
    if !path.is_file() {
        anyhow::bail!(
            "{binary} is not installed next to {}; run it from a checkout with `cargo run --release -p {package} -- {}` (or build it with `cargo build --release -p {package}`)",
            here.display(),
            args.join(" ")
        );
    }
    let status = std::process::Command::new(&path)
        .args(args)
        .status()
        .with_context(|| format!("cannot run {}", path.display()))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}

/// `outboxd stats` with `relay.source = "wal"`: the replication slot.
fn print_wal_slot(name: &str, slot: Option<&crate::store::outbox::wal_status::SlotStatus>) {
    let Some(s) = slot else {
        println!(
            "wal slot              {name}: missing (`outboxd migrate` or a WAL-mode `outboxd run` creates it)"
        );
        return;
    };
    println!("wal slot              {}", s.slot);
    match s.active_pid {
        Some(pid) => println!("  reader pid          {pid}"),
        None => println!("  reader pid          none: no process reads the slot"),
    }
    println!(
        "  retained WAL        {} bytes ({:.1} MiB){}",
        s.retained_bytes,
        s.retained_bytes as f64 / (1024.0 * 1024.0),
        match s.wal_status.as_deref() {
            Some(st) if st != "reserved" => format!(", wal_status {st}"),
            _ => String::new(),
        }
    );
    println!(
        "  confirmed flush LSN {}",
        s.confirmed_flush_lsn.as_deref().unwrap_or("none")
    );
}
