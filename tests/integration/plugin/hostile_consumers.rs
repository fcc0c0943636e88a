//! Hostile consumer plugins, beyond `consumer/plugins.rs`: fork-bomb
//! recursion, stack overflow, a giant allocation, SQL text that is not
//! UTF-8, and ten thousand host calls in one message. Each failing message
//! is rolled back (its invoice vanishes) and retried, with a reason that
//! says why; the same plugin then handles the next message, of another
//! partition, at once.

use std::sync::Arc;

use outboxd::config::PluginSpec;
use outboxd::consumer::{HandlerError, PluginHandler, process};
use outboxd::message::Delivery;
use outboxd::plugin::ConsumerPlugin;
use outboxd_demo::billing;
use serde_json::{Value, json};

use crate::support::plugins::{counts, engine, order, plugin_path};
use crate::support::{TestDb, on_both};

fn misbehaving() -> PluginHandler {
    let name = "hostile-consumer-misbehave";
    let mut spec = PluginSpec::new(name, plugin_path(name));
    spec.version = Some("test-1".into());
    // Room for the database round trip on a busy machine; the fork bomb
    // still needs far longer.
    spec.limits.timeout = std::time::Duration::from_millis(1_000);
    let plugin = ConsumerPlugin::load(engine(), &spec).expect("load consumer plugin");
    PluginHandler::new(Arc::new(plugin), crate::support::plugin_policy())
}

fn message(partition: i32, offset: i64, payload: Value) -> Delivery {
    let mut d = order(offset, &format!("o{offset}"));
    d.partition = partition;
    d.payload = serde_json::to_vec(&payload).expect("json");
    d
}

async fn hostile_consumer_messages_roll_back_and_the_plugin_keeps_serving(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let h = misbehaving();
    let cases = [
        (json!({"fork": 64}), "timed out after 1000 ms"),
        (
            json!({"recurse": 100_000_000u64}),
            "trapped: wasm trap: out of bounds memory access",
        ),
        (json!({"alloc_mib": 512}), "out of memory"),
        (json!({"bad_utf8_sql": true}), "utf-8"),
    ];
    let mut handled = 0;
    for (i, (payload, why)) in cases.into_iter().enumerate() {
        let offset = i as i64;
        let err = process(&t.db, "billing", &message(0, offset, payload.clone()), &h)
            .await
            .expect_err("the hostile message fails");
        let HandlerError::Retryable(text) = &err else {
            panic!("{payload}: a sandbox failure is retried, got {err:?}");
        };
        assert!(text.contains(why), "{payload}: {text}");
        assert_eq!(
            counts(&t).await,
            (handled, handled, 0),
            "{payload}: its invoice was rolled back"
        );
        // Another partition's message, right after, on the same plugin.
        process(&t.db, "billing", &message(1, 100 + offset, json!({})), &h)
            .await
            .unwrap_or_else(|e| panic!("after {payload}: the plugin keeps serving: {e:?}"));
        handled += 1;
        assert_eq!(counts(&t).await, (handled, handled, 0));
    }
    process(
        &t.db,
        "billing",
        &message(2, 200, json!({"host_calls": 10_000})),
        &h,
    )
    .await
    .expect("ten thousand host calls fit the deadline");
    assert_eq!(counts(&t).await, (handled + 1, handled + 1, 0));
}
on_both!(hostile_consumer_messages_roll_back_and_the_plugin_keeps_serving);
