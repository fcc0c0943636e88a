//! Consumer plugins under the policies the host enforces around their SQL:
//! the Postgres role, the statement timeout, the row budget, and JSON values
//! that keep their precision.

use crate::support::plugins::{counts, handler, order};
use crate::support::{TestDb, on_both};
use outboxd::config::TxnPolicy;
use outboxd::consumer::batch::process_batch;
use outboxd::consumer::{ConsumerHandler, Processed, process};
use outboxd_demo::billing;

/// The host's tables are refused before they reach the database (the
/// role's own wall is tested without the gate in plugin/sql_walls.rs), and
/// within its rights the plugin works under its role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_role_limits_what_a_plugin_can_touch() {
    let t = TestDb::postgres().await;
    billing::create_schema(&t.db).await.expect("billing schema");
    // Named after the database, so the database's guard drops it.
    let role = format!("{}_billing", t.database_name());
    t.exec(&format!("CREATE ROLE {role} NOLOGIN")).await;
    t.exec(&format!("GRANT SELECT, INSERT ON invoices TO {role}"))
        .await;
    let policy = TxnPolicy {
        db_role: Some(role.clone()),
        statement_timeout: std::time::Duration::from_millis(2_000),
        ..crate::support::plugin_policy()
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
            .expect_err("refused");
        assert!(
            format!("{err}").contains("is outboxd's own table"),
            "{attack}: {err}"
        );
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
        statement_timeout: std::time::Duration::from_millis(300),
        ..crate::support::plugin_policy()
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
        statement_timeout: std::time::Duration::from_millis(300),
        ..crate::support::plugin_policy()
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
        ..crate::support::plugin_policy()
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
