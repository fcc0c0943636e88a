//! Outbound HTTP for consumer plugins, attacked by plugins/hostile/
//! consumer-http on both databases: only listed scheme://host:port, no
//! special address unless listed literally, the host's idempotency header
//! whatever the plugin tries, the size and count caps, and the audit
//! (intent committed before the request arrives, outcome with the inbox).

use std::sync::Arc;
use std::time::Duration;

use outboxd::config::HttpLimits;
use outboxd::config::TxnPolicy;
use outboxd::plugin::ConsumerPlugin;
use outboxd::plugin::HttpStub;
use outboxd::plugin::StubResponse;
use outboxd::plugin::Traced;
use outboxd::plugin::Transport;
use outboxd::plugin::bindings::transformer::outbox::plugin::types::Message;
use outboxd::plugin::metrics::PluginReport;
use outboxd::store::InboxTx;
use serde_json::{Value, json};

use crate::support::outbound_server::{BIG_BODY, Server};
use crate::support::plugins::{engine, handle_once, http_spec};
use crate::support::{TestDb, on_both, plugin_policy};

fn plugin(hosts: &[String], http: HttpLimits) -> Arc<ConsumerPlugin> {
    Arc::new(ConsumerPlugin::load(engine(), &http_spec(hosts, http)).expect("load"))
}

/// Runs one message through the plugin as the consumer would: inbox mark
/// first (so on SQLite the transaction holds the write lock while the
/// plugin calls out), then `handle`, then commit.
async fn run(t: &TestDb, p: &ConsumerPlugin, payload: Value) -> (String, Traced) {
    let (id, traced) = attempt(t, p, payload, &plugin_policy()).await;
    assert!(traced.result.is_ok(), "{:?}", traced.result);
    (id, traced)
}

/// [`run`] whatever the outcome, under `policy`; commits only on success.
async fn attempt(
    t: &TestDb,
    p: &ConsumerPlugin,
    payload: Value,
    policy: &TxnPolicy,
) -> (String, Traced) {
    let message = Message {
        id: String::new(),
        topic: "t".into(),
        key: None,
        payload: payload.to_string().into_bytes(),
        headers: vec![],
        attempt: 0,
    };
    handle_once(t, p, "test", message, policy, Transport::Live).await
}

fn req(method: &str, url: &str) -> Value {
    json!({"method": method, "url": url})
}

async fn the_host_sets_the_key_and_audits_before_sending(t: TestDb) {
    let server = Server::start(t.db.clone()).await;
    let p = plugin(&[server.url("")], HttpLimits::default());
    let attempt =
        json!({"method": "POST", "url": server.url("/charges"), "body_bytes": 10, "key": "evil"});
    let (id, traced) = run(&t, &p, json!({"requests": [attempt]})).await;
    let seen = server.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let s = &seen[0];
    // Every spelling the plugin tried (from-list, set, append, delete, in
    // four cases) is gone: one header, the message id.
    assert_eq!(s.keys, vec![id.clone()], "{s:?}");
    assert!(
        !s.attacker.is_empty(),
        "the plugin's other headers pass: {s:?}"
    );
    assert_eq!(
        (s.method.as_str(), s.path.as_str(), s.body_len),
        ("POST", "/charges", 10)
    );
    assert_eq!(
        s.open_intents, 1,
        "the intent was committed before the request arrived"
    );
    let r = &traced.http[0];
    assert_eq!((r.status, r.refused), (Some(200), false), "{r:?}");
    assert!(
        r.headers
            .iter()
            .any(|(k, v)| k == "idempotency-key" && *v == id),
        "{r:?}"
    );
    let done = t
        .count(&format!(
            "SELECT count(*) FROM outbound_calls WHERE message_id = '{id}' AND idempotency_key = '{id}' \
             AND status = 200 AND completed_at IS NOT NULL AND duration_ms IS NOT NULL \
             AND method = 'POST' AND host = '127.0.0.1' AND path = '/charges' \
             AND plugin = 'hostile-consumer-http@test-1' AND consumer = 'test'"
        ))
        .await;
    assert_eq!(done, 1, "the outcome committed with the inbox mark");
    let metrics = p.http().expect("a consumer reports HTTP").requests();
    let listed = format!("http://127.0.0.1:{}", server.port());
    assert_eq!(metrics, [(listed, "2xx", 1)]);
}
on_both!(the_host_sets_the_key_and_audits_before_sending);

