//! A webhook route end to end against a real receiver: signatures, key
//! order, Retry-After, 410, dead answers, address rules, TLS, bad config.

use std::sync::Arc;
use std::time::Duration;

use outboxd::backoff::Backoff;
use outboxd::broker::NullPublisher;
use outboxd::broker::webhook::Sinks;
use outboxd::broker::webhook::metrics::WebhookMetrics;
use outboxd::clock::SystemClock;
use outboxd::config::Config;
use outboxd::config::webhook::WebhookSink;
use outboxd::relay::{Relay, RelayConfig, StepOutcome};
use outboxd::route::{Route, Router};
use outboxd::store::outbox::route_pauses;
use outboxd::store::{AnyStore, Db};
use serde_json::json;

use crate::support::eventually::eventually;
use crate::support::webhook_receiver::{Answer, Receiver, SECRET};
use crate::support::{TestDb, db, on_both};

const ROUTE: &str = "billing-hook";

/// A relay whose `order.*` events go to `url` through route [`ROUTE`].
async fn relay_to(
    t: &TestDb,
    url: &str,
    metrics: &WebhookMetrics,
) -> Relay<AnyStore, Sinks<NullPublisher>> {
    let routes = vec![Route::webhook(
        "order.*",
        ROUTE,
        WebhookSink::new(url, SECRET),
    )];
    let sinks = Sinks::start(NullPublisher, &routes, &t.db, metrics)
        .await
        .expect("the webhook route starts");
    let config = RelayConfig {
        // Short, so that only a Retry-After explains a longer wait.
        backoff: Backoff {
            base_seconds: 0.05,
            max_seconds: 0.1,
        },
        ..RelayConfig::default()
    };
    Relay::new(
        t.store(),
        sinks,
        Router::new(routes),
        config,
        Arc::new(SystemClock),
    )
}

async fn put(db: &Db, key: &str, n: usize) -> uuid::Uuid {
    db::put(db, key, "order.confirmed", json!({"key": key, "n": n})).await
}

/// Steps the relay until nothing is left to publish.
async fn drain(t: &TestDb, relay: &Relay<AnyStore, Sinks<NullPublisher>>, within: Duration) {
    eventually(within, "every event published", async || {
        relay.step().await.expect("step");
        let left = t
            .count("SELECT count(*) FROM outbox WHERE published_at IS NULL AND dead_at IS NULL")
            .await;
        if left == 0 {
            Ok(())
        } else {
            Err(format!("{left} unpublished"))
        }
    })
    .await;
}

async fn signed_requests_keep_key_order_with_a_receiver_that_delays_at_random(t: TestDb) {
    let receiver = Receiver::start().await;
    receiver.delay_up_to(15);
    let metrics = WebhookMetrics::default();
    let relay = relay_to(&t, &receiver.url(), &metrics).await;
    let mut ids = Vec::new();
    for n in 0..15 {
        for key in ["k1", "k2", "k3", "k4"] {
            ids.push(put(&t.db, key, n).await);
        }
    }
    drain(&t, &relay, Duration::from_secs(60)).await;

    let got = receiver.got();
    assert!(got.iter().all(|g| g.verified), "every signature verifies");
    let mut sent: Vec<String> = got.iter().map(|g| g.id.clone()).collect();
    sent.sort();
    let mut want: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
    want.sort();
    assert_eq!(
        sent, want,
        "one request per event, webhook-id = the event id"
    );
    assert_eq!(
        receiver.max_in_flight_per_key(),
        1,
        "one request in flight per key"
    );
    for key in ["k1", "k2", "k3", "k4"] {
        let order: Vec<u64> = receiver
            .applied()
            .iter()
            .filter(|(k, _)| k.as_deref() == Some(key))
            .map(|(_, p)| p["n"].as_u64().expect("n"))
            .collect();
        assert_eq!(order, (0..15).collect::<Vec<_>>(), "key {key} in order");
    }
    assert_eq!(metrics.requests(ROUTE, "2xx"), 60);
}
on_both!(signed_requests_keep_key_order_with_a_receiver_that_delays_at_random);

