//! Bad input and unusable services at the database and the broker: a
//! read-only database, a
//! full one, credentials the database refuses, and a broker that accepts
//! TCP connections but never answers. Each gives an error that names the
//! problem and the fix, and a defined outcome: refused or retried, with
//! every row kept.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use outboxd::NewEvent;
use outboxd::broker::kafka::KafkaPublisher;
use outboxd::clock::SystemClock;
use outboxd::relay::Relay;
use outboxd::relay::RelayConfig;
use outboxd::relay::StepOutcome;
use outboxd::route::Router;
use outboxd::store::{AnyStore, Db, EnqueueError};
use serde_json::json;

use crate::support::db::{put, read_only, set_read_only, try_enqueue_on};
use crate::support::plugins::order;
use crate::support::{ScriptedPublisher, TestDb, on_both, pg_admin_url};

const READ_ONLY_FIX: &str = "the database is read-only: outboxd writes the outbox";
const FULL_FIX: &str = "the database is full: free disk space";

fn relay_on(db: &Db, broker: Arc<ScriptedPublisher>) -> Relay<AnyStore, Arc<ScriptedPublisher>> {
    Relay::new(
        AnyStore::new(db, Duration::from_secs(30)),
        broker,
        Router::default(),
        RelayConfig::default(),
        Arc::new(SystemClock),
    )
}

async fn a_read_only_database_is_refused_with_the_fix_and_loses_nothing(t: TestDb) {
    put(&t.db, "a", "order.placed", json!({"n": 1})).await;
    put(&t.db, "b", "order.placed", json!({"n": 2})).await;
    let ro = read_only(&t).await;

    let broker = ScriptedPublisher::new();
    let err = relay_on(&ro, broker.clone())
        .step()
        .await
        .expect_err("the relay cannot claim from a read-only database");
    assert!(err.to_string().contains(READ_ONLY_FIX), "{err}");
    let err = try_enqueue_on(&ro, NewEvent::new("c", "order.placed", json!({"n": 3})))
        .await
        .expect_err("a producer cannot enqueue into a read-only database");
    assert!(matches!(err, EnqueueError::Database(_)), "{err:?}");
    assert!(err.to_string().contains(READ_ONLY_FIX), "{err}");
    assert!(
        broker.sent().is_empty(),
        "nothing is published without a claim"
    );
    // A consumer cannot write its inbox mark: retried, with the fix.
    let err = outboxd::consumer::process(
        &ro,
        "billing",
        &order(0, "o1"),
        &outboxd_demo::billing::BillingHandler,
    )
    .await
    .expect_err("the inbox cannot be written");
    assert!(
        matches!(&err, outboxd::consumer::HandlerError::Retryable(text) if text.contains(READ_ONLY_FIX)),
        "{err:?}"
    );
    ro.close().await;

    if t.is_postgres() {
        set_read_only(&t, false).await;
    }
    // Writable again (a new pool: Postgres applies the setting per session).
    let rw = Db::connect(&t.url, 2).await.expect("connect");
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE published_at IS NULL AND attempts = 0 AND dead_at IS NULL")
            .await,
        2,
        "the rows are untouched"
    );
    let StepOutcome::Published(report) = relay_on(&rw, broker.clone()).step().await.expect("step")
    else {
        panic!("idle");
    };
    assert_eq!(report.published, 2, "nothing was lost");
    assert_eq!(broker.sent().len(), 2);
}
on_both!(a_read_only_database_is_refused_with_the_fix_and_loses_nothing);

/// SQLite's `max_page_count` caps the file per connection: a pool whose
/// connections may not grow it stands in for a full disk. (A full Postgres
/// disk, SQLSTATE 53100, is in `full_postgres_disk.rs` beside this file.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_database_refuses_new_events_with_the_fix_and_keeps_the_old_ones() {
    let t = TestDb::sqlite().await;
    put(&t.db, "a", "order.placed", json!({"n": 1})).await;
    let pages = t.count("SELECT page_count FROM pragma_page_count()").await;
    let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&t.url)
        .expect("url")
        .busy_timeout(Duration::from_secs(30))
        .pragma("max_page_count", pages.to_string());
    let full = Db::Sqlite(
        sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(opts)
            .await
            .expect("open"),
    );
    let big = "x".repeat(256 * 1024);
    let err = try_enqueue_on(
        &full,
        NewEvent::new("b", "order.placed", json!({ "big": big })),
    )
    .await
    .expect_err("a 256 KiB event does not fit");
    assert!(err.to_string().contains(FULL_FIX), "{err}");
    assert_eq!(
        t.count("SELECT count(*) FROM outbox").await,
        1,
        "the refused event left nothing behind; the producer got the error"
    );
    // The event already in is still published and marked.
    let broker = ScriptedPublisher::new();
    let StepOutcome::Published(report) =
        relay_on(&full, broker.clone()).step().await.expect("step")
    else {
        panic!("idle");
    };
    assert_eq!(report.published, 1);
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
            .await,
        1
    );
    full.close().await;
    try_enqueue_on(
        &t.db,
        NewEvent::new("b", "order.placed", json!({ "big": big })),
    )
    .await
    .expect("with room again, the producer's retry succeeds");
}

