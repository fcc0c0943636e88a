//! `outboxd plugin test` on consumers, run as the binary: statements with
//! their parameters and rows, the emitted event and the outcome, on a
//! scratch SQLite database or a Postgres database that it leaves as it
//! was; refused statements; `--setup`; traps and timeouts; `--config`.

use serde_json::json;

use crate::support::TestDb;
use crate::support::plugin_test::{
    INVOICES_SQLITE, invoicing, order_files, plugin_test, plugin_test_within, report, scratch_dir,
    text,
};
use crate::support::plugins::plugin_path;

const INVOICES_PG: &str = "CREATE TABLE invoices (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, order_id text NOT NULL, customer_id text NOT NULL,
  amount_cents bigint NOT NULL, message_id text NOT NULL, issued_at bigint NOT NULL)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_shows_its_statements_with_params_and_its_emitted_event() {
    let dir = order_files(INVOICES_SQLITE);
    let wasm = invoicing();
    let base = [
        "--message",
        "message.json",
        "--setup",
        "setup.sql",
        "--write",
        "invoices",
    ];
    let out = plugin_test(
        dir.path(),
        &[&[wasm.as_str()], &base[..], &["--json"]].concat(),
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let r = report(&out);
    let id = r["message"]["id"].as_str().expect("message id").to_string();
    assert_eq!(
        r["generated"]["<message-id>"], id,
        "a generated id is listed: {r:#}"
    );
    let statements = r["statements"].as_array().expect("statements");
    assert_eq!(statements.len(), 2, "{r:#}");
    assert_eq!(statements[0]["kind"], "query");
    assert!(
        statements[0]["text"]
            .as_str()
            .expect("a string")
            .starts_with("INSERT INTO invoices")
    );
    assert_eq!(
        statements[0]["values"]["params"],
        json!(["o-1", "c-1", 1990, id])
    );
    assert_eq!(statements[0]["values"]["rows"], json!([[1]]));
    assert_eq!(statements[0]["outcome"], "ok: 1 row");
    assert_eq!(statements[1]["kind"], "emit");
    let events = r["events"].as_array().expect("events");
    assert_eq!(events.len(), 1, "{r:#}");
    assert_eq!(events[0]["aggregate_id"], "o-1");
    assert_eq!(events[0]["event_type"], "invoice.issued");
    assert_eq!(
        events[0]["payload"],
        json!({"invoice_id": 1, "order_id": "o-1", "amount_cents": 1990})
    );
    assert_eq!(events[0]["headers"]["causation-id"], id);
    assert_eq!(r["generated"]["<event-1>"], events[0]["id"]);
    assert_eq!(r["outcome"], json!({"result": "ok", "then": "commit"}));

    // The human form shows the same, parameters included.
    let human = plugin_test(dir.path(), &[&[wasm.as_str()], &base[..]].concat()).await;
    assert!(human.status.success(), "{}", text(&human));
    let shown = String::from_utf8_lossy(&human.stdout);
    assert!(
        shown.contains("statement 1: query INSERT INTO invoices"),
        "{shown}"
    );
    assert!(shown.contains("params:  [\"o-1\",\"c-1\",1990,"), "{shown}");
    assert!(shown.contains("type invoice.issued"), "{shown}");
    assert!(shown.contains("outcome: ok (commit)"), "{shown}");
    let left: Vec<_> = std::fs::read_dir(scratch_dir(dir.path()))
        .expect("read the scratch parent")
        .collect();
    assert!(left.is_empty(), "the scratch database is deleted: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_setup_or_grants_the_statement_fails_as_it_would_in_production() {
    let dir = order_files(INVOICES_SQLITE);
    let wasm = invoicing();
    // The table is granted but nothing created it: the database says so.
    let no_setup = plugin_test(
        dir.path(),
        &[
            &wasm,
            "--message",
            "message.json",
            "--write",
            "invoices",
            "--json",
        ],
    )
    .await;
    assert_eq!(no_setup.status.code(), Some(1), "{}", text(&no_setup));
    let r = report(&no_setup);
    assert!(
        r["statements"][0]["outcome"]
            .as_str()
            .expect("a string")
            .starts_with("database error"),
        "{r:#}"
    );
    assert!(
        r["statements"][0]["values"]["error"]
            .as_str()
            .expect("a string")
            .contains("invoices"),
        "{r:#}"
    );
    // The table exists but is not granted: the gate refuses the statement.
    let refused = plugin_test(
        dir.path(),
        &[
            &wasm,
            "--message",
            "message.json",
            "--setup",
            "setup.sql",
            "--json",
        ],
    )
    .await;
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    let r = report(&refused);
    let outcome = r["statements"][0]["outcome"].as_str().expect("a string");
    assert!(
        outcome.starts_with("statement refused") && outcome.contains("invoices"),
        "{r:#}"
    );
    assert_eq!(
        r["statements"].as_array().expect("an array").len(),
        1,
        "nothing runs after: {r:#}"
    );
    assert_eq!(r["events"], json!([]));
    assert_eq!(
        r["outcome"]["result"], "permanent",
        "the plugin gives up: {r:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_postgres_leaves_nothing_behind() {
    let t = TestDb::postgres().await;
    // A table of the application's that exists before the run.
    t.exec_app("CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, message_id text, aggregate_id text, seq bigint, shape text, writer text)")
        .await;
    let dir = order_files(INVOICES_PG);
    let url = t.url.as_str();
    let invoicing = invoicing();
    let out = plugin_test(
        dir.path(),
        &[
            &invoicing,
            "--message",
            "message.json",
            "--setup",
            "setup.sql",
            "--write",
            "invoices",
            "--database-url",
            url,
            "--json",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let r = report(&out);
    assert_eq!(r["statements"][0]["values"]["rows"], json!([[1]]), "{r:#}");
    assert_eq!(r["events"][0]["event_type"], "invoice.issued", "{r:#}");

    let ledger = plugin_path("ledger").display().to_string();
    let out = plugin_test(
        dir.path(),
        &[
            &ledger,
            "--message",
            "message.json",
            "--write",
            "ledger",
            "--database-url",
            url,
            "--json",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let r = report(&out);
    assert_eq!(r["statements"][0]["values"]["rows_affected"], 1, "{r:#}");
    assert_eq!(r["statements"][0]["values"]["params"][1], "o-1", "{r:#}");

    // The table --setup created, the rows, the event and the inbox marks
    // were all rolled back.
    assert_eq!(
        t.count("SELECT count(*) FROM pg_tables WHERE tablename = 'invoices'")
            .await,
        0
    );
    assert_eq!(t.count("SELECT count(*) FROM ledger").await, 0);
    assert_eq!(t.count("SELECT count(*) FROM outboxd.outbox").await, 0);
    assert_eq!(t.count("SELECT count(*) FROM outboxd.inbox").await, 0);

    // A refused statement on Postgres is refused the same way.
    let out = plugin_test(
        dir.path(),
        &[
            &ledger,
            "--message",
            "message.json",
            "--read",
            "ledger",
            "--database-url",
            url,
            "--json",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let r = report(&out);
    assert!(
        r["statements"][0]["outcome"]
            .as_str()
            .expect("a string")
            .starts_with("statement refused"),
        "{r:#}"
    );
    assert_eq!(t.count("SELECT count(*) FROM outboxd.inbox").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_and_a_timeout_are_reported_as_such() {
    let dir = order_files(INVOICES_SQLITE);
    let trap = plugin_path("hostile-consumer-trap").display().to_string();
    let out = plugin_test(
        dir.path(),
        &[
            &trap,
            "--message",
            "message.json",
            "--setup",
            "setup.sql",
            "--write",
            "invoices",
            "--json",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let r = report(&out);
    assert_eq!(
        r["statements"][0]["values"]["rows_affected"], 1,
        "the write before the trap: {r:#}"
    );
    assert_eq!(r["outcome"]["result"], "trap", "{r:#}");
    assert_eq!(r["outcome"]["then"], "retry", "{r:#}");
    let trapped = plugin_test(
        dir.path(),
        &[
            &trap,
            "--message",
            "message.json",
            "--setup",
            "setup.sql",
            "--write",
            "invoices",
            "--set",
            "trap=false",
            "--json",
        ],
    )
    .await;
    assert!(
        trapped.status.success(),
        "--set reaches the plugin: {}",
        text(&trapped)
    );

    std::fs::write(
        dir.path().join("event.json"),
        r#"{"event_type": "a", "payload": {}}"#,
    )
    .expect("write");
    let spin = plugin_path("hostile-spin").display().to_string();
    let out =
        plugin_test_within(dir.path(), &[&spin, "--event", "event.json", "--json"], 100).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let r = report(&out);
    assert_eq!(r["outcome"]["result"], "timeout", "{r:#}");
    assert!(
        r["outcome"]["message"]
            .as_str()
            .expect("a string")
            .contains("100 ms"),
        "{r:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_config_the_consumer_runs_under_its_own_grants_and_settings() {
    let dir = order_files(INVOICES_SQLITE);
    let config = format!(
        r#"
[[plugins]]
name = "invoicing"
path = "{}"
config = {{ fail_after_emit = "true" }}
limits = {{ timeout = "5s" }}

[[consumers]]
name = "billing"
topics = ["orders"]
handler = "plugin:invoicing"
tables = {{ write = ["invoices"] }}

[[consumers]]
name = "nosy"
topics = ["orders"]
handler = "plugin:invoicing"
tables = {{ read = ["invoices"] }}
"#,
        invoicing()
    );
    std::fs::write(dir.path().join("outboxd.toml"), config).expect("write config");
    let run = |consumer: &'static str| {
        let dir = dir.path().to_path_buf();
        async move {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
                .args([
                    "plugin",
                    "test",
                    &invoicing(),
                    "--message",
                    "message.json",
                    "--setup",
                    "setup.sql",
                ])
                .args(["--config", "outboxd.toml", "--consumer", consumer, "--json"])
                .current_dir(&dir)
                .env("TMPDIR", scratch_dir(&dir))
                .output()
                .await
                .expect("run outboxd plugin test")
        }
    };
    // billing's grants let the insert and the emit run; its plugin's
    // settings make it fail afterwards, as configured.
    let billing = run("billing").await;
    assert_eq!(billing.status.code(), Some(1), "{}", text(&billing));
    let r = report(&billing);
    assert_eq!(r["statements"][0]["outcome"], "ok: 1 row", "{r:#}");
    assert_eq!(r["events"][0]["event_type"], "invoice.issued", "{r:#}");
    assert_eq!(r["outcome"]["result"], "retryable", "{r:#}");
    assert!(
        r["outcome"]["message"]
            .as_str()
            .expect("a string")
            .contains("fail_after_emit"),
        "{r:#}"
    );
    // nosy may only read invoices: the insert is refused.
    let nosy = run("nosy").await;
    let r = report(&nosy);
    let outcome = r["statements"][0]["outcome"].as_str().expect("a string");
    assert!(
        outcome.starts_with("statement refused") && outcome.contains("consumers[nosy]"),
        "{r:#}"
    );
    // An unknown consumer names the ones there are.
    let unknown = run("nobody").await;
    assert_eq!(unknown.status.code(), Some(1));
    let err = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        err.contains("--consumer nobody") && err.contains("billing, nosy"),
        "{err}"
    );
}
