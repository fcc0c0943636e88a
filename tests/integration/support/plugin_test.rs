//! `outboxd plugin test` run as the binary, as the plugin/test_* tests run
//! it: in a directory of its own, with the order message and the invoices
//! table's setup, and its output read as text or as the `--json` report.

use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};

use super::plugins::plugin_path;

pub const INVOICES_SQLITE: &str = "CREATE TABLE invoices (
  id INTEGER PRIMARY KEY AUTOINCREMENT, order_id TEXT NOT NULL, customer_id TEXT NOT NULL,
  amount_cents INTEGER NOT NULL, message_id TEXT NOT NULL, issued_at INTEGER NOT NULL)";

/// `outboxd plugin test ARGS` in `dir`, with a call deadline a loaded
/// test machine meets (the 50 ms default can be short for a fresh
/// instance).
pub async fn plugin_test(dir: &Path, args: &[&str]) -> Output {
    plugin_test_within(dir, args, 5_000).await
}

pub async fn plugin_test_within(dir: &Path, args: &[&str], timeout_ms: u64) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args(["plugin", "test"])
        .args(args)
        .args(["--timeout-ms", &timeout_ms.to_string()])
        .current_dir(dir)
        // The scratch database goes here, so a test can see it is gone.
        .env("TMPDIR", scratch_dir(dir))
        .env_remove("OUTBOXD__DATABASE__URL")
        .output()
        .await
        .expect("run outboxd plugin test")
}

pub fn scratch_dir(dir: &Path) -> std::path::PathBuf {
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).expect("create the scratch parent");
    tmp
}

pub fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn report(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("--json prints JSON ({e}): {}", text(o)))
}

/// A directory with the order message and the invoices table's setup.
pub fn order_files(setup: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let message = json!({
        "key": "o-1",
        "topic": "order.confirmed",
        "payload": {"order_id": "o-1", "customer_id": "c-1", "total_cents": 1990},
    });
    std::fs::write(dir.path().join("message.json"), message.to_string()).expect("write message");
    std::fs::write(dir.path().join("setup.sql"), setup).expect("write setup");
    dir
}

pub fn invoicing() -> String {
    plugin_path("invoicing").display().to_string()
}
