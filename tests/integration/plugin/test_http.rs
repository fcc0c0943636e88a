//! `outboxd plugin test` on a consumer that calls HTTP: canned answers
//! from `--http-stub` (nothing leaves the process: the stubbed URL's port
//! has no server), the allow-list and the host's idempotency header as in
//! production, a golden `--expect` file that holds across runs, and
//! `--http-live` against a server on loopback.

use serde_json::{Value, json};

use crate::support::TestDb;
use crate::support::outbound_server::Server;
use crate::support::plugin_test::{plugin_test, report, text};
use crate::support::plugins::plugin_path;

/// The hostile consumer-http plugin makes the requests its message lists,
/// trying to set its own idempotency key, and ignores every refusal.
fn requests_message(dir: &std::path::Path, requests: Value) {
    let message = json!({"key": "o-1", "payload": {"requests": requests}});
    std::fs::write(dir.join("message.json"), message.to_string()).expect("write message");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stubbed_requests_show_the_host_key_and_the_answer_and_leave_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Port 9 on loopback: no server, so an answer can only be the stub's.
    requests_message(
        dir.path(),
        json!([
            {"method": "POST", "url": "http://127.0.0.1:9/charges", "body_bytes": 3, "key": "evil"},
            {"method": "GET", "url": "http://evil.example/steal"},
        ]),
    );
    let stub = json!([{"method": "POST", "url": "http://127.0.0.1:9/charges", "status": 201,
                       "headers": {"content-type": "application/json"}, "body": {"id": "ch_1"}}]);
    std::fs::write(dir.path().join("stub.json"), stub.to_string()).expect("write stub");
    let wasm = plugin_path("hostile-consumer-http").display().to_string();
    let args = [
        wasm.as_str(),
        "--message",
        "message.json",
        "--allow-host",
        "http://127.0.0.1:9",
        "--http-stub",
        "stub.json",
    ];
    let out = plugin_test(dir.path(), &[&args[..], &["--json"]].concat()).await;
    assert!(out.status.success(), "{}", text(&out));
    let r = report(&out);
    let id = r["message"]["id"].as_str().expect("a string").to_string();
    let http = r["http"].as_array().expect("an array");
    assert_eq!(http.len(), 2, "{r:#}");
    assert_eq!(http[0]["stubbed"], true, "{r:#}");
    assert_eq!(http[0]["status"], 201, "{r:#}");
    assert_eq!(http[0]["outcome"], "2xx", "{r:#}");
    assert_eq!(http[0]["response_body"], json!({"id": "ch_1"}), "{r:#}");
    assert_eq!(http[0]["body"], "xxx", "{r:#}");
    assert_eq!(
        http[0]["headers"]["idempotency-key"], id,
        "the host's key, not the plugin's: {r:#}"
    );
    assert_eq!(http[1]["outcome"], "refused", "{r:#}");
    let why = http[1]["error"].as_str().expect("a string");
    assert!(
        why.contains("evil.example") && why.contains("allowed_outbound_hosts"),
        "{why}"
    );

    // The golden file holds on the next run (another message id, so
    // another key), and a changed answer shows.
    std::fs::write(dir.path().join("expected.json"), &out.stdout).expect("write");
    let same = plugin_test(
        dir.path(),
        &[&args[..], &["--expect", "expected.json"]].concat(),
    )
    .await;
    assert!(same.status.success(), "{}", text(&same));
    let changed = stub.to_string().replace("ch_1", "ch_2");
    std::fs::write(dir.path().join("stub.json"), changed).expect("write stub");
    let differs = plugin_test(
        dir.path(),
        &[&args[..], &["--expect", "expected.json"]].concat(),
    )
    .await;
    assert_eq!(differs.status.code(), Some(1), "{}", text(&differs));
    let shown = String::from_utf8_lossy(&differs.stdout);
    assert!(
        shown.contains("http[0].response_body.id: expected \"ch_1\", got \"ch_2\""),
        "{shown}"
    );

    // Without a stub or --http-live no request gets an answer.
    let bare = plugin_test(dir.path(), &[&args[..5], &["--json"]].concat()).await;
    assert!(bare.status.success(), "{}", text(&bare));
    let r = report(&bare);
    let why = r["http"][0]["error"].as_str().expect("a string");
    assert!(
        why.contains("no stub response matches POST http://127.0.0.1:9/charges"),
        "{r:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_live_sends_to_an_allowed_host_with_the_message_id_as_key() {
    let t = TestDb::postgres().await;
    let server = Server::start(t.db.clone()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let origin = format!("http://127.0.0.1:{}", server.port());
    requests_message(
        dir.path(),
        json!([{"method": "POST", "url": server.url("/charges"), "body_bytes": 5, "key": "evil"}]),
    );
    let wasm = plugin_path("hostile-consumer-http").display().to_string();
    let out = plugin_test(
        dir.path(),
        &[
            &wasm,
            "--message",
            "message.json",
            "--allow-host",
            &origin,
            "--http-live",
            "--database-url",
            &t.url,
            "--json",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let r = report(&out);
    let id = r["message"]["id"].as_str().expect("a string").to_string();
    assert_eq!(r["http"][0]["stubbed"], false, "{r:#}");
    assert_eq!(r["http"][0]["outcome"], "2xx", "{r:#}");
    let seen = server.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        seen[0].keys,
        vec![id.clone()],
        "the host's key only: {seen:?}"
    );
    assert_eq!(
        seen[0].open_intents, 1,
        "the intent was committed before the request: {seen:?}"
    );
    // The request happened, so its intent stays; the message's own
    // transaction (inbox mark, outcome) was rolled back.
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM outboxd.outbound_calls WHERE idempotency_key = '{id}'"
        ))
        .await,
        1
    );
    assert_eq!(t.count("SELECT count(*) FROM outboxd.inbox").await, 0);
}
