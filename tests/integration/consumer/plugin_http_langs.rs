//! `js-charge`, a JavaScript consumer calling HTTP through
//! `guest-sdk/js/outboxd_http.js`, on both databases: a charge recorded on
//! a 2xx answer, a 4xx permanent and a 5xx retryable, a caught unique
//! violation, and the live path (the request and its body reach a server
//! on loopback with the host's Idempotency-Key).

use std::sync::Arc;
use std::time::Duration;

use outboxd::config::PluginSpec;
use outboxd::config::TableGrants;
use outboxd::config::TxnPolicy;
use outboxd::plugin::ConsumerPlugin;
use outboxd::plugin::HttpStub;
use outboxd::plugin::PluginError;
use outboxd::plugin::StubResponse;
use outboxd::plugin::Traced;
use outboxd::plugin::Transport;
use outboxd::plugin::bindings::transformer::outbox::plugin::types::Message;

use crate::support::outbound_server::Server;
use crate::support::plugins::{engine, handle_once, plugin_path};
use crate::support::{TestDb, on_both};

const PROVIDER: &str = "https://pay.example.com";
const ORDER: &[u8] = br#"{"order_id":"o-1","amount_cents":1250}"#;

fn policy() -> TxnPolicy {
    TxnPolicy {
        consumer: "charge".into(),
        tables: TableGrants {
            read: vec![],
            write: vec!["payments".into()],
        },
        ..TxnPolicy::default()
    }
}

/// One message through js-charge, committed only when it succeeded.
async fn charge(t: &TestDb, provider: &str, transport: Transport) -> (String, Traced) {
    let mut spec = PluginSpec::new("js-charge", plugin_path("js-charge"));
    spec.version = Some("test-1".into());
    spec.limits.timeout = Duration::from_secs(20);
    spec.allowed_outbound_hosts = vec![provider.to_string()];
    spec.config
        .insert("provider_url".into(), provider.to_string());
    let plugin = ConsumerPlugin::load(engine(), &spec).expect("load js-charge");
    let message = Message {
        id: String::new(),
        topic: "order.confirmed".into(),
        key: Some(b"o-1".to_vec()),
        payload: ORDER.to_vec(),
        headers: vec![],
        attempt: 0,
    };
    handle_once(t, &plugin, "charge", message, &policy(), transport).await
}

fn answer(status: u16, body: &str) -> Transport {
    Transport::Stub(Arc::new(HttpStub::new(vec![StubResponse {
        method: Some("POST".into()),
        url: format!("{PROVIDER}/charges"),
        status,
        headers: vec![],
        body: body.as_bytes().to_vec(),
    }])))
}

fn guest_error(traced: &Traced) -> (bool, String) {
    match &traced.result {
        Err(PluginError::Guest { retryable, message }) => (*retryable, message.clone()),
        other => panic!("expected the plugin's own error, got {other:?}"),
    }
}

async fn js_charge_records_a_charge_and_sorts_the_provider_answers(t: TestDb) {
    t.exec_app(
        "CREATE TABLE payments (order_id TEXT NOT NULL UNIQUE, charge_id TEXT NOT NULL, message_id TEXT NOT NULL)",
    )
    .await;
    let (_, traced) = charge(&t, PROVIDER, answer(402, "card declined")).await;
    let (retryable, text) = guest_error(&traced);
    assert!(
        !retryable && text.contains("provider refused order o-1: 402 card declined"),
        "{text}"
    );
    let (_, traced) = charge(&t, PROVIDER, answer(503, "busy")).await;
    let (retryable, text) = guest_error(&traced);
    assert!(
        retryable && text.contains("provider answered 503"),
        "{text}"
    );
    assert_eq!(t.count("SELECT count(*) FROM payments").await, 0);

    let (id, traced) = charge(&t, PROVIDER, answer(201, r#"{"charge_id":"ch_1"}"#)).await;
    assert!(traced.result.is_ok(), "{:?}", traced.result);
    let [request] = traced.http.as_slice() else {
        panic!("one request: {:?}", traced.http)
    };
    assert_eq!(request.url, format!("{PROVIDER}/charges"));
    assert_eq!(request.body, ORDER, "the order is the JSON body");
    assert!(
        request
            .headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("idempotency-key") && *v == id),
        "{:?}",
        request.headers
    );
    assert!(
        request
            .headers
            .iter()
            .any(|(k, v)| k == "content-type" && v == "application/json"),
        "{:?}",
        request.headers
    );
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM payments WHERE order_id = 'o-1' AND charge_id = 'ch_1' AND message_id = '{id}'"
        ))
        .await,
        1
    );

    // Another message for the same order: the insert violates UNIQUE, and
    // the plugin catches the db-error.
    let (_, traced) = charge(&t, PROVIDER, answer(201, r#"{"charge_id":"ch_2"}"#)).await;
    let (retryable, text) = guest_error(&traced);
    assert!(
        !retryable && text.contains("order o-1 is already paid"),
        "{text}"
    );
    assert_eq!(t.count("SELECT count(*) FROM payments").await, 1);
}
on_both!(js_charge_records_a_charge_and_sorts_the_provider_answers);

/// The network path: the server sees the request, its body and the host's
/// key. It answers `200 ok` (not JSON), which the plugin reports as a
/// retryable error naming the parse failure.
async fn js_charge_reaches_a_live_server(t: TestDb) {
    let server = Server::start(t.db.clone()).await;
    let url = format!("http://127.0.0.1:{}", server.port());
    let (id, traced) = charge(&t, &url, Transport::Live).await;
    let (retryable, text) = guest_error(&traced);
    assert!(retryable && text.contains("SyntaxError"), "{text}");
    let seen = server.seen();
    let [request] = seen.as_slice() else {
        panic!("one request: {seen:?}")
    };
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("POST", "/charges")
    );
    assert_eq!(request.keys, vec![id]);
    assert_eq!(request.body_len, ORDER.len());
}
on_both!(js_charge_reaches_a_live_server);
