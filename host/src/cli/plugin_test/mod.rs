//! `outboxd plugin test`: run a component of either world on a sample and
//! print what it did; `--json` prints the report, `--expect FILE` compares
//! it with a golden one and fails on a difference.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;

mod print;

use print::{print_consumer, print_transformer};

use crate::config::Limits;
use crate::config::TxnPolicy;
use crate::plugin::HttpStub;
use crate::plugin::PluginEngine;
use crate::plugin::StubResponse;
use crate::plugin::Transport;
use crate::plugin::harness::report::{ConsumerReport, TransformerReport};
use crate::plugin::harness::{
    self, consumer::ConsumerTest, expect, http_stub, message::SampleMessage,
};
use crate::plugin::validate;

#[derive(Debug, clap::Args)]
pub(super) struct TestArgs {
    /// The component (.wasm): a transformer or a consumer (told apart by
    /// its export).
    wasm: PathBuf,
    /// Transformer: the sample event, a JSON file: the event record as
    /// wit/README.md shows it (kebab-case keys, payload as text), or
    /// {"event_type": ..., "payload": <JSON>, "headers": {...}}.
    #[arg(long, value_name = "FILE")]
    event: Option<PathBuf>,
    /// Consumer: the sample message, a JSON file: {"payload": <JSON, or a
    /// string sent as text>, optional "id", "topic", "key", "headers",
    /// "attempt"}. It runs on a scratch SQLite database, or with the global
    /// --database-url inside a transaction that is always rolled back.
    #[arg(long, value_name = "FILE")]
    message: Option<PathBuf>,
    /// Consumer: SQL run first, as the host, in the same transaction
    /// (create the plugin's tables, seed rows).
    #[arg(long, value_name = "FILE")]
    setup: Option<PathBuf>,
    /// Consumer: a table the plugin may read, as consumers[].tables.read
    /// (repeatable).
    #[arg(long = "read", value_name = "TABLE")]
    read: Vec<String>,
    /// Consumer: a table the plugin may write (and read), as
    /// consumers[].tables.write (repeatable).
    #[arg(long = "write", value_name = "TABLE")]
    write: Vec<String>,
    /// Consumer, Postgres: the role the plugin's SQL runs as
    /// (consumers[].db_role). Without it the plugin's SQL runs as the
    /// login, behind the same guard and table gate.
    #[arg(long, value_name = "ROLE")]
    db_role: Option<String>,
    /// Consumer: the consumer's name, for its inbox mark. With the global
    /// --config, the [[consumers]] entry whose grants, role and budgets
    /// (and whose [[plugins]] entry's limits, settings and hosts) apply,
    /// as the daemon applies them.
    #[arg(long, default_value = "test")]
    consumer: String,
    /// Consumer: an allowed_outbound_hosts entry, scheme://host[:port]
    /// (repeatable; default none, so no request is admitted).
    #[arg(long = "allow-host", value_name = "URL")]
    allow_hosts: Vec<String>,
    /// Consumer: answer its HTTP requests from FILE, a JSON list of
    /// {"method"?, "url" (exact or prefix), "status", "headers"?, "body"?
    /// (JSON, or a string sent as text)}; nothing leaves the process.
    /// Without it (and without --http-live) no request gets an answer.
    #[arg(long, value_name = "FILE", conflicts_with = "http_live")]
    http_stub: Option<PathBuf>,
    /// Consumer: send its admitted requests to the network, with the
    /// host's checks and the idempotency header. Each leaves an audit
    /// intent in outbound_calls, committed before it is sent: on a
    /// --database-url database those rows stay (the request happened).
    #[arg(long)]
    http_live: bool,
    /// Compile the component even when the compiled-component cache
    /// (~/.cache/outboxd/components) holds it.
    #[arg(long)]
    pub(super) no_cache: bool,
    /// A plugin setting as KEY=VALUE (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    settings: Vec<String>,
    /// The call deadline [default: 50, or the --config plugin's
    /// limits.timeout].
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// The memory cap [default: 64, or the --config plugin's
    /// limits.memory_mib].
    #[arg(long)]
    memory_mib: Option<u64>,
    /// Print the report as JSON (what --expect compares).
    #[arg(long)]
    json: bool,
    /// Compare the report with FILE (a report --json printed): durations
    /// and generated ids do not count; exit 1 and print the differences
    /// when they differ.
    #[arg(long, value_name = "FILE")]
    expect: Option<PathBuf>,
}

