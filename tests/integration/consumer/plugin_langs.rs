//! Consumer plugins in Python (`py-ledger`) and JavaScript (`js-ledger`):
//! the effect and the emitted event commit with the inbox mark, and every
//! kind of `db-error` reaches the plugin's code as an error it can catch
//! (a unique violation becomes the plugin's own permanent error) or, when
//! it escapes `handle`, the plugin error the Rust SDK would give, never a
//! trap. Rust's side of the same boundary is checked on `billing`.
//!
//! The components come from `bash plugins/build.sh`.

use std::sync::Arc;

use outboxd::config::PluginSpec;
use outboxd::config::TableGrants;
use outboxd::config::TxnPolicy;
use outboxd::consumer::{HandlerError, PluginHandler, Processed, process};
use outboxd::message::Delivery;
use outboxd::message::headers;
use outboxd::plugin::ConsumerPlugin;
use outboxd::store::Db;

use crate::support::plugins::{self, billing_plugin, engine, plugin_path};
use crate::support::{TestDb, on_both};

const LANGS: [&str; 2] = ["py-ledger", "js-ledger"];

fn policy(write: &[&str]) -> TxnPolicy {
    TxnPolicy {
        consumer: "ledger".into(),
        tables: TableGrants {
            read: vec![],
            write: write.iter().map(|t| (*t).to_string()).collect(),
        },
        ..TxnPolicy::default()
    }
}

fn ledger_handler(name: &str, policy: TxnPolicy) -> PluginHandler {
    let mut spec = PluginSpec::new(name, plugin_path(name));
    spec.version = Some("test-1".into());
    // An interpreter's first call on a busy CI machine needs room.
    spec.limits.timeout = std::time::Duration::from_secs(5);
    let plugin = ConsumerPlugin::load(engine(), &spec).expect("load consumer plugin");
    PluginHandler::new(Arc::new(plugin), policy)
}

async fn create_ledger(t: &TestDb) {
    t.exec_app(match &t.db {
        Db::Postgres(_) => {
            "CREATE TABLE ledger_entries (id bigserial PRIMARY KEY, order_id text NOT NULL UNIQUE,
             amount_cents bigint NOT NULL, message_id text NOT NULL)"
        }
        Db::Sqlite(_) => {
            "CREATE TABLE ledger_entries (id integer PRIMARY KEY AUTOINCREMENT, order_id text NOT NULL UNIQUE,
             amount_cents integer NOT NULL, message_id text NOT NULL)"
        }
    })
    .await;
}

