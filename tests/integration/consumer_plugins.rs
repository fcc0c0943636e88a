//! Consumer plugins in the inbox: the billing plugin's exactly-once effect,
//! rollback of everything a failed plugin wrote (including emitted events),
//! the statement guard, budgets and deadlines, and the Postgres role.
//!
//! The components come from `bash plugins/build.sh`.

use std::sync::Arc;

use outboxd::broker::{Delivery, headers};
use outboxd::consumer::inbox::process_batch;
use outboxd::consumer::{ConsumerHandler, HandlerError, PluginHandler, Processed, process};
use outboxd::domain::billing;
use outboxd::plugin::{ConsumerPlugin, PluginSpec, TxnPolicy};

use crate::on_both;
use crate::plugins::{engine, plugin_path};
use crate::support::TestDb;

fn handler(name: &str, config: &[(&str, &str)], policy: TxnPolicy) -> PluginHandler {
    let mut spec = PluginSpec::new(name, plugin_path(name));
    spec.version = Some("test-1".into());
    // Database round trips count against the deadline; a busy CI machine
    // needs room.
    spec.limits.timeout_ms = 2_000;
    for (k, v) in config {
        spec.config.insert((*k).into(), (*v).into());
    }
    let plugin = ConsumerPlugin::load(engine(), &spec).expect("load consumer plugin");
    PluginHandler::new(Arc::new(plugin), policy)
}

fn billing_plugin() -> PluginHandler {
    handler("billing", &[], TxnPolicy::default())
}

pub fn order(offset: i64, order_id: &str) -> Delivery {
    Delivery {
        attempt: 0,
        topic: "order.confirmed".into(),
        partition: 0,
        offset,
        key: Some(order_id.as_bytes().to_vec()),
        payload: format!(r#"{{"order_id":"{order_id}","customer_id":"c1","total_cents":500}}"#)
            .into_bytes(),
        headers: vec![(
            headers::MESSAGE_ID.into(),
            uuid::Uuid::new_v4().to_string().into_bytes(),
        )],
    }
}

pub async fn counts(t: &TestDb) -> (i64, i64, i64) {
    (
        t.count("SELECT count(*) FROM invoices").await,
        t.count("SELECT count(*) FROM inbox").await,
        t.count("SELECT count(*) FROM outbox").await,
    )
}

async fn duplicate_delivery_is_discarded_with_the_billing_plugin(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let h = billing_plugin();
    let d = order(1, "p1");
    let first = process(&t.db, "billing", &d, &h).await.expect("first");
    let second = process(&t.db, "billing", &d, &h).await.expect("second");
    assert_eq!((first, second), (Processed::Handled, Processed::Duplicate));
    assert_eq!(counts(&t).await, (1, 1, 0));
    let message_id = d.message_id().expect("id").to_string();
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM invoices WHERE message_id = '{message_id}' AND order_id = 'p1' AND amount_cents = 500"
        ))
        .await,
        1,
        "the invoice carries the message id (the external idempotency key)"
    );
}
on_both!(duplicate_delivery_is_discarded_with_the_billing_plugin);

async fn billing_plugin_reads_a_cloudevents_envelope(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let mut d = order(1, "p1");
    d.payload = br#"{"specversion":"1.0","id":"x","source":"/orders","type":"order.confirmed","data":{"order_id":"ce-1","customer_id":"c9","total_cents":700}}"#.to_vec();
    process(&t.db, "billing", &d, &billing_plugin())
        .await
        .expect("handled");
    assert_eq!(
        t.count("SELECT count(*) FROM invoices WHERE order_id = 'ce-1' AND amount_cents = 700")
            .await,
        1
    );
}
on_both!(billing_plugin_reads_a_cloudevents_envelope);