async fn a_429_with_retry_after_is_honoured(t: TestDb) {
    let receiver = Receiver::start().await;
    receiver.script([Answer::RetryAfter(429, 2)]);
    let metrics = WebhookMetrics::default();
    let relay = relay_to(&t, &receiver.url(), &metrics).await;
    put(&t.db, "k1", 0).await;
    match relay.step().await.expect("step") {
        StepOutcome::Published(r) => assert_eq!(r.retried, 1, "{r:?}"),
        other => panic!("expected a retry, got {other:?}"),
    }
    let last_error: String = t.one("SELECT last_error FROM outbox").await;
    assert!(
        last_error.contains("429") && last_error.contains("retry after 2s"),
        "{last_error}"
    );
    drain(&t, &relay, Duration::from_secs(30)).await;
    let got = receiver.got();
    assert_eq!(got.len(), 2, "one refused request, one accepted");
    let waited = got[1].at - got[0].at;
    assert!(
        waited >= Duration::from_millis(1900),
        "the second request came {waited:?} after the 429, before its Retry-After of 2 s"
    );
    assert_eq!(got[0].id, got[1].id, "the same webhook-id");
    assert_eq!(metrics.requests(ROUTE, "4xx"), 1);
}
on_both!(a_429_with_retry_after_is_honoured);

async fn a_410_stops_the_route_until_it_is_resumed(t: TestDb) {
    let receiver = Receiver::start().await;
    receiver.script([Answer::Status(410)]);
    let metrics = WebhookMetrics::default();
    let relay = relay_to(&t, &receiver.url(), &metrics).await;
    put(&t.db, "k1", 0).await;
    put(&t.db, "k2", 0).await;
    // The first request meets the 410; the other key's waits, not sent.
    for _ in 0..3 {
        relay.step().await.expect("step");
        t.make_all_due().await;
    }
    assert!(metrics.is_paused(ROUTE), "the pause is raised as a metric");
    let paused = route_pauses::paused(&t.db).await.expect("pauses");
    assert_eq!(paused.len(), 1);
    assert!(paused[0].reason.contains("410"), "{:?}", paused[0]);
    let got = receiver.got().len();
    assert!(got <= 2, "at most the two first requests went out: {got}");
    let attempts: i64 = t
        .count("SELECT COALESCE(SUM(attempts), 0) FROM outbox")
        .await;
    assert_eq!(
        attempts, 0,
        "a 410 and waiting while paused count no attempt"
    );
    let last_error: String = t
        .one("SELECT last_error FROM outbox WHERE last_error IS NOT NULL ORDER BY seq LIMIT 1")
        .await;
    assert!(
        last_error.contains("outboxd route resume billing-hook"),
        "{last_error}"
    );
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL")
            .await,
        0,
        "nothing dies while the route is paused"
    );
    assert!(route_pauses::resume(&t.db, ROUTE).await.expect("resume"));
    eventually(
        Duration::from_secs(30),
        "both delivered after resume",
        async || {
            t.make_all_due().await;
            relay.step().await.expect("step");
            receiver.applied().len() == 2
        },
    )
    .await;
    assert!(!metrics.is_paused(ROUTE), "the alert clears");
}
on_both!(a_410_stops_the_route_until_it_is_resumed);