fn order(offset: i64, order_id: &str, amount_cents: i64) -> Delivery {
    Delivery {
        attempt: 0,
        topic: "order.paid".into(),
        partition: 0,
        offset,
        key: Some(order_id.as_bytes().to_vec()),
        payload: format!(r#"{{"order_id":"{order_id}","amount_cents":{amount_cents}}}"#)
            .into_bytes(),
        headers: vec![(
            headers::MESSAGE_ID.into(),
            uuid::Uuid::new_v4().to_string().into_bytes(),
        )],
    }
}

/// The payload of the `ledger.recorded` event of one order.
async fn event_payload(t: &TestDb, order_id: &str) -> serde_json::Value {
    let sql = format!(
        "SELECT CAST(payload AS TEXT) FROM outbox WHERE event_type = 'ledger.recorded' AND aggregate_id = '{order_id}'"
    );
    let text: String = match &t.db {
        Db::Postgres(p) => sqlx::query_scalar(&sql).fetch_one(p).await,
        Db::Sqlite(p) => sqlx::query_scalar(&sql).fetch_one(p).await,
    }
    .expect(&sql);
    serde_json::from_str(&text).expect("a JSON payload")
}

/// (ledger rows, inbox marks, outbox events)
async fn counts(t: &TestDb) -> (i64, i64, i64) {
    (
        t.count("SELECT count(*) FROM ledger_entries").await,
        t.count("SELECT count(*) FROM inbox").await,
        t.count("SELECT count(*) FROM outbox").await,
    )
}

async fn python_and_javascript_consumers_write_a_row_and_emit_an_event_once(t: TestDb) {
    create_ledger(&t).await;
    for (i, name) in LANGS.into_iter().enumerate() {
        let h = ledger_handler(name, policy(&["ledger_entries"]));
        let d = order(i as i64, &format!("o-{name}"), 1250);
        let first = process(&t.db, name, &d, &h).await.expect(name);
        let again = process(&t.db, name, &d, &h).await.expect(name);
        assert_eq!(
            (first, again),
            (Processed::Handled, Processed::Duplicate),
            "{name}"
        );
        let id = d.message_id().expect("id").to_string();
        assert_eq!(
            t.count(&format!(
                "SELECT count(*) FROM ledger_entries WHERE order_id = 'o-{name}' AND amount_cents = 1250 AND message_id = '{id}'"
            ))
            .await,
            1,
            "{name}: the row carries the order and the message id"
        );
        let payload = event_payload(&t, &format!("o-{name}")).await;
        assert_eq!(
            payload,
            serde_json::json!({"order_id": format!("o-{name}"), "amount_cents": 1250, "message_id": id}),
            "{name}"
        );
    }
    assert_eq!(counts(&t).await, (2, 2, 2));
}
on_both!(python_and_javascript_consumers_write_a_row_and_emit_an_event_once);

/// A unique violation is caught by the plugin, which answers with its own
/// permanent error; the host still rolls the message back.
async fn a_caught_database_error_becomes_the_plugins_own_answer(t: TestDb) {
    create_ledger(&t).await;
    for (i, name) in LANGS.into_iter().enumerate() {
        let h = ledger_handler(name, policy(&["ledger_entries"]));
        process(
            &t.db,
            name,
            &order(2 * i as i64, &format!("dup-{name}"), 5),
            &h,
        )
        .await
        .expect("first order");
        // Another message for the same order: the insert violates UNIQUE.
        let err = process(
            &t.db,
            name,
            &order(2 * i as i64 + 1, &format!("dup-{name}"), 5),
            &h,
        )
        .await
        .expect_err("the same order twice");
        let HandlerError::Permanent(text) = err else {
            panic!("{name}: a caught unique violation is the plugin's permanent error, got {err:?}")
        };
        assert!(
            text.contains(&format!("order dup-{name} is already in the ledger")),
            "{name}: {text}"
        );
        // The host names the statement that failed after the plugin's text.
        assert!(text.contains("(after database error"), "{name}: {text}");
    }
    assert_eq!(
        counts(&t).await,
        (2, 2, 2),
        "the second messages left nothing"
    );
}
on_both!(a_caught_database_error_becomes_the_plugins_own_answer);

/// A db-error the plugin does not catch: each kind gives the plugin error
/// the Rust SDK gives (database and budget retryable, refused permanent),
/// never a trap, in every language.
async fn an_uncaught_database_error_is_a_plugin_error_not_a_trap(t: TestDb) {
    // No ledger_entries table yet: the insert fails in the database.
    for name in LANGS {
        let h = ledger_handler(name, policy(&["ledger_entries"]));
        let err = process(&t.db, name, &order(1, "o-1", 5), &h)
            .await
            .expect_err("no table");
        let HandlerError::Retryable(text) = err else {
            panic!("{name}: {err:?}")
        };
        assert!(
            text.starts_with(&format!("plugin {name}@test-1: retryable: database error")),
            "{name}: an uncaught db-error is retryable, not a trap: {text}"
        );
    }
    let err = process(
        &t.db,
        "billing",
        &plugins::order(1, "o-1"),
        &billing_plugin(),
    )
    .await
    .expect_err("no invoices table");
    let HandlerError::Retryable(text) = err else {
        panic!("rust: {err:?}")
    };
    assert!(
        text.starts_with("plugin billing@test-1: retryable: database error"),
        "rust: {text}"
    );

    create_ledger(&t).await;
    for name in LANGS {
        // The table is not granted: the host refuses the statement.
        let err = process(
            &t.db,
            name,
            &order(2, "o-2", 5),
            &ledger_handler(name, policy(&[])),
        )
        .await
        .expect_err("not granted");
        let HandlerError::Permanent(text) = err else {
            panic!("{name}: a refused statement is permanent, got {err:?}")
        };
        assert!(text.contains("statement refused"), "{name}: {text}");
        // One statement allowed: the insert passes, the emit is over budget.
        let tight = TxnPolicy {
            max_statements: 1,
            ..policy(&["ledger_entries"])
        };
        let err = process(
            &t.db,
            name,
            &order(3, "o-3", 5),
            &ledger_handler(name, tight),
        )
        .await
        .expect_err("over budget");
        let HandlerError::Retryable(text) = err else {
            panic!("{name}: {err:?}")
        };
        assert!(text.contains("budget exceeded"), "{name}: {text}");
    }
    assert_eq!(counts(&t).await, (0, 0, 0), "nothing committed");
}
on_both!(an_uncaught_database_error_is_a_plugin_error_not_a_trap);
