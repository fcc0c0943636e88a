//! `outboxd plugin test --expect`: a golden report passes on the next run
//! (whose generated ids differ) and fails, with each difference by path,
//! on a changed one; for a consumer and for a transformer.

use serde_json::json;

use crate::support::plugin_test::{
    INVOICES_SQLITE, invoicing, order_files, plugin_test, report, text,
};
use crate::support::plugins::plugin_path;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_passes_on_the_matching_consumer_report_and_fails_on_a_changed_one() {
    let dir = order_files(INVOICES_SQLITE);
    let wasm = invoicing();
    let args = [
        wasm.as_str(),
        "--message",
        "message.json",
        "--setup",
        "setup.sql",
        "--write",
        "invoices",
    ];
    let first = plugin_test(dir.path(), &[&args[..], &["--json"]].concat()).await;
    assert!(first.status.success(), "{}", text(&first));
    std::fs::write(dir.path().join("expected.json"), &first.stdout).expect("write");
    // A second run has another message id and event id: they do not count.
    let same = plugin_test(
        dir.path(),
        &[&args[..], &["--expect", "expected.json"]].concat(),
    )
    .await;
    assert!(same.status.success(), "{}", text(&same));
    assert!(String::from_utf8_lossy(&same.stdout).contains("ok: the report matches expected.json"));

    let mut changed = report(&first);
    changed["statements"][0]["values"]["params"][2] = json!(1999);
    changed["events"][0]["headers"]["causation-id"] = json!("someone-else");
    std::fs::write(dir.path().join("changed.json"), changed.to_string()).expect("write");
    let differs = plugin_test(
        dir.path(),
        &[&args[..], &["--expect", "changed.json"]].concat(),
    )
    .await;
    assert_eq!(differs.status.code(), Some(1), "{}", text(&differs));
    let shown = String::from_utf8_lossy(&differs.stdout);
    assert!(
        shown.contains("differs from changed.json in 2 place(s)"),
        "{shown}"
    );
    assert!(
        shown.contains("statements[0].values.params[2]: expected 1999, got 1990"),
        "{shown}"
    );
    assert!(
        shown.contains(
            "events[0].headers.causation-id: expected \"someone-else\", got \"<message-id>\""
        ),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_passes_on_the_matching_transformer_report_and_fails_on_a_changed_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No id and no time: both are generated, and do not count.
    let event =
        json!({"event_type": "order.confirmed", "aggregate_id": "o-7", "payload": {"total": 42}});
    std::fs::write(dir.path().join("event.json"), event.to_string()).expect("write");
    let wasm = plugin_path("cloudevents").display().to_string();
    let args = [
        wasm.as_str(),
        "--event",
        "event.json",
        "--set",
        "source=shop",
    ];
    let first = plugin_test(dir.path(), &[&args[..], &["--json"]].concat()).await;
    assert!(first.status.success(), "{}", text(&first));
    let r = report(&first);
    assert_eq!(r["world"], "transformer");
    assert_eq!(r["messages"][0]["payload"]["source"], "shop", "{r:#}");
    assert_eq!(
        r["messages"][0]["payload"]["id"], r["generated"]["<event-id>"],
        "{r:#}"
    );
    assert_eq!(
        r["messages"][0]["payload"]["time"], r["generated"]["<created-at>"],
        "{r:#}"
    );
    std::fs::write(dir.path().join("expected.json"), &first.stdout).expect("write");
    let same = plugin_test(
        dir.path(),
        &[&args[..], &["--expect", "expected.json"]].concat(),
    )
    .await;
    assert!(same.status.success(), "{}", text(&same));

    let mut changed = r.clone();
    changed["messages"][0]["payload"]["data"]["total"] = json!(43);
    std::fs::write(dir.path().join("changed.json"), changed.to_string()).expect("write");
    let differs = plugin_test(
        dir.path(),
        &[&args[..], &["--expect", "changed.json"]].concat(),
    )
    .await;
    assert_eq!(differs.status.code(), Some(1), "{}", text(&differs));
    let shown = String::from_utf8_lossy(&differs.stdout);
    assert!(
        shown.contains("messages[0].payload.data.total: expected 43, got 42"),
        "{shown}"
    );
    // Another setting changes the report too.
    let other = plugin_test(
        dir.path(),
        &[
            wasm.as_str(),
            "--event",
            "event.json",
            "--set",
            "source=other",
            "--expect",
            "expected.json",
        ],
    )
    .await;
    assert_eq!(other.status.code(), Some(1), "{}", text(&other));
    assert!(String::from_utf8_lossy(&other.stdout).contains("expected \"shop\", got \"other\""));
}