async fn off_list_targets_are_refused_before_any_connection(t: TestDb) {
    let server = Server::start(t.db.clone()).await;
    let port = server.port();
    // `localhost` is listed, but by name: it resolves to loopback, which
    // only a literal entry may reach.
    let hosts = [server.url(""), format!("http://localhost:{port}")];
    let p = plugin(&hosts, HttpLimits::default());
    let attempts = [
        req(
            "GET",
            &format!("http://127.0.0.1:{}/port", port.wrapping_add(1).max(1)),
        ),
        req("GET", &format!("https://127.0.0.1:{port}/scheme")),
        req("GET", &format!("http://localhost:{port}/rebind")),
        req("GET", &format!("http://[::1]:{port}/v6")),
        req("GET", &format!("http://127.0.0.2:{port}/other-loopback")),
        req("GET", &format!("http://169.254.169.254:{port}/metadata")),
    ];
    let (_, traced) = run(&t, &p, json!({"requests": attempts})).await;
    assert!(server.seen().is_empty(), "{:?}", server.seen());
    assert_eq!(traced.http.len(), attempts.len());
    for r in &traced.http {
        let why = r.error.as_deref().unwrap_or("");
        assert!(r.refused && r.audit_id.is_none(), "{r:?}");
        assert!(
            why.contains("plugins[hostile-consumer-http].allowed_outbound_hosts"),
            "{why}"
        );
    }
    let rebind = traced
        .http
        .iter()
        .find(|r| r.url.contains("/rebind"))
        .expect("rebind");
    assert!(
        rebind.error.as_deref().unwrap_or("").contains("literally"),
        "{rebind:?}"
    );
    assert_eq!(
        t.count("SELECT count(*) FROM outbound_calls").await,
        0,
        "no intent for a refusal"
    );
}
on_both!(off_list_targets_are_refused_before_any_connection);

async fn sizes_and_counts_are_capped(t: TestDb) {
    let server = Server::start(t.db.clone()).await;
    let limits = HttpLimits {
        max_request_bytes: 1000,
        max_response_bytes: 1000,
        max_requests_per_message: 3,
        ..HttpLimits::default()
    };
    let p = plugin(&[server.url("")], limits);
    let big_request = json!({"method": "POST", "url": server.url("/upload"), "body_bytes": 1001});
    let (_, traced) = run(
        &t,
        &p,
        json!({"requests": [big_request, req("GET", &server.url("/big"))]}),
    )
    .await;
    let upload = &traced.http[0];
    assert!(
        upload.refused
            && upload
                .error
                .as_deref()
                .unwrap_or("")
                .contains("max_request_bytes"),
        "{upload:?}"
    );
    let big = &traced.http[1];
    assert!(
        big.error
            .as_deref()
            .unwrap_or("")
            .contains("max_response_bytes"),
        "{big:?}"
    );
    assert!(
        big.response_body.len() < BIG_BODY && big.audit_id.is_some(),
        "{big:?}"
    );
    let seen = server.seen();
    assert_eq!(
        seen.iter().map(|s| s.path.as_str()).collect::<Vec<_>>(),
        ["/big"],
        "{seen:?}"
    );

    let five: Vec<Value> = (0..5)
        .map(|i| req("GET", &server.url(&format!("/n{i}"))))
        .collect();
    let (id, traced) = run(&t, &p, json!({"requests": five})).await;
    let arrived = server
        .seen()
        .iter()
        .filter(|s| s.keys == [id.clone()])
        .count();
    assert_eq!(arrived, 3, "max_requests_per_message");
    let refused: Vec<_> = traced.http.iter().filter(|r| r.refused).collect();
    assert_eq!(refused.len(), 2);
    assert!(
        refused[0]
            .error
            .as_deref()
            .unwrap_or("")
            .contains("max_requests_per_message")
    );
    // The cap is per message: the next one may call again.
    let (next, _) = run(
        &t,
        &p,
        json!({"requests": [req("GET", &server.url("/again"))]}),
    )
    .await;
    assert!(server.seen().iter().any(|s| s.keys == [next.clone()]));
}
on_both!(sizes_and_counts_are_capped);

async fn plugin_sql_cannot_touch_the_audit(t: TestDb) {
    let server = Server::start(t.db.clone()).await;
    let p = plugin(&[server.url("")], HttpLimits::default());
    run(&t, &p, json!({"requests": [req("GET", &server.url("/x"))]})).await;
    for sql in [
        "SELECT * FROM outbound_calls",
        "DELETE FROM outbound_calls",
        "UPDATE outbound_calls SET status = 200",
        "INSERT INTO outbound_calls (id) VALUES ('x')",
        "SELECT * FROM outbound.outbound_calls",
        "SELECT * FROM outboxd.outbound_calls",
        "SELECT * FROM \"OUTBOUND_CALLS\"",
    ] {
        // Even with the table listed in the grants, as a careless operator
        // might (the config check refuses that listing too).
        let mut policy = plugin_policy();
        policy.tables.read.push("outbound_calls".into());
        policy.tables.write.push("outbound_calls".into());
        let (_, traced) = attempt(&t, &p, json!({"sql": sql}), &policy).await;
        let st = &traced.statements[0];
        assert!(st.outcome.contains("refused"), "{sql}: {st:?}");
        assert!(traced.result.is_err(), "the message rolls back: {sql}");
    }
    assert_eq!(
        t.count("SELECT count(*) FROM outbound_calls WHERE status = 200")
            .await,
        1
    );
}
on_both!(plugin_sql_cannot_touch_the_audit);

