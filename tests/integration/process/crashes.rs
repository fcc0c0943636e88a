//! Process-level crash tests: a real `outboxd` process is stopped at an
//! injected point, killed with SIGKILL, and restarted on the same SQLite
//! file or Postgres database.

use std::process::Stdio;
use std::time::Duration;

use outboxd::event::NewEvent;
use outboxd::store::Db;
use serde_json::json;
use tokio::process::Command;

use crate::support::db::enqueue_on;
use crate::support::process::{kill_at_fault, outboxd, outboxd_with_billing, terminate};
use crate::support::{TestDb, on_both};

async fn fill(db: &Db, events: usize, aggregates: usize) {
    for i in 0..events {
        let ev = NewEvent::new(
            format!("agg-{}", i % aggregates),
            "thing.happened",
            json!({ "i": i }),
        );
        enqueue_on(db, ev).await;
    }
}

async fn relay_killed_between_publish_and_mark_republishes_only_that_batch(t: TestDb) {
    fill(&t.db, 200, 40).await;
    let child = outboxd(&t)
        .arg("run")
        .env("OUTBOXD_FAULT", "after-publish-before-mark:hang:3")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn outboxd run");
    kill_at_fault(child).await;

    // What the killed process left: two marked batches, one published but
    // unmarked batch (in flight), and the rest untouched.
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
            .await,
        40
    );
    t.exec(
        "CREATE TABLE inflight AS SELECT id FROM outbox o WHERE published_at IS NULL
           AND EXISTS (SELECT 1 FROM transport_messages m WHERE m.message_id = o.id)",
    )
    .await;
    assert_eq!(t.count("SELECT count(*) FROM inflight").await, 20);

    let mut child = outboxd(&t)
        .arg("run")
        .stderr(Stdio::null())
        .spawn()
        .expect("restart");
    t.wait_count(
        Duration::from_secs(90),
        "SELECT count(*) FROM outbox WHERE published_at IS NULL",
        0,
    )
    .await;
    // Graceful stop: SIGTERM drains and exits 0.
    terminate(&mut child).await;

    let lost = "SELECT count(*) FROM outbox o WHERE NOT EXISTS (SELECT 1 FROM transport_messages m WHERE m.message_id = o.id)";
    assert_eq!(
        t.count(lost).await,
        0,
        "every committed event was published"
    );
    let dups = "SELECT count(*) FROM (SELECT message_id FROM transport_messages GROUP BY message_id HAVING count(*) > 1) d";
    assert_eq!(
        t.count(dups).await,
        20,
        "only the in-flight batch was published twice"
    );
    let unexpected = "SELECT count(*) FROM (SELECT message_id FROM transport_messages GROUP BY message_id HAVING count(*) > 1) d
                       WHERE d.message_id NOT IN (SELECT id FROM inflight)";
    assert_eq!(
        t.count(unexpected).await,
        0,
        "duplicates are exactly the in-flight batch"
    );
    assert_eq!(
        t.count("SELECT count(*) FROM transport_messages").await,
        220
    );
}
on_both!(relay_killed_between_publish_and_mark_republishes_only_that_batch);

async fn producer_killed_before_commit_leaves_nothing(t: TestDb) {
    let enqueue_cmd = |t: &TestDb| {
        let mut c = outboxd(t);
        c.args([
            "enqueue",
            "--aggregate",
            "o1",
            "--type",
            "order.confirmed",
            "--payload",
            r#"{"x":1}"#,
        ]);
        c
    };
    let child = enqueue_cmd(&t)
        .env("OUTBOXD_FAULT", "after-insert-before-commit:hang")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn enqueue");
    kill_at_fault(child).await;
    assert_eq!(
        t.count("SELECT count(*) FROM outbox").await,
        0,
        "the uncommitted insert is gone"
    );
    // The store is usable right after: no stale lock survives the kill.
    let out = enqueue_cmd(&t).output().await.expect("enqueue again");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(t.count("SELECT count(*) FROM outbox").await, 1);
}
on_both!(producer_killed_before_commit_leaves_nothing);

