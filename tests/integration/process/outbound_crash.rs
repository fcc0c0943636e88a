//! The one crash the inbox cannot cover, for real: the receiver fails after
//! the external payment and before the inbox mark. An `outboxd run` process
//! with the `charge` consumer plugin (plugins/charge) charges an order
//! through a payment provider on loopback (support/payment_provider.rs),
//! stops at `consumer-before-commit` (the provider
//! has answered, the inbox transaction is not committed) and is SIGKILLed.
//! The restarted process gets the message again and charges again, with the
//! same `Idempotency-Key` (the message id, set by the host):
//! - a provider that deduplicates by the key charges once (and the order
//!   has one payment row);
//! - the control, a provider that ignores the key, charges twice, so this
//!   test can fail;
//! - either way `outboxd outbound list --unresolved` finds the key: one
//!   call without an outcome (the intent committed before the send) and the
//!   same request sent twice.
//!
//! Three ways: Postgres and SQLite with the embedded transport, Postgres
//! with Kafka.

use std::process::Stdio;

use std::time::Duration;

use outboxd::event::NewEvent;
use serde_json::{Value, json};

use crate::support::TestDb;
use crate::support::db::with_pool;
use crate::support::kafka::Way;
use crate::support::payment_provider::{Mode, Provider};
use crate::support::plugins::plugin_path;
use crate::support::process::{kill_at_fault, outboxd, terminate};

/// `OUTBOXD__PLUGINS` and `OUTBOXD__CONSUMERS`: the charge plugin may call
/// the provider (and only it), and write `payments`.
async fn charge_config(t: &TestDb, way: &Way, provider: &Provider) -> (String, String) {
    let plugins = format!(
        r#"[{{name = "charge", path = "{path}", limits = {{timeout_ms = 10000}}, allowed_outbound_hosts = ["{url}"], config = {{provider_url = "{url}"}}}}]"#,
        path = plugin_path("charge").display(),
        url = provider.url,
    );
    let mut section = outboxd::config::ConsumerSection::new(
        &way.consumer,
        vec![way.topic.clone()],
        "plugin:charge",
    );
    section.tables.write = vec!["payments".into()];
    let role = match t.provision_plugin_role(&mut section).await {
        Some(r) => format!(", db_role = \"{r}\""),
        None => String::new(),
    };
    let consumers = format!(
        r#"[{{name = "{}", topics = ["{}"], handler = "plugin:charge", max_attempts = 5, tables = {{write = ["payments"]}}{role}}}]"#,
        way.consumer, way.topic
    );
    (plugins, consumers)
}

fn run(
    t: &TestDb,
    way: &Way,
    config: &(String, String),
    fault: Option<&str>,
) -> tokio::process::Child {
    let mut cmd = outboxd(t);
    cmd.arg("run")
        .env("OUTBOXD__PLUGINS", &config.0)
        .env("OUTBOXD__CONSUMERS", &config.1);
    way.configure_transport(&mut cmd);
    match fault {
        // Errors only, so the unread pipe never fills before the fault.
        Some(f) => cmd
            .env("OUTBOXD_FAULT", f)
            .env("OUTBOXD_LOG", "error")
            .stderr(Stdio::piped()),
        None => cmd.stderr(Stdio::null()),
    };
    cmd.spawn().expect("spawn outboxd run")
}

/// Rows of one query of text columns.
async fn texts(t: &TestDb, sql: &str) -> Vec<Vec<Option<String>>> {
    use sqlx::Row;
    with_pool!(&t.db, |p| sqlx::query(sql)
        .fetch_all(p)
        .await
        .expect(sql)
        .iter()
        .map(|r| (0..r.len()).map(|i| r.get(i)).collect())
        .collect())
}