/// The stub answers without a connection; the allow-list and the header
/// still apply (what `outboxd plugin test --http-stub` relies on).
async fn a_stub_answers_without_the_network(t: TestDb) {
    let hosts = ["https://api.example.com".to_string()];
    let p = plugin(&hosts, HttpLimits::default());
    let stub = HttpStub::new(vec![StubResponse {
        method: Some("POST".into()),
        url: "https://api.example.com/charges".into(),
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: br#"{"id":"ch_1"}"#.to_vec(),
    }]);
    let id = uuid::Uuid::new_v4().to_string();
    let mut tx = InboxTx::begin(&t.db).await.expect("begin");
    let message = Message {
        id: id.clone(),
        topic: "t".into(),
        key: None,
        payload: json!({"requests": [
            {"method": "POST", "url": "https://api.example.com/charges", "key": "evil"},
            {"method": "GET", "url": "https://evil.example.com/"},
        ]})
        .to_string()
        .into_bytes(),
        headers: vec![],
        attempt: 0,
    };
    let traced = p
        .handle_traced(
            &mut tx,
            &message,
            &plugin_policy(),
            None,
            Transport::Stub(Arc::new(stub)),
        )
        .await;
    tx.rollback().await.expect("rollback");
    let (ok, off) = (&traced.http[0], &traced.http[1]);
    assert_eq!((ok.status, ok.stubbed), (Some(201), true), "{ok:?}");
    assert_eq!(ok.response_body, br#"{"id":"ch_1"}"#);
    let keys: Vec<_> = ok
        .headers
        .iter()
        .filter(|(k, _)| k == "idempotency-key")
        .collect();
    assert_eq!(keys, [&("idempotency-key".to_string(), id)]);
    assert!(off.refused, "{off:?}");
}
on_both!(a_stub_answers_without_the_network);

/// `request_timeout` ends a request whose answer does not come, well
/// inside the call deadline.
async fn a_silent_server_times_out(t: TestDb) {
    let server = Server::start(t.db.clone()).await;
    let limits = HttpLimits {
        request_timeout: Duration::from_millis(300),
        ..HttpLimits::default()
    };
    let p = plugin(&[server.url("")], limits);
    let started = std::time::Instant::now();
    let (id, traced) = run(
        &t,
        &p,
        json!({"requests": [req("GET", &server.url("/slow"))]}),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let r = &traced.http[0];
    assert!(
        r.error.as_deref().unwrap_or("").contains("request_timeout"),
        "{r:?}"
    );
    let failed = t
        .count(&format!(
            "SELECT count(*) FROM outbound_calls WHERE message_id = '{id}' AND status IS NULL AND error LIKE '%request_timeout%'"
        ))
        .await;
    assert_eq!(failed, 1, "the failure is the recorded outcome");
}
on_both!(a_silent_server_times_out);

/// A live request with nowhere to write its intent is not sent: no request
/// leaves without its audit row.
async fn no_audit_database_no_live_request(t: TestDb) {
    let server = Server::start(t.db.clone()).await;
    let p = plugin(&[server.url("")], HttpLimits::default());
    let message = Message {
        id: uuid::Uuid::new_v4().to_string(),
        topic: "t".into(),
        key: None,
        payload: json!({"requests": [req("GET", &server.url("/x"))]})
            .to_string()
            .into_bytes(),
        headers: vec![],
        attempt: 0,
    };
    let mut tx = InboxTx::begin(&t.db).await.expect("begin");
    let traced = p
        .handle_traced(&mut tx, &message, &plugin_policy(), None, Transport::Live)
        .await;
    tx.rollback().await.expect("rollback");
    let r = &traced.http[0];
    assert!(
        r.refused && r.error.as_deref().unwrap_or("").contains("audit database"),
        "{r:?}"
    );
    assert!(server.seen().is_empty());
}
on_both!(no_audit_database_no_live_request);

/// https goes through TLS: against a plain-HTTP server the handshake fails
/// and nothing reaches the handler (the outcome is the TLS error).
async fn https_speaks_tls(t: TestDb) {
    let server = Server::start(t.db.clone()).await;
    let url = format!("https://127.0.0.1:{}", server.port());
    let p = plugin(std::slice::from_ref(&url), HttpLimits::default());
    let (id, traced) = run(
        &t,
        &p,
        json!({"requests": [req("GET", &format!("{url}/x"))]}),
    )
    .await;
    let r = &traced.http[0];
    assert!(r.error.as_deref().unwrap_or("").contains("TLS"), "{r:?}");
    assert!(server.seen().is_empty());
    let failed = t
        .count(&format!(
            "SELECT count(*) FROM outbound_calls WHERE message_id = '{id}' AND scheme = 'https' AND completed_at IS NOT NULL AND error LIKE '%TLS%'"
        ))
        .await;
    assert_eq!(failed, 1);
}
on_both!(https_speaks_tls);