async fn a_4xx_or_a_redirect_is_dead_at_once_with_the_status_and_the_fix(t: TestDb) {
    let receiver = Receiver::start().await;
    receiver.script([
        Answer::Body(422, "order 7 is unknown to billing".into()),
        Answer::Redirect("https://elsewhere.example/hooks".into()),
    ]);
    let metrics = WebhookMetrics::default();
    let relay = relay_to(&t, &receiver.url(), &metrics).await;
    put(&t.db, "k1", 0).await;
    relay.step().await.expect("step");
    put(&t.db, "k2", 0).await;
    relay.step().await.expect("step");
    let reasons: Vec<(String, Option<String>)> = db::pairs(
        &t.db,
        "SELECT aggregate_id, dead_reason FROM outbox ORDER BY seq",
    )
    .await;
    let reason = |i: usize| reasons[i].1.clone().unwrap_or_default();
    assert!(
        reason(0).contains("422") && reason(0).contains("order 7 is unknown to billing"),
        "{reasons:?}"
    );
    assert!(
        reason(1).contains("302")
            && reason(1).contains("https://elsewhere.example/hooks")
            && reason(1).contains("follows no redirects"),
        "{reasons:?}"
    );
    assert_eq!(receiver.got().len(), 2, "each tried once");
}
on_both!(a_4xx_or_a_redirect_is_dead_at_once_with_the_status_and_the_fix);

async fn a_name_that_resolves_to_loopback_is_refused_unless_the_url_names_it(t: TestDb) {
    let receiver = Receiver::start().await;
    let by_name = format!("http://localhost:{}/hooks", receiver.addr.port());
    let metrics = WebhookMetrics::default();
    let relay = relay_to(&t, &by_name, &metrics).await;
    put(&t.db, "k1", 0).await;
    relay.step().await.expect("step");
    let last_error: String = t.one("SELECT last_error FROM outbox").await;
    assert!(
        last_error.contains("loopback") && last_error.contains("names it literally"),
        "{last_error}"
    );
    assert!(receiver.got().is_empty(), "no request reached the receiver");
}
on_both!(a_name_that_resolves_to_loopback_is_refused_unless_the_url_names_it);

fn config(route: &str, env: &[(&str, &str)]) -> Result<Config, String> {
    let text = format!("[database]\nurl = \"sqlite::memory:\"\n\n[[routes]]\n{route}\n");
    Config::from_toml(
        "test.toml",
        &text,
        env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
    )
    .map_err(|e| e.to_string())
}