async fn trap_after_write_leaves_no_effect_and_redelivery_succeeds_once(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let broken = handler("hostile-consumer-trap", &[], TxnPolicy::default());
    let fixed = handler(
        "hostile-consumer-trap",
        &[("trap", "false")],
        TxnPolicy::default(),
    );
    let d = order(1, "p1");
    let err = process(&t.db, "billing", &d, &broken)
        .await
        .expect_err("the plugin traps");
    let HandlerError::Retryable(text) = err else {
        panic!("a trap is retryable, got {err:?}")
    };
    assert!(
        text.starts_with("plugin hostile-consumer-trap@test-1: trapped"),
        "{text}"
    );
    assert_eq!(counts(&t).await, (0, 0, 0), "no effect and no inbox mark");
    assert_eq!(
        process(&t.db, "billing", &d, &fixed)
            .await
            .expect("redelivery"),
        Processed::Handled
    );
    assert_eq!(
        process(&t.db, "billing", &d, &fixed).await.expect("again"),
        Processed::Duplicate
    );
    assert_eq!(counts(&t).await, (1, 1, 0));
}
on_both!(trap_after_write_leaves_no_effect_and_redelivery_succeeds_once);

async fn emit_is_atomic_with_the_effect(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let failing = handler(
        "invoicing",
        &[("fail_after_emit", "true")],
        TxnPolicy::default(),
    );
    let d = order(1, "p1");
    let err = process(&t.db, "billing", &d, &failing)
        .await
        .expect_err("the handler fails after emitting");
    assert!(matches!(err, HandlerError::Retryable(_)), "{err:?}");
    assert_eq!(counts(&t).await, (0, 0, 0), "no invoice, mark or event");
    let ok = handler("invoicing", &[], TxnPolicy::default());
    process(&t.db, "billing", &d, &ok).await.expect("handled");
    process(&t.db, "billing", &d, &ok).await.expect("duplicate");
    assert_eq!(counts(&t).await, (1, 1, 1));
    assert_eq!(
        t.count(
            "SELECT count(*) FROM outbox WHERE event_type = 'invoice.issued' AND aggregate_id = 'p1'"
        )
        .await,
        1
    );
}
on_both!(emit_is_atomic_with_the_effect);

async fn hostile_statements_are_refused_and_leave_nothing(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let d = order(1, "p1");
    for attack in ["commit", "ddl", "set_role", "multi", "set_config"] {
        let h = handler(
            "hostile-consumer-sql",
            &[("attack", attack)],
            TxnPolicy::default(),
        );
        let err = process(&t.db, "billing", &d, &h).await.expect_err(attack);
        let HandlerError::Retryable(text) = err else {
            panic!("{attack}: {err:?}")
        };
        assert!(text.contains("statement refused"), "{attack}: {text}");
        assert_eq!(counts(&t).await, (0, 0, 0), "{attack}");
    }
    // The host keeps working: the same message is then handled once.
    process(&t.db, "billing", &d, &billing_plugin())
        .await
        .expect("handled");
    assert_eq!(counts(&t).await, (1, 1, 0));
}
on_both!(hostile_statements_are_refused_and_leave_nothing);

async fn a_plugin_looping_over_host_calls_is_stopped(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let mut spec = PluginSpec::new(
        "hostile-consumer-loop",
        plugin_path("hostile-consumer-loop"),
    );
    spec.version = Some("test-1".into());
    spec.limits.timeout_ms = 200;
    let plugin = Arc::new(ConsumerPlugin::load(engine(), &spec).expect("load"));
    let h = PluginHandler::new(plugin, TxnPolicy::default());
    let d = order(1, "p1");
    let start = std::time::Instant::now();
    let err = process(&t.db, "billing", &d, &h)
        .await
        .expect_err("the deadline stops it");
    let HandlerError::Retryable(text) = err else {
        panic!("{err:?}")
    };
    assert!(text.contains("timed out"), "{text}");
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(counts(&t).await, (0, 0, 0));
    process(&t.db, "billing", &d, &billing_plugin())
        .await
        .expect("the host keeps running");
    assert_eq!(counts(&t).await, (1, 1, 0));
}
on_both!(a_plugin_looping_over_host_calls_is_stopped);