async fn two_processes_racing_on_one_key_write_one_row(t: TestDb) {
    for k in 0..5 {
        let key = format!("op-{k}");
        let run = |t: &TestDb| {
            let mut c = outboxd(t);
            c.args([
                "enqueue",
                "--aggregate",
                "acct",
                "--type",
                "paid",
                "--payload",
                r#"{"amount":5}"#,
                "--key",
                &key,
            ]);
            c.output()
        };
        let (a, b) = tokio::join!(run(&t), run(&t));
        let (a, b) = (a.expect("a"), b.expect("b"));
        assert!(
            a.status.success() && b.status.success(),
            "{} / {}",
            String::from_utf8_lossy(&a.stderr),
            String::from_utf8_lossy(&b.stderr)
        );
        let outs = [
            String::from_utf8_lossy(&a.stdout).into_owned(),
            String::from_utf8_lossy(&b.stdout).into_owned(),
        ];
        assert_eq!(
            outs.iter().filter(|o| o.starts_with("enqueued")).count(),
            1,
            "{outs:?}"
        );
        assert_eq!(
            outs.iter().filter(|o| o.starts_with("repeat")).count(),
            1,
            "{outs:?}"
        );
    }
    assert_eq!(t.count("SELECT count(*) FROM outbox").await, 5);
}
on_both!(two_processes_racing_on_one_key_write_one_row);

/// The product ships no example: `outboxd run` knows no native handler, so
/// a consumer naming one is refused at start, with the key and both fixes,
/// and the example's `invoices` table is never created in the user's
/// database. The example's own binary, which registers `billing`, runs the
/// same config.
async fn the_product_binary_registers_no_native_handler(t: TestDb) {
    let consumers =
        r#"[{name = "billing", topics = ["order.confirmed"], handler = "builtin:billing"}]"#;
    let out = outboxd(&t)
        .arg("run")
        .env("OUTBOXD__CONSUMERS", consumers)
        .output()
        .await
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for part in [
        "consumers[0].handler",
        "builtin:billing",
        "this binary registers none",
        "plugin:NAME",
        "Daemon::builder().handler(\"billing\"",
    ] {
        assert!(err.contains(part), "`{part}` missing: {err}");
    }
    let invoices = if t.is_postgres() {
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'invoices'"
    } else {
        "SELECT count(*) FROM sqlite_master WHERE name = 'invoices'"
    };
    assert_eq!(t.count(invoices).await, 0, "outboxd run created invoices");

    outboxd_demo::billing::create_schema(&t.db)
        .await
        .expect("invoices");
    outboxd_demo::orders::create_schema(&t.db)
        .await
        .expect("orders");
    outboxd_demo::orders::create_order(&t.db, "o1", "c", 100)
        .await
        .expect("order");
    outboxd_demo::orders::OrderService::new(t.db.clone())
        .confirm_order(&outboxd_demo::orders::ConfirmOrder {
            order_id: "o1".into(),
            operation_key: None,
        })
        .await
        .expect("confirm");
    let mut child = outboxd_with_billing(&t)
        .arg("run")
        .env("OUTBOXD__CONSUMERS", consumers)
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the example's binary");
    t.wait_count(
        Duration::from_secs(90),
        "SELECT count(*) FROM invoices WHERE order_id = 'o1'",
        1,
    )
    .await;
    terminate(&mut child).await;
}
on_both!(the_product_binary_registers_no_native_handler);

/// `outboxd plugin-roles` asks the store whether the database has roles:
/// on Postgres it prints their SQL (none here: no plugin consumer is
/// configured), on SQLite it says that the authorizer needs none.
async fn plugin_roles_are_printed_only_where_the_database_has_roles(t: TestDb) {
    let out = outboxd(&t)
        .args(["plugin-roles", "--print"])
        .output()
        .await
        .expect("run plugin-roles");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        printed.contains("SQLite needs no roles"),
        !t.is_postgres(),
        "{printed}"
    );
}
on_both!(plugin_roles_are_printed_only_where_the_database_has_roles);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_config_is_refused_with_the_key_and_the_fix() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[relay]\nbatch_size = 0\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args(["--config", path.to_str().expect("utf8"), "stats"])
        .output()
        .await
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("relay.batch_size") && err.contains("1 to 10000"),
        "{err}"
    );
}

/// `--database-url` comes after the file and the environment, and the
/// checks that depend on the kind of database run again with it: this file
/// is valid on SQLite, but on Postgres its pool cannot hold the relays'
/// LISTEN connection as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_is_checked_again_for_the_database_the_flag_names() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("tight.toml");
    std::fs::write(&path, "[database]\nmax_connections = 4\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args([
            "--config",
            path.to_str().expect("utf8"),
            "--database-url",
            "postgres://nobody@127.0.0.1:1/none",
            "stats",
        ])
        .output()
        .await
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("database.max_connections") && err.contains("at least 5"),
        "{err}"
    );
}
