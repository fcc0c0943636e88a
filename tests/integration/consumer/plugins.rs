//! Consumer plugins in the inbox: the billing plugin's exactly-once effect,
//! rollback of everything a failed plugin wrote (including emitted events),
//! the statement guard, budgets and deadlines, and the Postgres role.
//!
//! The components come from `bash plugins/build.sh`.

use std::sync::Arc;

use outboxd::config::PluginSpec;
use outboxd::config::TxnPolicy;
use outboxd::consumer::batch::process_batch;
use outboxd::consumer::{HandlerError, PluginHandler, Processed, process};
use outboxd::plugin::ConsumerPlugin;
use outboxd_demo::billing;

use crate::support::plugins::{billing_plugin, counts, engine, handler, order, plugin_path};
use crate::support::{TestDb, on_both};

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
    let broken = handler(
        "hostile-consumer-trap",
        &[],
        crate::support::plugin_policy(),
    );
    let fixed = handler(
        "hostile-consumer-trap",
        &[("trap", "false")],
        crate::support::plugin_policy(),
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
        crate::support::plugin_policy(),
    );
    let d = order(1, "p1");
    let err = process(&t.db, "billing", &d, &failing)
        .await
        .expect_err("the handler fails after emitting");
    assert!(matches!(err, HandlerError::Retryable(_)), "{err:?}");
    assert_eq!(counts(&t).await, (0, 0, 0), "no invoice, mark or event");
    let ok = handler("invoicing", &[], crate::support::plugin_policy());
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
            crate::support::plugin_policy(),
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
    spec.limits.timeout = std::time::Duration::from_millis(200);
    let plugin = Arc::new(ConsumerPlugin::load(engine(), &spec).expect("load"));
    let h = PluginHandler::new(plugin, crate::support::plugin_policy());
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
        ..crate::support::plugin_policy()
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
    let hostile = handler(
        "hostile-consumer-trap",
        &[],
        crate::support::plugin_policy(),
    );
    let next = [order(3, "c"), order(4, "d")];
    let results = process_batch(&t.db, "billing", &next, &hostile)
        .await
        .expect("batch");
    assert_eq!(results.len(), 1, "the batch stops at the failure");
    assert!(results[0].is_err());
    assert_eq!(counts(&t).await, (2, 2, 0));
}
on_both!(batched_savepoints_roll_back_only_the_failed_message);
