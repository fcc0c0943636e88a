//! `outboxd run` survives a database that drops its connection while the
//! pipeline starts: the start is tried again instead of ending the process.

use std::time::{Duration, Instant};

use outboxd::daemon::Daemon;
use outboxd::event::NewEvent;
use outboxd::fault::Faults;
use outboxd::store::Db;
use serde_json::json;
use sqlx::Row;

use crate::support::admin::admin_config;
use crate::support::{TestDb, eventually};

/// The backend of the daemon's registry query, once it waits on `lock`.
async fn waiting_backend(admin: &sqlx::PgPool, database: &str) -> i32 {
    eventually(
        Duration::from_secs(30),
        "the daemon never queried the plugin registry",
        async || {
            sqlx::query(
                "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock' LIMIT 1",
            )
            .bind(database)
            .fetch_optional(admin)
            .await
            .expect("pg_stat_activity")
            .map(|row| row.get::<i32, _>(0))
        },
    )
    .await
}

/// Waits until the one event in the outbox has been published.
async fn wait_relayed(t: &TestDb, within: Duration) {
    eventually(within, "the event was never relayed", async || {
        t.count("SELECT COUNT(*) FROM outboxd.outbox WHERE published_at IS NOT NULL")
            .await
            == 1
    })
    .await
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
    config.routes = vec![outboxd::route::Route::new("order.*", "orders")];
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
        wait_relayed(&t, Duration::from_secs(30)).await;
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
    assert!(
        outboxd::store::backend::problem::transient(&lost),
        "{lost:?}"
    );
    let bad = sqlx::query("SELECT * FROM no_such_table")
        .execute(pool)
        .await
        .expect_err("no table");
    assert!(
        !outboxd::store::backend::problem::transient(&bad),
        "{bad:?}"
    );
}

/// The database does not answer at first (a network partition while the
/// process starts: connections are accepted and then nothing comes back),
/// longer than the pool's 10 s acquire timeout. `outboxd run` connects again
/// instead of exiting, and relays once the database answers. The chaos soak
/// found this: a consumer restarted during a partition exited with "pool
/// timed out while waiting for an open connection".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_does_not_answer_at_first_is_waited_for() {
    use std::str::FromStr;
    let t = TestDb::postgres().await;
    let options = sqlx::postgres::PgConnectOptions::from_str(&t.url).expect("the test URL");
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    // For the first 12 s the "network" swallows every connection; then it
    // forwards to the database.
    let answers_from = Instant::now() + Duration::from_secs(12);
    let proxy = tokio::spawn(async move {
        let mut swallowed = Vec::new();
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            if Instant::now() < answers_from {
                swallowed.push(client);
                continue;
            }
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    let url = format!(
        "postgres://{}@127.0.0.1:{port}/{}",
        options.get_username(),
        options.get_database().expect("a database name")
    );
    let mut config = admin_config(&url);
    config.admin.enabled = false;
    config.routes = vec![outboxd::route::Route::new("order.*", "orders")];
    t.enqueue(NewEvent::new("o-1", "order.confirmed", json!({ "n": 1 })))
        .await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let daemon = Daemon::builder().build();
    let run = daemon.run(config, Faults::none(), stop_rx);
    tokio::pin!(run);
    let started = Instant::now();
    let checks = async {
        wait_relayed(&t, Duration::from_secs(60)).await;
    };
    tokio::select! {
        ended = &mut run => panic!(
            "the daemon ended after {:?} while the database did not answer: {ended:?}",
            started.elapsed()
        ),
        () = checks => {}
    }
    assert!(
        started.elapsed() >= Duration::from_secs(10),
        "the event was relayed before the database answered: this test proves nothing"
    );
    stop_tx.send(true).expect("stop");
    let ended = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("stops");
    assert!(ended.is_ok(), "{ended:?}");
    proxy.abort();
}

/// A refused connection is the configuration's fault (a wrong host or
/// port): `outboxd run` does not wait for it, and fails once the pool's
/// 10 s acquire timeout has passed, with the refusal in the error rather
/// than the pool's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_still_fails_at_once() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let mut config = admin_config(&format!("postgres://nobody@127.0.0.1:{port}/none"));
    config.admin.enabled = false;
    let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let ended = tokio::time::timeout(
        Duration::from_secs(30),
        Daemon::builder()
            .build()
            .run(config, Faults::none(), stop_rx),
    )
    .await
    .expect("a refused connection ends the run within 30 s");
    let e = ended.expect_err("nothing listens on the port");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "a refused connection took {:?} to fail: it was waited for",
        started.elapsed()
    );
    let text = e.to_string();
    assert!(
        text.contains("database") && text.contains("refused"),
        "the error names the database and the refusal: {text}"
    );
}

/// The plugin-role check that start-up runs for each plugin consumer on
/// Postgres keeps a lost connection a database error, which start-up tries
/// again, apart from a refused role, which it does not. The chaos soak found
/// this: a consumer whose check's connection was terminated exited at once
/// with "error returned from database: terminating connection due to
/// administrator command", read as an unsafe role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_during_the_plugin_role_check_is_transient() {
    use outboxd::config::ConsumerSection;
    use outboxd::store::plugin_sql::roles::{RoleCheckError, check};
    let t = TestDb::postgres().await;
    let Db::Postgres(admin) = &t.db else {
        unreachable!("a postgres test database")
    };
    // One connection, not tested before use: the check meets the dead one.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(&t.url)
        .await
        .expect("pool");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .expect("pid");
    // The connection goes back to the pool in a task of its own, after a
    // ping: terminated before that, it would be replaced by a fresh one.
    eventually(
        Duration::from_secs(10),
        "the connection never went back to the pool",
        async || pool.num_idle() >= 1,
    )
    .await;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(admin)
        .await
        .expect("terminate");
    // The signal is asynchronous: wait until the backend is gone.
    eventually(
        Duration::from_secs(10),
        format!("backend {pid} outlived its termination"),
        async || {
            let alive: i64 =
                sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
                    .bind(pid)
                    .fetch_one(admin)
                    .await
                    .expect("pg_stat_activity");
            alive == 0
        },
    )
    .await;
    let mut c = ConsumerSection::new("c", vec!["t".into()], "plugin:p");
    c.db_role = Some("no_such_role_anywhere".into());
    let lost = check(&pool, 0, &c)
        .await
        .expect_err("the check's connection is gone");
    match &lost {
        RoleCheckError::Database(e) => {
            assert!(outboxd::store::backend::problem::transient(e), "{e:?}")
        }
        RoleCheckError::Refused(why) => {
            panic!("a lost connection was read as a refused role: {why}")
        }
    }
    // With a live connection the same role is refused, and that is no
    // database error.
    let refused = check(admin, 0, &c).await.expect_err("no such role");
    assert!(
        matches!(&refused, RoleCheckError::Refused(why) if why.contains("does not exist")),
        "{refused}"
    );
    pool.close().await;
}