/// Runs `outboxd plugin test`; `config_file` and `database_url` are the
/// global --config and --database-url.
pub(super) async fn run(
    engine: &PluginEngine,
    a: &TestArgs,
    config_file: Option<&Path>,
    database_url: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let bytes =
        std::fs::read(&a.wasm).with_context(|| format!("cannot read {}", a.wasm.display()))?;
    let world = validate::validate(engine, &bytes)?.world;
    let (report, ok) = match world {
        Some("transformer") => {
            let r = transformer(engine, a).await?;
            if !a.json && a.expect.is_none() {
                print_transformer(&r);
            }
            let ok = r.outcome.is_ok();
            (serde_json::to_value(&r)?, ok)
        }
        Some("consumer") => {
            let r = consumer(engine, a, config_file, database_url).await?;
            if !a.json && a.expect.is_none() {
                print_consumer(&r, database_url.is_some());
            }
            let ok = r.outcome.is_ok();
            (serde_json::to_value(&r)?, ok)
        }
        _ => anyhow::bail!(
            "{}: exports neither `transform` nor `handle`; `outboxd plugin validate {}` says what it is",
            a.wasm.display(),
            a.wasm.display()
        ),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    let Some(file) = &a.expect else {
        return Ok(if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    };
    compare(file, &report)
}

fn settings(a: &TestArgs) -> anyhow::Result<(Limits, BTreeMap<String, String>)> {
    let mut config = BTreeMap::new();
    for kv in &a.settings {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--set `{kv}` must look like KEY=VALUE"))?;
        config.insert(k.to_string(), v.to_string());
    }
    Ok((overridden(a, Limits::default()), config))
}

/// `limits` with --timeout-ms and --memory-mib applied.
fn overridden(a: &TestArgs, limits: Limits) -> Limits {
    Limits {
        timeout: a
            .timeout_ms
            .map(std::time::Duration::from_millis)
            .unwrap_or(limits.timeout),
        memory_mib: a.memory_mib.unwrap_or(limits.memory_mib),
        ..limits
    }
}

/// What a consumer runs under: from the flags, or with --config from the
/// consumer's section and its plugin's, as the daemon reads them (flags
/// --set and --allow-host add to it, --timeout-ms and --memory-mib
/// override).
struct ConsumerSetup {
    limits: Limits,
    settings: BTreeMap<String, String>,
    policy: TxnPolicy,
    allow_hosts: Vec<String>,
}

fn consumer_setup(a: &TestArgs, config_file: Option<&Path>) -> anyhow::Result<ConsumerSetup> {
    let (limits, settings) = settings(a)?;
    let Some(file) = config_file else {
        return Ok(ConsumerSetup {
            limits,
            settings,
            policy: TxnPolicy {
                consumer: a.consumer.clone(),
                tables: crate::config::TableGrants {
                    read: a.read.clone(),
                    write: a.write.clone(),
                },
                db_role: a.db_role.clone(),
                ..TxnPolicy::default()
            },
            allow_hosts: a.allow_hosts.clone(),
        });
    };
    if !a.read.is_empty() || !a.write.is_empty() || a.db_role.is_some() {
        anyhow::bail!(
            "--read, --write and --db-role come from consumers[].tables and db_role with --config {}; drop the flags or the config",
            file.display()
        );
    }
    let config = crate::config::Config::load(Some(file), std::env::vars())?;
    let Some(c) = config.consumers.iter().find(|c| c.name == a.consumer) else {
        let names: Vec<_> = config.consumers.iter().map(|c| c.name.as_str()).collect();
        anyhow::bail!(
            "--consumer {}: no [[consumers]] entry of that name in {} (there are: {})",
            a.consumer,
            file.display(),
            names.join(", ")
        );
    };
    let Some(plugin) = c.plugin_name() else {
        anyhow::bail!(
            "--consumer {}: its handler is {}, not a plugin:NAME",
            c.name,
            c.handler
        );
    };
    let Some(spec) = config.plugins.iter().find(|p| p.name == plugin) else {
        anyhow::bail!(
            "--consumer {}: plugin `{plugin}` has no [[plugins]] entry",
            c.name
        );
    };
    let mut all_settings = spec.config.clone();
    all_settings.extend(settings);
    let mut allow_hosts = spec.allowed_outbound_hosts.clone();
    allow_hosts.extend(a.allow_hosts.iter().cloned());
    Ok(ConsumerSetup {
        limits: overridden(a, spec.limits),
        settings: all_settings,
        policy: c.txn_policy(),
        allow_hosts,
    })
}

fn read(flag: &str, file: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(file).with_context(|| format!("cannot read {flag} {}", file.display()))
}

async fn transformer(engine: &PluginEngine, a: &TestArgs) -> anyhow::Result<TransformerReport> {
    let Some(event) = &a.event else {
        anyhow::bail!(
            "{} is a transformer: give it a sample event with --event FILE",
            a.wasm.display()
        );
    };
    if a.message.is_some()
        || a.setup.is_some()
        || a.http_stub.is_some()
        || a.http_live
        || !a.allow_hosts.is_empty()
    {
        anyhow::bail!(
            "{} is a transformer: --message, --setup and the HTTP flags are for consumers (transformers never get HTTP); use --event FILE",
            a.wasm.display()
        );
    }
    let sample =
        harness::SampleEvent::parse(&event.display().to_string(), &read("--event", event)?)
            .map_err(anyhow::Error::msg)?;
    let (limits, config) = settings(a)?;
    Ok(harness::transformer_report(engine, &a.wasm, &sample, limits, config).await?)
}

async fn consumer(
    engine: &PluginEngine,
    a: &TestArgs,
    config_file: Option<&Path>,
    database_url: Option<&str>,
) -> anyhow::Result<ConsumerReport> {
    let Some(file) = &a.message else {
        anyhow::bail!(
            "{} is a consumer: give it a sample message with --message FILE ({{\"payload\": ...}})",
            a.wasm.display()
        );
    };
    if a.event.is_some() {
        anyhow::bail!(
            "{} is a consumer: --event is for transformers; use --message FILE",
            a.wasm.display()
        );
    }
    let message = SampleMessage::parse(&file.display().to_string(), &read("--message", file)?)
        .map_err(anyhow::Error::msg)?;
    let setup = match &a.setup {
        Some(f) => Some((f.display().to_string(), read("--setup", f)?)),
        None => None,
    };
    let setup_of = consumer_setup(a, config_file)?;
    for h in &setup_of.allow_hosts {
        crate::config::OutboundHost::parse(h).map_err(|e| {
            anyhow::anyhow!(
                "--allow-host {h}: {e}; use {}",
                crate::config::OUTBOUND_HOST_SHAPE
            )
        })?;
    }
    let transport = if a.http_live {
        Transport::Live
    } else {
        let responses = match &a.http_stub {
            Some(f) => http_stub::parse(&f.display().to_string(), &read("--http-stub", f)?)
                .map_err(anyhow::Error::msg)?
                .into_iter()
                .map(|e| StubResponse {
                    body: e.body_bytes(),
                    method: e.method,
                    url: e.url,
                    status: e.status,
                    headers: e.headers.into_iter().collect(),
                })
                .collect(),
            None => Vec::new(),
        };
        Transport::Stub(std::sync::Arc::new(HttpStub::new(responses)))
    };
    if database_url.is_some_and(|u| u.starts_with("postgres")) && setup_of.policy.db_role.is_none()
    {
        eprintln!(
            "note: no --db-role: the plugin's SQL runs as this login, behind the guard and the table gate only; the daemon runs it as consumers[].db_role"
        );
    }
    Ok(harness::consumer::run(
        engine,
        ConsumerTest {
            wasm: &a.wasm,
            limits: setup_of.limits,
            config: setup_of.settings,
            policy: setup_of.policy,
            database_url,
            setup,
            message,
            allow_hosts: setup_of.allow_hosts,
            transport,
        },
    )
    .await?)
}

/// `--expect FILE`: the report against the golden one.
fn compare(file: &Path, report: &serde_json::Value) -> anyhow::Result<ExitCode> {
    let text = read("--expect", file)?;
    let expected: serde_json::Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "--expect {}: not JSON; write it with `outboxd plugin test ... --json > {}`",
            file.display(),
            file.display()
        )
    })?;
    let differences = expect::diff(&expect::normalize(&expected), &expect::normalize(report));
    if differences.is_empty() {
        println!("ok: the report matches {}", file.display());
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "FAILED: the report differs from {} in {} place(s):",
        file.display(),
        differences.len()
    );
    for d in &differences {
        println!("  {d}");
    }
    println!(
        "(if the change is intended, rewrite the file with `outboxd plugin test ... --json > {}`)",
        file.display()
    );
    Ok(ExitCode::FAILURE)
}
