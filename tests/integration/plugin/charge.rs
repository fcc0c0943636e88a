//! plugins/charge through the real host, without the network (a stub
//! transport): the guest SDK's `http` helper sends JSON with the host's
//! idempotency header, and maps what comes back as the plugin's error
//! contract says: 2xx writes the payment, 4xx and a refused host are
//! permanent, 5xx and a transport failure retryable.

use std::sync::Arc;
use std::time::Duration;

use outboxd::config::PluginSpec;
use outboxd::plugin::ConsumerPlugin;
use outboxd::plugin::HttpStub;
use outboxd::plugin::PluginError;
use outboxd::plugin::StubResponse;
use outboxd::plugin::Traced;
use outboxd::plugin::Transport;
use outboxd::plugin::bindings::transformer::outbox::plugin::types::Message;
use outboxd::store::InboxTx;
use serde_json::{Value, json};

use crate::support::plugins::{engine, plugin_path};
use crate::support::{TestDb, on_both};

const PROVIDER: &str = "https://pay.example.com";

fn charge(provider_url: &str) -> ConsumerPlugin {
    let mut spec = PluginSpec::new("charge", plugin_path("charge"));
    spec.version = Some("test-1".into());
    spec.limits.timeout = Duration::from_secs(10);
    spec.allowed_outbound_hosts = vec![PROVIDER.into()];
    spec.config
        .insert("provider_url".into(), provider_url.into());
    ConsumerPlugin::load(engine(), &spec).expect("load charge")
}

fn answer(status: u16, body: &str) -> StubResponse {
    StubResponse {
        method: Some("POST".into()),
        url: format!("{PROVIDER}/charges"),
        status,
        headers: vec![],
        body: body.as_bytes().to_vec(),
    }
}

/// One order through `plugin` with `stub` answering; commits only on
/// success. Returns the message id and the trace.
async fn run(t: &TestDb, plugin: &ConsumerPlugin, stub: Vec<StubResponse>) -> (String, Traced) {
    let id = uuid::Uuid::new_v4().to_string();
    let mut tx = InboxTx::begin(&t.db).await.expect("begin");
    let message = Message {
        id: id.clone(),
        topic: "order.paid".into(),
        key: None,
        payload: json!({"order_id": "order-1", "amount_cents": 1250})
            .to_string()
            .into_bytes(),
        headers: vec![],
        attempt: 0,
    };
    let policy = outboxd::config::TxnPolicy {
        consumer: "charge".into(),
        tables: outboxd::config::TableGrants {
            read: vec![],
            write: vec!["payments".into()],
        },
        ..outboxd::config::TxnPolicy::default()
    };
    let stub = Transport::Stub(Arc::new(HttpStub::new(stub)));
    let traced = plugin
        .handle_traced(&mut tx, &message, &policy, None, stub)
        .await;
    if traced.result.is_ok() {
        tx.commit().await.expect("commit");
    } else {
        tx.rollback().await.expect("rollback");
    }
    (id, traced)
}

/// The guest's error, as (retryable, message).
fn guest_error(traced: &Traced) -> (bool, String) {
    match &traced.result {
        Err(PluginError::Guest { retryable, message }) => (*retryable, message.clone()),
        other => panic!("expected the plugin's own error, got {other:?}"),
    }
}

async fn the_charge_plugin_maps_answers_to_effects_and_errors(t: TestDb) {
    t.exec_app(
        "CREATE TABLE payments (order_id TEXT NOT NULL, charge_id TEXT NOT NULL, message_id TEXT NOT NULL)",
    )
    .await;
    let plugin = charge(PROVIDER);

    // 201: one POST of the order as JSON, with the host's key; one payment.
    let (id, traced) = run(&t, &plugin, vec![answer(201, r#"{"charge_id": "ch_1"}"#)]).await;
    assert!(traced.result.is_ok(), "{:?}", traced.result);
    let [sent] = traced.http.as_slice() else {
        panic!("one request: {:?}", traced.http)
    };
    assert_eq!(
        (sent.method.as_str(), sent.url.as_str()),
        ("POST", "https://pay.example.com/charges")
    );
    let header = |name: &str| {
        sent.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(header("idempotency-key"), Some(id.as_str()), "{sent:?}");
    assert_eq!(header("content-type"), Some("application/json"), "{sent:?}");
    let body: Value = serde_json::from_slice(&sent.body).expect("a JSON body");
    assert_eq!(body, json!({"order_id": "order-1", "amount_cents": 1250}));
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM payments WHERE order_id = 'order-1' AND charge_id = 'ch_1' AND message_id = '{id}'"
        ))
        .await,
        1
    );

    // 4xx: the same request is refused again, so permanent, with the body.
    let (_, traced) = run(
        &t,
        &plugin,
        vec![answer(402, r#"{"error": "card declined"}"#)],
    )
    .await;
    let (retryable, message) = guest_error(&traced);
    assert!(
        !retryable && message.contains("HTTP status 402") && message.contains("card declined"),
        "{message}"
    );

    // 5xx: may pass later.
    let (_, traced) = run(&t, &plugin, vec![answer(503, "busy")]).await;
    let (retryable, message) = guest_error(&traced);
    assert!(
        retryable && message.contains("HTTP status 503"),
        "{message}"
    );

    // A 2xx that is not the promised JSON: retrying reads the same answer.
    let (_, traced) = run(&t, &plugin, vec![answer(201, "<html>")]).await;
    let (retryable, message) = guest_error(&traced);
    assert!(!retryable && message.contains("JSON"), "{message}");

    // A transport failure (here: nothing answers this URL) is retryable.
    let (_, traced) = run(&t, &plugin, vec![]).await;
    let (retryable, message) = guest_error(&traced);
    assert!(
        retryable && message.contains("http POST https://pay.example.com/charges"),
        "{message}"
    );

    // A host not in allowed_outbound_hosts: refused by the host, permanent.
    let elsewhere = charge("https://evil.example.com");
    let (_, traced) = run(&t, &elsewhere, vec![answer(201, r#"{"charge_id": "x"}"#)]).await;
    let (retryable, message) = guest_error(&traced);
    assert!(!retryable && message.contains("refused"), "{message}");
    assert!(traced.http[0].refused, "{:?}", traced.http);

    assert_eq!(
        t.count("SELECT count(*) FROM payments").await,
        1,
        "only the 201 wrote"
    );
}
on_both!(the_charge_plugin_maps_answers_to_effects_and_errors);