async fn statement_budget_obeyed_and_violated(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let tight = TxnPolicy {
        max_statements: 1,
        ..TxnPolicy::default()
    };
    // invoicing runs two statements (the insert and the emit).
    let d = order(1, "p1");
    let err = process(
        &t.db,
        "billing",
        &d,
        &handler("invoicing", &[], tight.clone()),
    )
    .await
    .expect_err("over budget");
    assert!(format!("{err}").contains("budget exceeded"), "{err}");
    assert_eq!(counts(&t).await, (0, 0, 0));
    // billing runs one.
    process(&t.db, "billing", &d, &handler("billing", &[], tight))
        .await
        .expect("within budget");
    assert_eq!(counts(&t).await, (1, 1, 0));
}
on_both!(statement_budget_obeyed_and_violated);

async fn batched_savepoints_roll_back_only_the_failed_message(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let batch = [order(1, "a"), order(2, "b")];
    let results = process_batch(&t.db, "billing", &batch, &billing_plugin())
        .await
        .expect("batch");
    assert!(results.iter().all(|r| matches!(r, Ok(Processed::Handled))));
    let hostile = handler("hostile-consumer-trap", &[], TxnPolicy::default());
    let next = [order(3, "c"), order(4, "d")];
    let results = process_batch(&t.db, "billing", &next, &hostile)
        .await
        .expect("batch");
    assert_eq!(results.len(), 1, "the batch stops at the failure");
    assert!(results[0].is_err());
    assert_eq!(counts(&t).await, (2, 2, 0));
}
on_both!(batched_savepoints_roll_back_only_the_failed_message);

/// The database, not only the guard, limits the plugin: under a role with
/// rights on `invoices` alone, reading `outbox` is a database error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_role_limits_what_a_plugin_can_touch() {
    let t = TestDb::postgres().await;
    billing::create_schema(&t.db).await.expect("billing schema");
    let role = format!("billing_{}", uuid::Uuid::new_v4().simple());
    t.exec(&format!("CREATE ROLE {role} NOLOGIN")).await;
    t.exec(&format!("GRANT SELECT, INSERT ON invoices TO {role}"))
        .await;
    let policy = TxnPolicy {
        db_role: Some(role.clone()),
        statement_timeout_ms: 2_000,
        ..TxnPolicy::default()
    };
    // An event the plugin must not be able to delete.
    t.exec("SELECT outbox_enqueue('a1', 'order.confirmed', '{}'::jsonb, '{}'::jsonb)")
        .await;
    let d = order(1, "p1");
    for attack in ["read_outbox", "write_outbox"] {
        let hostile = handler(
            "hostile-consumer-sql",
            &[("attack", attack)],
            policy.clone(),
        );
        let err = process(&t.db, "billing", &d, &hostile)
            .await
            .expect_err("permission denied");
        assert!(format!("{err}").contains("42501"), "{attack}: {err}");
        // Nothing committed: no invoice, no inbox mark, the event is still there.
        assert_eq!(counts(&t).await, (0, 0, 1), "{attack}");
    }
    // Within its rights the plugin works, and the host gets its own role
    // back for the next message's inbox mark in the same transaction.
    let billing = handler("billing", &[], policy);
    let results = process_batch(&t.db, "billing", &[d, order(2, "p2")], &billing)
        .await
        .expect("batch");
    assert!(
        results.iter().all(|r| matches!(r, Ok(Processed::Handled))),
        "{results:?}"
    );
    assert_eq!(counts(&t).await, (2, 2, 1));
    t.exec(&format!("DROP OWNED BY {role}")).await;
    t.exec(&format!("DROP ROLE {role}")).await;
}

/// Postgres stops a statement that outlives `statement_timeout_ms`; the
/// message is rolled back and the host goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_obeyed_and_violated() {
    let t = TestDb::postgres().await;
    billing::create_schema(&t.db).await.expect("billing schema");
    let policy = TxnPolicy {
        statement_timeout_ms: 300,
        ..TxnPolicy::default()
    };
    let d = order(1, "p1");
    let slow = handler(
        "hostile-consumer-sql",
        &[("attack", "slow")],
        policy.clone(),
    );
    let start = std::time::Instant::now();
    let err = process(&t.db, "billing", &d, &slow)
        .await
        .expect_err("statement timeout");
    // 57014: query_canceled.
    assert!(format!("{err}").contains("57014"), "{err}");
    assert!(start.elapsed() < std::time::Duration::from_secs(2));
    assert_eq!(counts(&t).await, (0, 0, 0));
    process(&t.db, "billing", &d, &handler("billing", &[], policy))
        .await
        .expect("a quick statement passes under the same timeout");
    assert_eq!(counts(&t).await, (1, 1, 0));
}