/// The daemon refuses to start with credentials the database rejects, and
/// says which URL (password hidden) and what to fix.
#[test]
fn wrong_database_credentials_are_refused_with_the_url_redacted_and_the_fix() {
    let admin = pg_admin_url();
    let host = admin
        .split_once('@')
        .map(|(_, rest)| rest)
        .expect("OUTBOXD_TEST_DATABASE_URL has user@host");
    let url = format!("postgres://no_such_user:wr0ngpw@{host}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .arg("stats")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("OUTBOXD__DATABASE__URL", &url)
        .output()
        .expect("run outboxd");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(!text.contains("wr0ngpw"), "the password is shown:\n{text}");
    assert!(text.contains(&format!("no_such_user:***@{host}")), "{text}");
    assert!(
        text.contains("the database refused the user or password: fix them in database.url"),
        "{text}"
    );
}

async fn strings(t: &TestDb, sql: &str) -> Vec<String> {
    match &t.db {
        Db::Postgres(p) => sqlx::query_scalar(sql).fetch_all(p).await.expect(sql),
        Db::Sqlite(p) => sqlx::query_scalar(sql).fetch_all(p).await.expect(sql),
    }
}

/// Accepts every connection and never sends a byte.
async fn silent_broker() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(conn);
        }
    });
    (addr, accepted)
}

async fn a_broker_that_never_answers_times_out_and_rows_stay_pending(t: TestDb) {
    let (addr, accepted) = silent_broker().await;
    let props = std::collections::BTreeMap::from([("bootstrap.servers".to_string(), addr)]);
    let publisher = KafkaPublisher::new(&props, Duration::from_secs(60)).expect("publisher");
    let health = publisher
        .check(Duration::from_secs(1))
        .await
        .expect_err("a silent broker fails the health check");
    assert!(
        health.contains("kafka brokers did not answer within 1s"),
        "{health}"
    );

    put(&t.db, "a", "order.placed", json!({"n": 1})).await;
    put(&t.db, "b", "order.placed", json!({"n": 2})).await;
    let relay = t.relay_with(
        publisher,
        RelayConfig {
            publish_timeout: Duration::from_millis(1500),
            ..RelayConfig::default()
        },
        Arc::new(SystemClock),
    );
    let StepOutcome::Published(report) = relay.step().await.expect("step") else {
        panic!("idle");
    };
    assert_eq!((report.published, report.retried, report.dead), (0, 2, 0));
    assert!(
        accepted.load(Ordering::SeqCst) > 0,
        "the client did connect"
    );
    let rows = strings(
        &t,
        "SELECT coalesce(last_error, '') FROM outbox \
         WHERE published_at IS NULL AND dead_at IS NULL AND attempts = 1",
    )
    .await;
    assert_eq!(
        rows,
        vec![
            "retryable broker error: no broker acknowledgement within 1.5s (relay.publish_timeout)";
            2
        ],
        "both rows stay pending with the reason, to be retried"
    );
}
on_both!(a_broker_that_never_answers_times_out_and_rows_stay_pending);

/// Producers in other languages write rows with the SQL contract; a payload
/// that is not JSON is refused by the schema itself (Postgres `jsonb`,
/// SQLite `CHECK (json_valid(payload))`), so the relay never claims one.
async fn a_malformed_payload_is_refused_at_the_outbox(t: TestDb) {
    let malformed = "{\"order_id\": ";
    let err = match &t.db {
        Db::Postgres(p) => sqlx::query("SELECT outbox_enqueue('a', 'order.placed', $1::jsonb)")
            .bind(malformed)
            .execute(p)
            .await
            .expect_err("not JSON"),
        Db::Sqlite(p) => {
            sqlx::query("INSERT INTO outbox (aggregate_id, event_type, payload) VALUES ('a', 'order.placed', $1)")
                .bind(malformed)
                .execute(p)
                .await
                .expect_err("not JSON")
        }
    };
    let code = err
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.to_string());
    // 22P02: invalid_text_representation; 275: SQLITE_CONSTRAINT_CHECK.
    let expected = if t.is_postgres() { "22P02" } else { "275" };
    assert_eq!(code.as_deref(), Some(expected), "{err}");
    assert_eq!(t.count("SELECT count(*) FROM outbox").await, 0);
}
on_both!(a_malformed_payload_is_refused_at_the_outbox);