/// `outboxd outbound list ARGS --json`, parsed.
async fn outbound_list(t: &TestDb, args: &[&str]) -> Vec<Value> {
    let out = outboxd(t)
        .args(["outbound", "list", "--json"])
        .args(args)
        .output()
        .await
        .expect("run outboxd outbound list");
    assert!(
        out.status.success(),
        "outboxd outbound list {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "outbound list --json is not a JSON list ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The crash, the restart and the evidence; returns the provider, whose
/// charges the caller judges by its mode.
async fn charge_killed_before_the_inbox_commit(t: &TestDb, way: &Way, mode: Mode) -> Provider {
    way.create_topics(1).await;
    t.exec_app(
        "CREATE TABLE payments (order_id TEXT NOT NULL, charge_id TEXT NOT NULL, message_id TEXT NOT NULL)",
    )
    .await;
    let provider = Provider::start(mode).await;
    let config = charge_config(t, way, &provider).await;
    t.enqueue(NewEvent::new(
        "order-1",
        way.topic.as_str(),
        json!({ "order_id": "order-1", "amount_cents": 1250 }),
    ))
    .await;
    let event_id = texts(t, "SELECT CAST(id AS text) FROM outbox").await[0][0]
        .clone()
        .expect("the event's id");

    // Stopped after the provider answered, before the inbox commit; killed.
    let child = run(t, way, &config, Some("consumer-before-commit"));
    kill_at_fault(child).await;
    let seen = provider.requests();
    assert_eq!(seen.len(), 1, "one request before the crash: {seen:?}");
    assert_eq!(seen[0].status, 201, "the provider answered: {seen:?}");
    assert_eq!(seen[0].idempotency_key.as_deref(), Some(event_id.as_str()));
    assert_eq!(seen[0].order_id.as_deref(), Some("order-1"));
    assert_eq!(
        t.count("SELECT count(*) FROM payments").await,
        0,
        "rolled back"
    );
    assert_eq!(t.count("SELECT count(*) FROM inbox").await, 0, "not marked");
    // The intent committed before the send; its outcome died with the
    // inbox transaction.
    let calls = texts(
        t,
        "SELECT idempotency_key, message_id, method, path, CAST(status AS text), error FROM outbound_calls",
    )
    .await;
    let key = Some(event_id.clone());
    assert_eq!(
        calls,
        [vec![
            key.clone(),
            key.clone(),
            Some("POST".into()),
            Some("/charges".into()),
            None,
            None
        ]],
        "one intent without an outcome"
    );

    // Restarted without the fault: the message is delivered again.
    let mut child = run(t, way, &config, None);
    t.wait_count(Duration::from_secs(90), "SELECT count(*) FROM payments", 1)
        .await;
    t.wait_count(Duration::from_secs(90), "SELECT count(*) FROM inbox", 1)
        .await;
    terminate(&mut child).await;

    let seen = provider.requests();
    assert_eq!(seen.len(), 2, "redelivered once: {seen:?}");
    assert!(
        seen.iter().all(|r| r.idempotency_key == key),
        "the same key both times: {seen:?}"
    );
    let payments = texts(t, "SELECT order_id, charge_id, message_id FROM payments").await;
    let charges = provider.charges();
    assert!(
        charges.iter().all(|c| c.amount_cents == 1250),
        "{charges:?}"
    );
    let last_charge = charges.last().map(|c| c.charge_id.clone());
    assert_eq!(
        payments,
        [vec![Some("order-1".into()), last_charge, key.clone()]],
        "one payment row, with the charge the second answer named"
    );

    // Reconciliation finds the key: an intent without an outcome, and the
    // same request twice. The first call has no outcome; the second has.
    let unresolved = outbound_list(t, &["--unresolved"]).await;
    assert_eq!(unresolved.len(), 1, "{unresolved:#?}");
    let k = &unresolved[0];
    assert_eq!(k["idempotency_key"], json!(event_id));
    assert_eq!(k["unresolved"], json!(true));
    let statuses: Vec<&Value> = k["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| &c["status"])
        .collect();
    assert_eq!(statuses, [&Value::Null, &json!(201)], "{k:#}");
    assert_eq!(
        outbound_list(t, &["--key", &event_id]).await,
        unresolved,
        "--key shows the same calls"
    );
    assert_eq!(
        outbound_list(t, &["--key", "no-such-key"]).await,
        Vec::<Value>::new()
    );
    provider
}

async fn exactly_one_charge_with_a_deduplicating_provider(t: TestDb, way: Way) {
    let provider = charge_killed_before_the_inbox_commit(&t, &way, Mode::Dedupe).await;
    assert_eq!(
        provider.charges_for_order("order-1"),
        1,
        "{:?}",
        provider.charges()
    );
    let seen = provider.requests();
    assert!(
        seen[1].replayed,
        "the second request replayed the first answer: {seen:?}"
    );
    let key = seen[0].idempotency_key.clone().expect("key");
    assert_eq!(provider.charges_for_key(&key), 1);
}

async fn two_charges_with_a_provider_that_ignores_the_key(t: TestDb, way: Way) {
    let provider = charge_killed_before_the_inbox_commit(&t, &way, Mode::IgnoreKey).await;
    assert_eq!(
        provider.charges_for_order("order-1"),
        2,
        "the control: without deduplication at the provider the crash charges twice: {:?}",
        provider.charges()
    );
}

mod a_charge_killed_before_the_inbox_commit {
    use super::{
        Way, exactly_one_charge_with_a_deduplicating_provider as dedupe,
        two_charges_with_a_provider_that_ignores_the_key as ignore,
    };
    use crate::support::TestDb;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn charges_once_on_postgres() {
        dedupe(
            TestDb::postgres().await,
            Way::embedded("order.paid", "charge"),
        )
        .await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn charges_twice_without_dedupe_on_postgres() {
        ignore(
            TestDb::postgres().await,
            Way::embedded("order.paid", "charge"),
        )
        .await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn charges_once_on_sqlite() {
        dedupe(
            TestDb::sqlite().await,
            Way::embedded("order.paid", "charge"),
        )
        .await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn charges_twice_without_dedupe_on_sqlite() {
        ignore(
            TestDb::sqlite().await,
            Way::embedded("order.paid", "charge"),
        )
        .await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn charges_once_on_postgres_with_kafka() {
        dedupe(TestDb::postgres().await, Way::kafka("order.paid", "charge")).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn charges_twice_without_dedupe_on_postgres_with_kafka() {
        ignore(TestDb::postgres().await, Way::kafka("order.paid", "charge")).await
    }
}
