//! The WAL relay's tests (`relay.source = "wal"`, wal/): their config, the
//! slot as the server shows it, writers whose events carry each
//! aggregate's commit order, and the check of what reached the broker.

use std::collections::HashMap;
use std::time::Duration;

use outboxd::event::NewEvent;
use outboxd::store::{Db, enqueue};
use serde_json::json;
use sqlx::Row;
use tokio::task::JoinSet;

use super::db::{TestDb, WalTestDb};
use super::eventually::eventually;

/// The outboxd config of a WAL relay test: this database, `relay.source =
/// "wal"` on `slot`, one reader, short retry and status intervals, a fast
/// backoff with room for many attempts (an outage must not kill events),
/// the embedded transport; then `extra` (TOML sections) appended.
pub fn wal_config_toml(url: &str, slot: &str, extra: &str) -> String {
    format!(
        r#"
[database]
url = "{url}"
max_connections = 16

[relay]
source = "wal"
workers = 1
batch_size = 50
poll_interval = "50ms"
publish_timeout = "5s"
max_attempts = 1000

[relay.backoff]
base_seconds = 0.05
max_seconds = 0.5

[relay.wal]
slot = "{slot}"
standby_retry = "250ms"
status_interval = "250ms"
sender_timeout = "5s"

{extra}
"#
    )
}

/// [`wal_config_toml`], parsed and validated as `outboxd run` would.
pub fn wal_config(url: &str, slot: &str, extra: &str) -> outboxd::config::Config {
    let text = wal_config_toml(url, slot, extra);
    outboxd::config::Config::from_toml("(WAL test config)", &text, std::iter::empty())
        .unwrap_or_else(|e| panic!("the WAL test config is refused: {e}\n{text}"))
}

/// The value of the metric `name` (without labels) in a /metrics text.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let rest = l.strip_prefix(name)?;
        if !rest.starts_with(' ') {
            return None;
        }
        rest.trim().parse().ok()
    })
}

// ---- the slot, seen from the server ----------------------------------------

/// Whether some process reads the test's slot now.
pub async fn slot_active(t: &WalTestDb) -> bool {
    t.count(&format!(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{}' AND active",
        t.slot
    ))
    .await
        == 1
}

/// Waits until a reader holds the slot: events committed from then on
/// reach the relay through the stream, not through the start-up scan of
/// unpublished rows.
pub async fn wait_for_reader(t: &WalTestDb) {
    eventually(
        Duration::from_secs(60),
        format!("no process reads slot {}", t.slot),
        async || slot_active(t).await,
    )
    .await
}

/// The slot's confirmed flush position.
pub async fn confirmed_lsn(t: &WalTestDb) -> String {
    t.text(&format!(
        "SELECT coalesce(confirmed_flush_lsn::text, '0/0') FROM pg_replication_slots WHERE slot_name = '{}'",
        t.slot
    ))
    .await
}

/// Whether the slot's confirmed position has reached `lsn`.
pub async fn confirmed_past(t: &WalTestDb, lsn: &str) -> bool {
    t.count(&format!(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{}' AND confirmed_flush_lsn >= '{lsn}'::pg_lsn",
        t.slot
    ))
    .await
        == 1
}

/// Waits until the slot's confirmed position reaches `lsn`: the reader
/// settled every transaction before it and the server may drop that WAL.
pub async fn wait_confirmed_past(t: &WalTestDb, lsn: &str) {
    let what = format!(
        "slot {} confirming {lsn} (else it retains WAL it has settled)",
        t.slot
    );
    eventually(Duration::from_secs(60), what, async || {
        if confirmed_past(t, lsn).await {
            Ok(())
        } else {
            Err(format!("it confirms only {}", confirmed_lsn(t).await))
        }
    })
    .await
}

// ---- writing events --------------------------------------------------------

pub fn pool(t: &TestDb) -> &sqlx::PgPool {
    match &t.db {
        Db::Postgres(p) => p,
        Db::Sqlite(_) => unreachable!("the WAL relay's tests run on Postgres"),
    }
}

/// Each aggregate's counter, in the application's schema.
pub async fn create_counters(t: &TestDb) {
    t.exec_app("CREATE TABLE counters (id text PRIMARY KEY, n bigint NOT NULL)")
        .await;
}

