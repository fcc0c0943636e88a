//! `outboxd run` survives a database that drops its connection while the
//! pipeline starts: the start is tried again instead of ending the process.

use std::time::{Duration, Instant};

use outboxd::daemon::Daemon;
use outboxd::event::NewEvent;
use outboxd::fault::Faults;
use outboxd::store::Db;
use serde_json::json;
use sqlx::Row;

use crate::admin::admin_config;
use crate::support::TestDb;

/// The backend of the daemon's registry query, once it waits on `lock`.
async fn waiting_backend(admin: &sqlx::PgPool, database: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let row = sqlx::query(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock' LIMIT 1",
        )
        .bind(database)
        .fetch_optional(admin)
        .await
        .expect("pg_stat_activity");
        if let Some(row) = row {
            return row.get::<i32, _>(0);
        }
        assert!(
            Instant::now() < deadline,
            "the daemon never queried the plugin registry"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The registry is locked, the daemon's first registry query waits on the
/// lock, and that connection is terminated by the server (as a failover or
/// `pg_terminate_backend` would). The daemon starts again and relays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_terminated_during_start_up_is_retried_not_fatal() {
    let t = TestDb::postgres().await;
    let Db::Postgres(pool) = &t.db else {
        unreachable!("a postgres test database")
    };
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .expect("name");
    // Holds the registry's table until the daemon's query has been killed.
    let mut locker = pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE outboxd.plugins IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *locker)
        .await
        .expect("lock");

    let watched = tempfile::tempdir().expect("dir");
    let mut config = admin_config(&t.url);
    config.admin.enabled = false;
    // A watched plugin directory makes start-up load the registry.
    config.plugin_runtime.watch_dir = Some(watched.path().to_path_buf());
    config.routes = vec![outboxd::relay::Route::new("order.*", "orders")];
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // The daemon runs in this task, next to the checks (its future is not
    // `Send`, as `outboxd run` drives it on the main task).
    let daemon = Daemon::builder().build();
    let run = daemon.run(config, Faults::none(), stop_rx);
    tokio::pin!(run);
    let checks = async {
        let pid = waiting_backend(pool, &database).await;
        let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(pool)
            .await
            .expect("terminate");
        assert!(terminated, "backend {pid} terminated");
        locker.commit().await.expect("unlock");
        t.enqueue(NewEvent::new("o-1", "order.confirmed", json!({ "n": 1 })))
            .await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let published = t
                .count("SELECT COUNT(*) FROM outboxd.outbox WHERE published_at IS NOT NULL")
                .await;
            if published == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "the event was never relayed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        ended = &mut run => panic!("the daemon ended while starting: {ended:?}"),
        () = checks => {}
    }
    stop_tx.send(true).expect("stop");
    let ended = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("stops");
    assert!(ended.is_ok(), "{ended:?}");
}

/// The server's own error for a terminated connection reads as transient;
/// a refused statement does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_connection_is_transient_and_a_bad_statement_is_not() {
    let t = TestDb::postgres().await;
    let Db::Postgres(pool) = &t.db else {
        unreachable!("a postgres test database")
    };
    let mut victim = pool.acquire().await.expect("acquire");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *victim)
        .await
        .expect("pid");
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(pool)
        .await
        .expect("terminate");
    let lost = sqlx::query("SELECT 1")
        .execute(&mut *victim)
        .await
        .expect_err("the connection is gone");
    assert!(outboxd::store::problem::transient(&lost), "{lost:?}");
    let bad = sqlx::query("SELECT * FROM no_such_table")
        .execute(pool)
        .await
        .expect_err("no table");
    assert!(!outboxd::store::problem::transient(&bad), "{bad:?}");
}