/// A route's TOML, its environment, and what the error must say.
type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [&'a str]);

#[test]
fn bad_webhook_routes_are_refused_naming_the_key_and_the_fix() {
    let ok = [("HOOK_SECRET", SECRET)];
    let cases: [Case; 7] = [
        (
            r#"event_type = "order.*"
name = "h"
webhook = { url = "ftp://billing/hooks", secret_env = "HOOK_SECRET" }"#,
            &ok,
            &["routes[0].webhook.url", "not http or https"],
        ),
        (
            r#"event_type = "order.*"
name = "h"
webhook = { url = "https://billing/hooks", secret_env = "NOT_SET_ANYWHERE" }"#,
            &[],
            &[
                "routes[0].webhook.secret_env",
                "NOT_SET_ANYWHERE",
                "not set",
            ],
        ),
        (
            r#"event_type = "order.*"
name = "h"
webhook = { url = "https://billing/hooks", secret_file = "/nonexistent/secret" }"#,
            &[],
            &[
                "routes[0].webhook.secret_file",
                "cannot read /nonexistent/secret",
            ],
        ),
        (
            r#"event_type = "order.*"
webhook = { url = "https://billing/hooks", secret_env = "HOOK_SECRET" }"#,
            &ok,
            &["routes[0].name", "needs a name"],
        ),
        (
            r#"event_type = "order.*"
name = "h"
topic = "orders"
webhook = { url = "https://billing/hooks", secret_env = "HOOK_SECRET" }"#,
            &ok,
            &["routes[0].topic", "has no topic"],
        ),
        (
            r#"event_type = "order.*"
name = "h"
webhook = { url = "https://user:pw@billing/hooks", secret_env = "HOOK_SECRET" }"#,
            &ok,
            &["routes[0].webhook.url", "user information"],
        ),
        (
            r#"event_type = "order.*"
name = "h"
webhook = { url = "https://billing/hooks" }"#,
            &ok,
            &["routes[0].webhook.secret_env", "needs a signing secret"],
        ),
    ];
    for (route, env, says) in cases {
        let e = config(route, env).expect_err(route);
        assert!(says.iter().all(|s| e.contains(s)), "{route}\n=> {e}");
        assert!(!e.contains(&SECRET[6..]), "the secret is shown: {e}");
    }
    let fine = config(
        r#"event_type = "order.*"
name = "h"
webhook = { url = "https://billing/hooks", secret_env = "HOOK_SECRET" }"#,
        &ok,
    )
    .expect("a good webhook route loads");
    assert!(
        !format!("{fine:?}").contains(&SECRET[6..]),
        "Debug shows no secret"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_that_is_not_whsec_base64_stops_the_start_without_showing_it() {
    let t = TestDb::sqlite().await;
    let secret = "not-a-standard-secret-value";
    let routes = vec![Route::webhook(
        "order.*",
        ROUTE,
        WebhookSink::new("https://billing.example/hooks", secret),
    )];
    let Err(e) = Sinks::start(NullPublisher, &routes, &t.db, &WebhookMetrics::default()).await
    else {
        panic!("a bad secret starts");
    };
    let e = e.to_string();
    assert!(
        e.contains("routes[0].webhook.secret_env") && e.contains("whsec_") && !e.contains(secret),
        "{e}"
    );
}

async fn https_verifies_the_endpoint_against_the_ca_file(t: TestDb) {
    let ca = crate::support::tls::TestCa::new();
    let receiver = Receiver::start_tls(ca.acceptor()).await;
    let url = format!("https://127.0.0.1:{}/hooks", receiver.addr.port());
    let metrics = WebhookMetrics::default();

    // Without the CA the server's certificate is refused: nothing is sent.
    let relay = relay_to(&t, &url, &metrics).await;
    put(&t.db, "k1", 0).await;
    relay.step().await.expect("step");
    let last_error: String = t.one("SELECT last_error FROM outbox").await;
    assert!(last_error.contains("TLS"), "{last_error}");
    assert!(
        receiver.got().is_empty(),
        "no request without a trusted chain"
    );

    let mut sink = WebhookSink::new(url.as_str(), SECRET);
    sink.ca_file = Some(ca.ca_file().display().to_string());
    let routes = vec![Route::webhook("order.*", ROUTE, sink)];
    let sinks = Sinks::start(NullPublisher, &routes, &t.db, &metrics)
        .await
        .expect("starts with the CA");
    let relay = Relay::new(
        t.store(),
        sinks,
        Router::new(routes),
        RelayConfig {
            backoff: Backoff {
                base_seconds: 0.05,
                max_seconds: 0.1,
            },
            ..RelayConfig::default()
        },
        Arc::new(SystemClock),
    );
    drain(&t, &relay, Duration::from_secs(30)).await;
    let got = receiver.got();
    assert_eq!(got.len(), 1);
    assert!(got[0].verified);
}
on_both!(https_verifies_the_endpoint_against_the_ca_file);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_file_that_is_not_pem_stops_the_start_naming_the_key() {
    let t = TestDb::sqlite().await;
    let dir = tempfile::tempdir().expect("dir");
    let bad = dir.path().join("ca.pem");
    std::fs::write(&bad, "not a certificate").expect("write");
    let mut sink = WebhookSink::new("https://billing.example/hooks", SECRET);
    sink.ca_file = Some(bad.display().to_string());
    let routes = vec![Route::webhook("order.*", ROUTE, sink)];
    let Err(e) = Sinks::start(NullPublisher, &routes, &t.db, &WebhookMetrics::default()).await
    else {
        panic!("a bad ca_file starts");
    };
    let e = e.to_string();
    assert!(
        e.contains("routes[0].webhook.ca_file") && e.contains("no certificate"),
        "{e}"
    );
}
