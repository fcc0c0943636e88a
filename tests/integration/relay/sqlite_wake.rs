//! SQLite's stand-in for LISTEN/NOTIFY (`store/backend/sqlite_watch.rs`): with
//! polling turned down to once every ten minutes, commits made in this
//! process (the commit hook) and by a connection without hooks (what
//! another process is to the watcher) still wake the relay and the
//! embedded consumer, and a rolled-back insert wakes nobody.

use std::time::Duration;

use outboxd::broker::embedded::{EmbeddedConsumer, EmbeddedConsumerConfig};
use outboxd::broker::{MessageSource, NullPublisher};
use outboxd::event::NewEvent;
use outboxd::relay::worker::{self, WorkerConfig};
use outboxd::store::backend::sqlite_watch;
use outboxd::store::{Db, enqueue};
use serde_json::json;
use sqlx::Connection;
use sqlx::sqlite::SqliteConnection;

use crate::support::{TestDb, eventually};

const NEVER: Duration = Duration::from_secs(600);
const PATIENCE: Duration = Duration::from_secs(20);

fn pool(t: &TestDb) -> &sqlx::SqlitePool {
    match &t.db {
        Db::Sqlite(p) => p,
        Db::Postgres(_) => unreachable!("a SQLite test"),
    }
}

async fn put_in(mut tx: sqlx::Transaction<'_, sqlx::Sqlite>, agg: &str) {
    enqueue(
        &mut tx,
        NewEvent::new(agg, "order.confirmed", json!({"n": 1})),
    )
    .await
    .expect("enqueue");
    tx.commit().await.expect("commit");
}

/// A commit on the test's pool: its connections carry the commit hook.
async fn put_hooked(t: &TestDb, agg: &str) {
    put_in(pool(t).begin().await.expect("begin"), agg).await;
}

/// A commit on a plain connection: only the file watch can see it.
async fn put_unhooked(conn: &mut SqliteConnection, agg: &str) {
    put_in(conn.begin().await.expect("begin"), agg).await;
}

async fn wait_published(t: &TestDb, agg: &str) {
    let sql = format!(
        "SELECT count(*) FROM outbox WHERE aggregate_id = '{agg}' AND published_at IS NOT NULL"
    );
    let what = format!(
        "event {agg} not published: the relay was not woken (its poll interval is {NEVER:?})"
    );
    eventually(PATIENCE, what, async || t.count(&sql).await != 0).await;
}

#[tokio::test]
async fn sqlite_commits_wake_an_idle_relay_from_this_process_and_from_another() {
    let t = TestDb::sqlite().await;
    let relay = t.relay(NullPublisher);
    let wake = sqlite_watch::subscribe(pool(&t)).await;
    assert!(wake.is_some(), "a SQLite file gets a watcher");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let cfg = WorkerConfig {
        poll_interval: NEVER,
        ..WorkerConfig::default()
    };
    let running = tokio::spawn(async move { worker::run(&relay, &cfg, wake, stop_rx).await });
    for i in 0..5 {
        put_hooked(&t, &format!("hooked-{i}")).await;
        wait_published(&t, &format!("hooked-{i}")).await;
    }
    let mut other = SqliteConnection::connect(&t.url)
        .await
        .expect("a second connection");
    for i in 0..5 {
        put_unhooked(&mut other, &format!("other-{i}")).await;
        wait_published(&t, &format!("other-{i}")).await;
    }
    let _ = stop_tx.send(true);
    running.await.expect("join").expect("relay");
}

#[tokio::test]
async fn sqlite_publishes_wake_a_waiting_embedded_consumer() {
    let t = TestDb::sqlite().await;
    let wake = sqlite_watch::subscribe(pool(&t)).await.expect("watcher");
    let mut consumer = EmbeddedConsumer::new(
        t.db.clone(),
        EmbeddedConsumerConfig {
            group: "g".into(),
            topics: vec!["order.confirmed".into()],
            partitions: 2,
            lease: Duration::from_secs(15),
        },
    )
    .with_wake(wake, NEVER);
    assert!(consumer.fetch(10).await.expect("fetch").is_empty());
    let publisher = outboxd::broker::embedded::EmbeddedPublisher::new(t.db.clone(), 2);
    for n in 0..5 {
        // A fetch waits for a tick and then looks once more; a tick may come
        // from another write (the cursor commit), so look until it is there.
        let waiting = tokio::spawn(async move {
            let got = tokio::time::timeout(PATIENCE, async {
                loop {
                    match consumer.fetch(10).await {
                        Ok(v) if v.is_empty() => continue,
                        other => return other,
                    }
                }
            })
            .await;
            (consumer, got)
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        outboxd::broker::Publisher::publish(
            &publisher,
            crate::support::publisher::msg("order.confirmed", "k", n),
        )
        .await
        .expect("publish");
        let (back, got) = waiting.await.expect("join");
        consumer = back;
        let got = got
            .unwrap_or_else(|_| {
                panic!("the consumer was not woken within {PATIENCE:?} (it waits {NEVER:?})")
            })
            .expect("fetch");
        assert_eq!(got.len(), 1, "round {n}");
        consumer.commit(&got[0]).await.expect("commit");
    }
}

#[tokio::test]
async fn a_rolled_back_insert_wakes_nobody() {
    let t = TestDb::sqlite().await;
    let mut wake = sqlite_watch::subscribe(pool(&t)).await.expect("watcher");
    wake.borrow_and_update();
    let mut tx = pool(&t).begin().await.expect("begin");
    enqueue(
        &mut tx,
        NewEvent::new("a", "order.confirmed", json!({"n": 1})),
    )
    .await
    .expect("enqueue");
    tx.rollback().await.expect("rollback");
    // A tick needs PRAGMA data_version to move, which only a commit does.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), wake.changed())
            .await
            .is_err(),
        "a rollback ticked the watcher"
    );
    put_hooked(&t, "b").await;
    tokio::time::timeout(PATIENCE, wake.changed())
        .await
        .expect("a commit ticks")
        .expect("watcher alive");
}