/// Commits one event of `agg` whose payload carries the aggregate's
/// counter, incremented in the same transaction under the row's lock: the
/// counter is the aggregate's commit order. Returns the position of the
/// WAL just after the insert (before the commit record): once the slot
/// confirms past it, the relay has settled this transaction.
pub async fn write_counted(db: &sqlx::PgPool, agg: &str, extra: serde_json::Value) -> String {
    let mut tx = db.begin().await.expect("begin");
    let n: i64 = sqlx::query(
        "INSERT INTO public.counters (id, n) VALUES ($1, 1)
         ON CONFLICT (id) DO UPDATE SET n = counters.n + 1 RETURNING n",
    )
    .bind(agg)
    .fetch_one(&mut *tx)
    .await
    .expect("counter")
    .get(0);
    let mut payload = json!({ "agg": agg, "n": n });
    if let (Some(p), Some(e)) = (payload.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    enqueue(&mut tx, NewEvent::new(agg, "order.placed", payload))
        .await
        .expect("enqueue");
    let lsn: String = sqlx::query("SELECT pg_current_wal_insert_lsn()::text")
        .fetch_one(&mut *tx)
        .await
        .expect("lsn")
        .get(0);
    tx.commit().await.expect("commit");
    lsn
}

/// `writers` tasks commit `events` events in all, spread over `aggregates`
/// aggregates so that writers collide on the same ones.
pub fn spawn_writers(t: &TestDb, writers: usize, events: usize, aggregates: usize) -> JoinSet<()> {
    let mut set = JoinSet::new();
    for w in 0..writers {
        let db = pool(t).clone();
        set.spawn(async move {
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ (w as u64 + 1);
            for _ in 0..events / writers {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let agg = format!("agg-{:04}", x % aggregates as u64);
                write_counted(&db, &agg, json!({})).await;
            }
        });
    }
    set
}

pub async fn join_writers(mut set: JoinSet<()>) {
    while let Some(r) = set.join_next().await {
        r.expect("writer");
    }
}

pub async fn wait_all_published(t: &TestDb) {
    t.wait_count(
        Duration::from_secs(90),
        "SELECT count(*) FROM outbox WHERE published_at IS NULL",
        0,
    )
    .await;
}

// ---- what the broker received ----------------------------------------------

/// Every committed event reached the broker (nothing lost), and a receiver
/// that drops repeated message ids sees each aggregate's events in commit
/// order: by seq (the advisory lock makes seq the aggregate's commit
/// order) and, when the payload carries a counter, as 1, 2, 3, … without a
/// gap. Returns (messages, distinct message ids).
pub async fn check_delivered(t: &TestDb, counted: bool) -> (usize, usize) {
    let lost = t
        .count(
            "SELECT count(*) FROM outbox o
              WHERE NOT EXISTS (SELECT 1 FROM transport_messages m WHERE m.message_id = o.id)",
        )
        .await;
    assert_eq!(lost, 0, "committed events never reached the broker");
    let invented = t
        .count(
            "SELECT count(*) FROM transport_messages m
              WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = m.message_id)",
        )
        .await;
    assert_eq!(invented, 0, "messages with no outbox row behind them");
    let rows = sqlx::query(
        r#"SELECT m.message_id, o.aggregate_id, o.seq, m.payload
             FROM transport_messages m JOIN outbox o ON o.id = m.message_id
            ORDER BY m."offset""#,
    )
    .fetch_all(pool(t))
    .await
    .expect("read transport_messages");
    let mut seen = std::collections::HashSet::new();
    let mut last: HashMap<String, (i64, i64)> = HashMap::new();
    for row in &rows {
        let id: uuid::Uuid = row.get(0);
        if !seen.insert(id) {
            continue;
        }
        let agg: String = row.get(1);
        let seq: i64 = row.get(2);
        let entry = last.entry(agg.clone()).or_insert((0, 0));
        assert!(
            seq > entry.0,
            "aggregate {agg}: seq {seq} reached the receiver after seq {}",
            entry.0
        );
        if counted {
            let payload: Vec<u8> = row.get(3);
            let n = serde_json::from_slice::<serde_json::Value>(&payload).expect("json")["n"]
                .as_i64()
                .expect("the payload's counter");
            assert_eq!(
                n,
                entry.1 + 1,
                "aggregate {agg}: event {n} reached the receiver after event {}",
                entry.1
            );
            entry.1 = n;
        }
        entry.0 = seq;
    }
    (rows.len(), seen.len())
}