/// The same timeout through the wrapper `outboxd run` uses for a
/// `[[consumers]]` entry: the wrapper must pass the plugin's transaction
/// settings on, in per-message and in batched transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_holds_behind_the_configured_handler() {
    let t = TestDb::postgres().await;
    billing::create_schema(&t.db).await.expect("billing schema");
    let policy = TxnPolicy {
        statement_timeout_ms: 300,
        ..TxnPolicy::default()
    };
    let slow = ConsumerHandler::Plugin(handler(
        "hostile-consumer-sql",
        &[("attack", "slow")],
        policy,
    ));
    let err = process(&t.db, "billing", &order(1, "p1"), &slow)
        .await
        .expect_err("statement timeout, per message");
    assert!(format!("{err}").contains("57014"), "{err}");
    let results = process_batch(&t.db, "billing", &[order(2, "p2")], &slow)
        .await
        .expect("the batch transaction itself works");
    let err = results[0].as_ref().expect_err("statement timeout, batched");
    assert!(format!("{err}").contains("57014"), "{err}");
    assert_eq!(counts(&t).await, (0, 0, 0));
}

/// A query that returns more rows than `max_rows` is cut off as a budget
/// error and the message is rolled back.
async fn row_budget_obeyed_and_violated(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let tight = TxnPolicy {
        max_rows: 10,
        ..TxnPolicy::default()
    };
    let d = order(1, "p1");
    let rows = handler("hostile-consumer-sql", &[("attack", "rows")], tight.clone());
    let err = process(&t.db, "billing", &d, &rows)
        .await
        .expect_err("over the row budget");
    assert!(format!("{err}").contains("budget exceeded"), "{err}");
    assert_eq!(counts(&t).await, (0, 0, 0));
    process(&t.db, "billing", &d, &handler("billing", &[], tight))
        .await
        .expect("billing reads no rows");
    assert_eq!(counts(&t).await, (1, 1, 0));
}
on_both!(row_budget_obeyed_and_violated);

/// Guest JSON reaches Postgres as written: a number beyond f64 keeps every
/// digit (it used to be parsed into an f64 first), in `jsonb` and `json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_json_keeps_big_numbers_on_postgres() {
    use outboxd::plugin::bindings::consumer::outbox::plugin::transaction::Value;
    use outboxd::plugin::sql_values::{bind_pg, pg_row};
    let t = TestDb::postgres().await;
    let outboxd::store::Db::Postgres(pool) = &t.db else {
        panic!("a Postgres TestDb")
    };
    let doc = r#"{"n": 123456789012345678901234567890, "big": 1e400}"#;
    let q = bind_pg(
        sqlx::query("SELECT ($1::jsonb ->> 'n') AS n, $2::json AS j"),
        vec![Value::Json(doc.into()), Value::Json(doc.into())],
    )
    .expect("bind");
    let row = q.fetch_one(pool).await.expect("query");
    let cells = pg_row(&row).expect("cells");
    assert!(
        matches!(&cells[0], Value::Text(n) if n == "123456789012345678901234567890"),
        "{cells:?}"
    );
    assert!(
        // jsonb writes 1e400 out in full: every digit, no f64 infinity.
        matches!(&cells[1], Value::Json(j)
            if j.contains("123456789012345678901234567890")
                && j.contains(&format!("1{}", "0".repeat(400)))),
        "{cells:?}"
    );
    let refused = bind_pg(
        sqlx::query("SELECT $1::jsonb"),
        vec![Value::Json("{".into())],
    );
    assert!(refused.is_err());
}
