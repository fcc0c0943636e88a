//! Two `outboxd run` processes on one database (Postgres: LISTEN/NOTIFY;
//! SQLite: polling) switch their registry consumer plugin when `outboxd
//! plugin activate` (a third process) commits; the latency is measured and
//! printed.

use std::process::Stdio;
use std::time::{Duration, Instant};

use outboxd_demo::billing;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

use crate::support::plugins::plugin_path;
use crate::support::process::outboxd_with_config as outboxd;
use crate::support::swap::put_order;
use crate::support::{TestDb, eventually, on_both};

async fn cli(config: &std::path::Path, args: &[&str]) {
    let out = outboxd(config)
        .args(args)
        .output()
        .await
        .expect("run the outboxd CLI");
    assert!(
        out.status.success(),
        "outboxd {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Sends (time, line) for every `registry plugins swapped in` log line.
fn swaps_of(child: &mut tokio::process::Child) -> mpsc::UnboundedReceiver<(Instant, String)> {
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("registry plugins swapped in") {
                let _ = tx.send((Instant::now(), line));
            }
        }
    });
    rx
}

/// Waits for a swap line naming `label`; returns when it arrived.
async fn swapped_to(rx: &mut mpsc::UnboundedReceiver<(Instant, String)>, label: &str) -> Instant {
    let quoted = format!("\\\"{label}\\\"");
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some((at, line)) = rx.recv().await {
            if line.contains(&quoted) {
                return Some(at);
            }
        }
        None
    })
    .await;
    match found {
        Ok(Some(at)) => at,
        other => panic!("no swap to {label} was logged ({other:?})"),
    }
}

async fn a_cli_activation_reaches_two_running_processes_within_two_seconds(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let mut section =
        outboxd::config::ConsumerSection::new("billing", vec!["orders".into()], "plugin:c");
    section.tables.write = vec!["invoices".into()];
    let role = match t.provision_plugin_role(&mut section).await {
        Some(r) => format!("db_role = \"{r}\""),
        None => String::new(),
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("outboxd.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[database]
url = "{url}"

[relay]
poll_interval_ms = 20

[[routes]]
event_type = "order.*"
topic = "orders"

[[plugins]]
name = "c"
source = "registry"
limits = {{ timeout_ms = 2000 }}

[[consumers]]
name = "billing"
topics = ["orders"]
handler = "plugin:c"
tables = {{ write = ["invoices"] }}
{role}

[plugin_runtime]
cache_dir = "{cache}"
registry_poll_ms = 1000
"#,
            url = t.url,
            role = role,
            cache = dir.path().join("cache").display(),
        ),
    )
    .expect("write config");
    // The config runs `c` as a consumer: a transformer is refused, even as
    // its first version.
    let transformer = plugin_path("cloudevents").display().to_string();
    let out = outboxd(&config)
        .args(["plugin", "deploy", &transformer, "--name", "c"])
        .output()
        .await
        .expect("run the outboxd CLI");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a transformer was deployed as `c`");
    assert!(
        stderr.contains("implements the transformer world, but the config runs `c` as a consumer"),
        "{stderr}"
    );
    let billing_wasm = plugin_path("billing").display().to_string();
    let invoicing_wasm = plugin_path("invoicing").display().to_string();
    cli(
        &config,
        &[
            "plugin",
            "deploy",
            &billing_wasm,
            "--name",
            "c",
            "--activate",
        ],
    )
    .await;
    cli(
        &config,
        &["plugin", "deploy", &invoicing_wasm, "--name", "c"],
    )
    .await;

    let mut a = outboxd(&config)
        .arg("run")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn process A");
    let mut b = outboxd(&config)
        .arg("run")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn process B");
    let mut a_swaps = swaps_of(&mut a);
    let mut b_swaps = swaps_of(&mut b);
    swapped_to(&mut a_swaps, "c@1").await;
    swapped_to(&mut b_swaps, "c@1").await;

    // (what, latency A, latency B, CLI run time). Latencies are measured
    // from the CLI command's start (its process start, connect and commit
    // included): an upper bound on commit-to-swap. The NOTIFY can arrive
    // before the CLI has even exited.
    let mut results = Vec::new();
    for (step, label) in [
        (vec!["plugin", "activate", "c", "2"], "c@2"),
        (vec!["plugin", "rollback", "c"], "c@1"),
        (vec!["plugin", "activate", "c", "2"], "c@2"),
    ] {
        let spawned = Instant::now();
        cli(&config, &step).await;
        let committed = Instant::now();
        let at_a = swapped_to(&mut a_swaps, label).await;
        let at_b = swapped_to(&mut b_swaps, label).await;
        results.push((
            step.join(" "),
            at_a.saturating_duration_since(spawned),
            at_b.saturating_duration_since(spawned),
            committed - spawned,
        ));
    }
    // The effect agrees: a new order is handled by version 2 in whichever
    // process owns its partition.
    put_order(&t.db, 1).await;
    eventually(
        Duration::from_secs(30),
        "the order was never handled",
        async || t.count("SELECT count(*) FROM inbox").await >= 1,
    )
    .await;
    for child in [&mut a, &mut b] {
        let pid = child.id().expect("pid").to_string();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    }
    assert_eq!(
        t.count("SELECT count(*) FROM inbox WHERE handled_by = 'c@2'")
            .await,
        1
    );
    assert_eq!(
        t.count("SELECT count(*) FROM invoices WHERE issued_at = 0")
            .await,
        1,
        "the invoice is invoicing's (c@2)"
    );
    let how = if t.is_postgres() {
        "postgres LISTEN/NOTIFY + 1 s poll"
    } else {
        "sqlite, 1 s poll"
    };
    for (what, a, b, cli_took) in &results {
        println!(
            "two processes ({how}): `outboxd {what}` (the CLI process ran {cli_took:?}); from its start, process A swapped after {a:?}, process B after {b:?}"
        );
    }
    let worst = results
        .iter()
        .flat_map(|(_, a, b, _)| [*a, *b])
        .max()
        .unwrap_or_default();
    assert!(
        worst < Duration::from_secs(2),
        "a process took {worst:?} to switch"
    );
}
on_both!(a_cli_activation_reaches_two_running_processes_within_two_seconds);
