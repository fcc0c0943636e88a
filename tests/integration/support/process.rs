//! Real `outboxd` processes: the product's binary and the example's
//! (`outboxd-demo`, with `builtin:billing`) configured for a test's
//! database, stopped as an operator would or SIGKILLed at a fault point.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::db::TestDb;
use super::plugins::plugin_path;

pub fn outboxd(t: &TestDb) -> Command {
    configured(Command::new(env!("CARGO_BIN_EXE_outboxd")), t)
}

/// `outboxd --config FILE`, its logs as JSON on stderr.
pub fn outboxd_with_config(config: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_outboxd"));
    cmd.arg("--config")
        .arg(config)
        .arg("--log-json")
        .env_remove("OUTBOXD_FAULT")
        .env_remove("OUTBOXD_LOG")
        .kill_on_drop(true);
    cmd
}

/// `outboxd-demo`, the example's binary: outboxd's command line with the
/// example's `BillingHandler` registered as `builtin:billing`, as a user's
/// own binary registers its native handlers. Built here (a no-op when it is
/// current), since it belongs to another package of the workspace.
pub fn outboxd_with_billing(t: &TestDb) -> Command {
    configured(Command::new(outboxd_demo_binary()), t)
}

/// The path of `outboxd-demo`, built once per test binary (a no-op when it
/// is current).
pub fn outboxd_demo_binary() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args([
                "build",
                "--quiet",
                "-p",
                "outboxd-demo",
                "--bin",
                "outboxd-demo",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo to build the example's binary (cargo build -p outboxd-demo)");
        assert!(status.success(), "cargo build -p outboxd-demo failed");
        Path::new(env!("CARGO_BIN_EXE_outboxd")).with_file_name("outboxd-demo")
    })
}

fn configured(mut cmd: Command, t: &TestDb) -> Command {
    cmd.env("OUTBOXD__DATABASE__URL", &t.url)
        .env("OUTBOXD__RELAY__WORKERS", "1")
        .env("OUTBOXD__RELAY__BATCH_SIZE", "20")
        .env("OUTBOXD__RELAY__POLL_INTERVAL_MS", "20")
        .env("OUTBOXD__RELAY__PUBLISH_TIMEOUT_MS", "1000")
        .env("OUTBOXD__RELAY__LEASE_MS", "1500")
        .env("OUTBOXD__TRANSPORT__CONSUMER_LEASE_MS", "1500")
        .env_remove("OUTBOXD_FAULT")
        .kill_on_drop(true);
    cmd
}

/// Stops `child` as an operator would (SIGTERM) and asserts that it drains
/// and exits 0 within 30 s.
pub async fn terminate(child: &mut Child) {
    let pid = child.id().expect("pid").to_string();
    let term = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill -TERM");
    assert!(term.success(), "kill -TERM {pid}");
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("exits within 30 s of SIGTERM")
        .expect("wait");
    assert!(status.success(), "SIGTERM must exit 0, got {status}");
}

/// Waits for the `OUTBOXD FAULT` line, then SIGKILLs the process.
pub async fn kill_at_fault(mut child: Child) {
    let stderr = child.stderr.take().expect("piped stderr");
    let mut lines = BufReader::new(stderr).lines();
    let found = tokio::time::timeout(Duration::from_secs(90), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.starts_with("OUTBOXD FAULT") {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    child.start_kill().expect("SIGKILL");
    let status = child.wait().await.expect("wait");
    assert!(
        found,
        "the process never reached the fault point (status {status})"
    );
    assert!(!status.success(), "killed, not exited");
}

/// `OUTBOXD__PLUGINS` and `OUTBOXD__CONSUMERS` for one `billing` consumer
/// plugin of `order.confirmed` that may write `invoices` (`extra` adds keys
/// to the consumer), with its Postgres role provisioned.
pub async fn billing_plugin_consumer(t: &TestDb, extra: &str) -> (String, String) {
    let plugins = format!(
        r#"[{{name = "billing", path = "{}", limits = {{timeout_ms = 5000}}}}]"#,
        plugin_path("billing").display()
    );
    let mut section = outboxd::config::ConsumerSection::new(
        "billing",
        vec!["order.confirmed".into()],
        "plugin:billing",
    );
    section.tables.write = vec!["invoices".into()];
    let role = match t.provision_plugin_role(&mut section).await {
        Some(r) => format!(", db_role = \"{r}\""),
        None => String::new(),
    };
    let consumers = format!(
        r#"[{{name = "billing", topics = ["order.confirmed"], handler = "plugin:billing"{extra}, tables = {{write = ["invoices"]}}{role}}}]"#
    );
    (plugins, consumers)
}
