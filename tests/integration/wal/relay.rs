//! The relay that reads the write-ahead log (`relay.source = "wal"`),
//! in-process, held to the invariants the polling relay's tests hold it
//! to: a crash at each of its durable boundaries, a broker that is down
//! and then back, four writers on 1,000 aggregates, a poison event and its
//! redrive, a plugin swap mid-stream, and an idle reader that releases
//! WAL. Real processes (SIGKILL, the hot standby, Kafka) are in
//! `processes.rs`; the helpers of both are in `support/wal.rs`. Every test reads a slot
//! of its own, named like its database ([`TestDb::postgres_wal`]), and
//! drops it at the end; nextest's `wal` group bounds how many run at once.
//!
//! They run `outboxd run`'s pipeline in-process on the embedded transport,
//! so what reached "the broker" is the `transport_messages` table, in
//! publish order per key. Broker failures come from a trigger on that
//! table ([`install_test_broker`]): down (a retryable error) or rejecting
//! a payload (a check violation, which the embedded transport reports as
//! permanent).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxd::broker::MessageSource;
use outboxd::broker::embedded::{EmbeddedConsumer, EmbeddedConsumerConfig};
use outboxd::consumer::{Processed, process};
use outboxd::daemon::Daemon;
use outboxd::fault::{FaultPoint, Faults};
use outboxd::metrics::Metrics;
use outboxd_demo::billing::{self, BillingHandler};
use outboxd_demo::orders::{self, ConfirmOrder, OrderService};
use serde_json::json;
use sqlx::Row;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::support::wal::{
    check_delivered, confirmed_lsn, confirmed_past, create_counters, join_writers, metric_value,
    pool, spawn_writers, wait_all_published, wait_confirmed_past, wait_for_reader, write_counted,
};
use crate::support::{TestDb, WalTestDb, eventually, wal_config, wal_config_toml};

// ---- the pipeline, in-process ----------------------------------------------

/// `outboxd run`'s pipeline in this process, reading the test's slot.
struct Pipeline {
    stop: watch::Sender<bool>,
    set: JoinSet<Result<(), String>>,
    metrics: Arc<Metrics>,
}

async fn start(t: &WalTestDb, extra: &str, faults: Faults) -> Pipeline {
    start_with(t, &wal_config(&t.url, &t.slot, extra), faults).await
}

async fn start_with(t: &WalTestDb, config: &outboxd::config::Config, faults: Faults) -> Pipeline {
    let (stop, stop_rx) = watch::channel(false);
    let (set, handles) = Daemon::default()
        .spawn_pipeline(config, &t.db, faults, stop_rx)
        .await
        .expect("start the pipeline with relay.source = \"wal\"");
    Pipeline {
        stop,
        set,
        metrics: handles.metrics,
    }
}

impl Pipeline {
    /// SIGTERM's path: every task stops, without an error, within 30 s.
    async fn stop(self) {
        self.stop.send(true).expect("stop");
        tokio::time::timeout(
            Duration::from_secs(30),
            outboxd::daemon::join_all_workers(self.set),
        )
        .await
        .expect("the pipeline stops within 30 s")
        .expect("the pipeline stops without an error");
    }

    /// A crash, as near as one process gets: every task is aborted where it
    /// stands (a task hung at a fault point included), and the replication
    /// connection the reader held is cut on the server's side, as a dead
    /// process's would be.
    async fn crash(self, t: &WalTestDb) {
        drop(self.set);
        terminate_reader(t).await;
    }

    /// Waits until this pipeline reads the slot: the server shows the slot
    /// active and the process reports itself as its reader. Events
    /// committed from then on reach the relay through the stream.
    async fn wait_streaming(&self, t: &WalTestDb) {
        wait_for_reader(t).await;
        self.wait_metric("outboxd_relay_wal_active", 1.0).await;
    }

    fn metric(&self, name: &str) -> Option<f64> {
        metric_value(&self.metrics.render(None), name)
    }

    /// Waits until the metric `name` reads `want`.
    async fn wait_metric(&self, name: &str, want: f64) {
        eventually(
            Duration::from_secs(60),
            format!("{name} reading {want}"),
            async || {
                let got = self.metric(name);
                if got == Some(want) {
                    Ok(())
                } else {
                    Err(format!("{name} is {got:?}"))
                }
            },
        )
        .await
    }
}

/// Terminates the walsender that serves the slot, if any.
async fn terminate_reader(t: &WalTestDb) {
    t.count(&format!(
        "SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots
          WHERE slot_name = '{}' AND active_pid IS NOT NULL",
        t.slot
    ))
    .await;
}

/// Every delivery of the embedded transport's topics, in partition and
/// offset order, repeats included (a fresh consumer group).
async fn deliveries(t: &TestDb) -> Vec<outboxd::message::Delivery> {
    let topics: Vec<String> = sqlx::query("SELECT DISTINCT topic FROM transport_messages")
        .fetch_all(pool(t))
        .await
        .expect("topics")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut source = EmbeddedConsumer::new(
        t.db.clone(),
        EmbeddedConsumerConfig {
            group: "wal-test-receiver".into(),
            topics,
            partitions: outboxd::config::Config::from_toml("(defaults)", "", std::iter::empty())
                .expect("defaults")
                .transport
                .partitions,
            lease: Duration::from_secs(30),
        },
    );
    source.fetch(10_000).await.expect("fetch")
}

// ---- the test broker ---------------------------------------------------------

/// A trigger on the embedded transport's table makes it fail on cue:
/// `broker_down` makes every publish fail (a plain error: retryable),
/// `reject` makes a publish whose payload contains that text fail with a
/// check violation, which the embedded transport reports as permanent, and
/// `delay` (seconds per message) makes it slow.
async fn install_test_broker(t: &TestDb) {
    t.exec(
        r#"
CREATE TABLE public.test_broker (down boolean NOT NULL, reject text, delay float8 NOT NULL DEFAULT 0);
INSERT INTO public.test_broker VALUES (false, NULL);
CREATE FUNCTION public.test_broker_gate() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE b public.test_broker;
BEGIN
  SELECT * INTO b FROM public.test_broker;
  IF b.delay > 0 THEN
    PERFORM pg_sleep(b.delay);
  END IF;
  IF b.down THEN
    RAISE EXCEPTION 'test broker is down';
  END IF;
  IF b.reject IS NOT NULL AND position(b.reject IN convert_from(NEW.payload, 'UTF8')) > 0 THEN
    RAISE EXCEPTION 'test broker rejects a payload with %', b.reject USING ERRCODE = 'check_violation';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER test_broker_gate BEFORE INSERT ON outboxd.transport_messages
  FOR EACH ROW EXECUTE FUNCTION public.test_broker_gate();
"#,
    )
    .await;
}

async fn broker_down(t: &TestDb, down: bool) {
    t.exec(&format!("UPDATE public.test_broker SET down = {down}"))
        .await;
}

// ---- the crash matrix ------------------------------------------------------

/// One confirmed order, its event committed while the reader streams; the
/// reader stops for ever at `point` (armed to hang on its first hit); then
/// the "crash" and a restart without faults. Returns the test database,
/// with the crashed reader's state checked by `at_crash` first.
async fn crash_at(point: &str) -> WalTestDb {
    let t = TestDb::postgres_wal().await;
    orders::create_schema(&t.db).await.expect("orders");
    billing::create_schema(&t.db).await.expect("billing");
    orders::create_order(&t.db, "o1", "c1", 1234)
        .await
        .expect("order");
    let faults = Faults::parse(&format!("{point}:hang")).expect("fault point");
    let crashing = start(&t, "", faults).await;
    crashing.wait_streaming(&t).await;
    let before = t.text("SELECT pg_current_wal_lsn()::text").await;
    OrderService::new(t.db.clone())
        .confirm_order(&ConfirmOrder {
            order_id: "o1".into(),
            operation_key: None,
        })
        .await
        .expect("confirm");
    let committed = t.text("SELECT pg_current_wal_lsn()::text").await;
    match point {
        "after-publish-before-mark" => {
            // Published: the reader now hangs before the mark.
            t.wait_count(
                Duration::from_secs(90),
                "SELECT count(*) FROM transport_messages",
                1,
            )
            .await;
            assert_eq!(
                t.count("SELECT count(*) FROM outbox WHERE published_at IS NULL")
                    .await,
                1,
                "published but not marked"
            );
        }
        "wal-after-mark-before-confirm" => {
            t.wait_count(
                Duration::from_secs(90),
                "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL",
                1,
            )
            .await;
            assert_eq!(
                t.count("SELECT count(*) FROM transport_messages").await,
                1,
                "marked after its one publish"
            );
        }
        other => panic!("no crash test for {other}"),
    }
    // Hung at the point, the reader must not have confirmed the event's
    // transaction (which ends before `committed`); let a few status
    // intervals pass to give a wrong confirm the chance to show.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        !confirmed_past(&t, &committed).await,
        "at {point} the slot already confirms {} (the event's commit ends before {committed}, the stream started before {before}): \
         a crash now would lose the event if it were not marked",
        confirmed_lsn(&t).await
    );
    crashing.crash(&t).await;

    let restarted = start(&t, "", Faults::none()).await;
    wait_all_published(&t).await;
    wait_confirmed_past(&t, &committed).await;
    restarted.stop().await;
    t
}

/// The receiver deduplicates: the first delivery bills the order, every
/// repeat is recognised by its message id.
async fn receiver_bills_once(t: &TestDb) -> usize {
    let all = deliveries(t).await;
    assert!(!all.is_empty(), "nothing was delivered");
    let ids: std::collections::HashSet<_> = all
        .iter()
        .map(|d| d.header(outboxd::message::headers::MESSAGE_ID))
        .collect();
    assert_eq!(ids.len(), 1, "one event, one message id: {ids:?}");
    for (i, d) in all.iter().enumerate() {
        let want = if i == 0 {
            Processed::Handled
        } else {
            Processed::Duplicate
        };
        assert_eq!(
            process(&t.db, "billing", d, &BillingHandler)
                .await
                .expect("process"),
            want,
            "delivery {i}"
        );
    }
    assert_eq!(
        t.count("SELECT count(*) FROM invoices").await,
        1,
        "one invoice"
    );
    all.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_crash_after_publish_before_mark_republishes_and_the_receiver_deduplicates() {
    let t = crash_at("after-publish-before-mark").await;
    let n = receiver_bills_once(&t).await;
    assert!(
        n >= 2,
        "published, neither marked nor confirmed: the restarted relay must publish it again (got {n} deliveries)"
    );
    check_delivered(&t, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_crash_after_mark_before_confirm_loses_nothing_and_the_receiver_deduplicates() {
    let t = crash_at("wal-after-mark-before-confirm").await;
    let n = receiver_bills_once(&t).await;
    println!("after a crash between the mark and the confirm: {n} deliveries of the event");
    check_delivered(&t, false).await;
    // The restarted reader resumed from the slot and still streams: a new
    // event is published and confirmed.
    let next = start(&t, "", Faults::none()).await;
    next.wait_streaming(&t).await;
    create_counters(&t).await;
    let lsn = write_counted(pool(&t), "after-restart", json!({})).await;
    wait_all_published(&t).await;
    wait_confirmed_past(&t, &lsn).await;
    next.stop().await;
    check_delivered(&t, false).await;
}

// ---- a broker that is down, then back ---------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_broker_down_then_back_loses_nothing_and_keeps_each_aggregates_order() {
    let t = TestDb::postgres_wal().await;
    create_counters(&t).await;
    install_test_broker(&t).await;
    let pipeline = start(&t, "", Faults::none()).await;
    pipeline.wait_streaming(&t).await;

    // Up: some events flow.
    join_writers(spawn_writers(&t, 2, 100, 20)).await;
    wait_all_published(&t).await;

    // Down while writers go on: events fail, their aggregates wait.
    broker_down(&t, true).await;
    let writers = spawn_writers(&t, 2, 300, 20);
    t.wait_count(
        Duration::from_secs(90),
        "SELECT count(*) FROM (SELECT 1 FROM outbox WHERE attempts >= 2 LIMIT 1) x",
        1,
    )
    .await;
    let handed = pipeline
        .metric("outboxd_relay_wal_handed_aggregates")
        .unwrap_or(0.0);
    assert!(
        handed >= 1.0,
        "failed events' aggregates are handed to polling (outboxd_relay_wal_handed_aggregates = {handed})"
    );
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL")
            .await,
        0,
        "retryable failures within max_attempts never kill an event"
    );

    // Back: everything drains, in order, and the aggregates return to the
    // stream.
    broker_down(&t, false).await;
    join_writers(writers).await;
    let last = write_counted(pool(&t), "agg-0000", json!({})).await;
    wait_all_published(&t).await;
    wait_confirmed_past(&t, &last).await;
    pipeline
        .wait_metric("outboxd_relay_wal_handed_aggregates", 0.0)
        .await;
    // Streamed again: a new event is published through the stream.
    let after = write_counted(pool(&t), "agg-0001", json!({})).await;
    wait_all_published(&t).await;
    wait_confirmed_past(&t, &after).await;
    pipeline.stop().await;
    let (messages, events) = check_delivered(&t, true).await;
    assert_eq!(events, 402);
    println!("broker down, then back: {events} events, {messages} messages");
}

// ---- four writers on 1,000 aggregates -----------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_four_writers_on_1000_aggregates_keep_commit_order() {
    let t = TestDb::postgres_wal().await;
    create_counters(&t).await;
    let pipeline = start(&t, "", Faults::none()).await;
    pipeline.wait_streaming(&t).await;
    let started = Instant::now();
    join_writers(spawn_writers(&t, 4, 4000, 1000)).await;
    let last = write_counted(pool(&t), "agg-0000", json!({})).await;
    wait_all_published(&t).await;
    wait_confirmed_past(&t, &last).await;
    let took = started.elapsed();
    pipeline.stop().await;
    let (messages, events) = check_delivered(&t, true).await;
    assert_eq!(events, 4001);
    assert_eq!(
        messages, events,
        "without a fault every event is published exactly once"
    );
    println!("four writers, 1,000 aggregates, WAL relay: {events} events in {took:?}");
}

// ---- a poison event ------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_poison_event_goes_dead_holds_its_aggregate_and_redrive_publishes_in_order() {
    let t = TestDb::postgres_wal().await;
    create_counters(&t).await;
    install_test_broker(&t).await;
    t.exec("UPDATE public.test_broker SET reject = 'poison'")
        .await;
    let pipeline = start(&t, "", Faults::none()).await;
    pipeline.wait_streaming(&t).await;
    let db = pool(&t).clone();

    write_counted(&db, "sick", json!({})).await;
    write_counted(&db, "sick", json!({ "kind": "poison" })).await;
    write_counted(&db, "sick", json!({})).await;
    write_counted(&db, "sick", json!({})).await;
    for i in 0..40 {
        write_counted(&db, &format!("well-{}", i % 8), json!({})).await;
    }
    t.wait_count(
        Duration::from_secs(90),
        "SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL",
        1,
    )
    .await;
    let dead_seq = t
        .count("SELECT seq FROM outbox WHERE dead_at IS NOT NULL")
        .await;
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM outbox WHERE seq = {dead_seq} AND payload->>'kind' = 'poison'
               AND dead_reason LIKE '%rejects a payload with poison%' AND attempts = 1"
        ))
        .await,
        1,
        "the poison event is dead at once, with the broker's reason"
    );
    // Other aggregates flow, also those written after the poison died.
    for i in 0..40 {
        write_counted(&db, &format!("well-{}", i % 8), json!({})).await;
    }
    t.wait_count(
        Duration::from_secs(90),
        "SELECT count(*) FROM outbox WHERE aggregate_id LIKE 'well-%' AND published_at IS NULL",
        0,
    )
    .await;
    // Its aggregate's later events wait behind it, unpublished and unsent.
    assert_eq!(
        t.count(
            "SELECT count(*) FROM outbox WHERE aggregate_id = 'sick' AND published_at IS NULL AND dead_at IS NULL"
        )
        .await,
        2,
        "the poison's successors are pending"
    );
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM transport_messages m JOIN outbox o ON o.id = m.message_id
              WHERE o.aggregate_id = 'sick' AND o.seq > {dead_seq}"
        ))
        .await,
        0,
        "no event of the poison's aggregate overtook it"
    );
    assert_eq!(
        pipeline.metric("outboxd_relay_wal_handed_aggregates"),
        Some(1.0),
        "the poison's aggregate is handed to polling"
    );
    // A later event of the sick aggregate waits too.
    write_counted(&db, "sick", json!({})).await;

    // The cause is fixed, the event redriven: it and then its successors
    // are published, in order.
    t.exec("UPDATE public.test_broker SET reject = NULL").await;
    let redriven = outboxd::ops::dead::redrive(
        &t.db,
        &outboxd::ops::dead::DeadFilter {
            seq: Some(dead_seq),
            ..Default::default()
        },
        chrono::Utc::now(),
    )
    .await
    .expect("redrive");
    assert_eq!(redriven, 1);
    wait_all_published(&t).await;
    pipeline
        .wait_metric("outboxd_relay_wal_handed_aggregates", 0.0)
        .await;
    let last = write_counted(&db, "sick", json!({})).await;
    wait_all_published(&t).await;
    wait_confirmed_past(&t, &last).await;
    pipeline.stop().await;
    let (messages, events) = check_delivered(&t, true).await;
    assert_eq!((messages, events), (86, 86));
    let sick: Vec<i64> = sqlx::query(
        r#"SELECT (convert_from(m.payload, 'UTF8')::jsonb->>'n')::bigint
             FROM transport_messages m JOIN outbox o ON o.id = m.message_id
            WHERE o.aggregate_id = 'sick' ORDER BY m."offset""#,
    )
    .fetch_all(pool(&t))
    .await
    .expect("sick")
    .iter()
    .map(|r| r.get(0))
    .collect();
    assert_eq!(sick, [1, 2, 3, 4, 5, 6]);
}

// ---- a plugin swap mid-stream ------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_plugin_swap_mid_stream_runs_each_event_on_one_version_and_loses_nothing() {
    use crate::support::plugins::json_of;
    use crate::support::swap::{deploy_t, transformed_by};
    let t = TestDb::postgres_wal().await;
    create_counters(&t).await;
    let reg = outboxd::plugin::lifecycle::registry::Registry::new(t.db.clone());
    let v_ce = deploy_t(&reg, "cloudevents").await;
    let v_pii = deploy_t(&reg, "redact-pii").await;
    reg.activate("t", v_ce, "test").await.expect("activate");
    let cache = tempfile::tempdir().expect("cache dir");
    let extra = format!(
        r#"
[[routes]]
event_type = "order.*"
topic = "orders"
transformers = ["t"]

[[plugins]]
name = "t"
source = "registry"
limits = {{ timeout = "5s" }}

[plugin_runtime]
cache_dir = "{}"
registry_poll = "200ms"
"#,
        cache.path().display()
    );
    let pipeline = start(&t, &extra, Faults::none()).await;
    pipeline.wait_streaming(&t).await;

    let writers = spawn_writers(&t, 2, 600, 50);
    t.wait_count(
        Duration::from_secs(90),
        "SELECT count(*) FROM (SELECT 1 FROM transport_messages LIMIT 150) x",
        150,
    )
    .await;
    let to_pii = reg.activate("t", v_pii, "test").await.expect("activate");
    // Once an event has run on the new version, no event committed later
    // runs on the old one: those inserted after that publish (a higher
    // seq) committed after it.
    write_counted(pool(&t), "marker-1", json!({})).await;
    t.wait_count(Duration::from_secs(90),
        &format!(
            "SELECT count(*) FROM outbox WHERE aggregate_id = 'marker-1' AND published_at IS NOT NULL AND transformed_by = '{}'",
            to_pii.label()
        ),
        1,
    )
    .await;
    let seq_on_pii = t.count("SELECT max(seq) FROM outbox").await;
    join_writers(writers).await;
    let last = write_counted(pool(&t), "marker-2", json!({})).await;
    wait_all_published(&t).await;
    wait_confirmed_past(&t, &last).await;
    pipeline.stop().await;

    let (messages, events) = check_delivered(&t, false).await;
    assert_eq!(events, 602);
    assert_eq!(messages, events, "no event published twice");
    let by = transformed_by(&t.db).await;
    let sent = sqlx::query(
        r#"SELECT m.message_id::text, m.payload, o.seq FROM transport_messages m JOIN outbox o ON o.id = m.message_id"#,
    )
    .fetch_all(pool(&t))
    .await
    .expect("sent");
    let mut per_version: HashMap<String, usize> = HashMap::new();
    for row in &sent {
        let id: String = row.get(0);
        let payload: Vec<u8> = row.get(1);
        let seq: i64 = row.get(2);
        let label = by[&id].clone().expect("transformed_by is set");
        let enveloped = json_of(&payload).get("specversion").is_some();
        assert_eq!(
            enveloped,
            label == format!("t@{v_ce}"),
            "event {id} records {label} but its message is the other version's"
        );
        if seq > seq_on_pii {
            assert_eq!(
                label,
                to_pii.label(),
                "event seq {seq}, committed after the swap was live, ran on the old version"
            );
        }
        *per_version.entry(label).or_default() += 1;
    }
    println!("plugin swap mid-stream (WAL relay): events per version {per_version:?}");
    assert_eq!(per_version.len(), 2, "both versions ran: {per_version:?}");
}

/// `OUTBOXD_FAULT` can arm the WAL relay's own point by its name.
#[test]
fn wal_fault_point_is_known_by_its_name() {
    let point: Result<FaultPoint, _> = "wal-after-mark-before-confirm".parse();
    let point = point.expect("a fault point");
    assert_eq!(point.name(), "wal-after-mark-before-confirm");
    assert!(FaultPoint::ALL.contains(&point));
}

/// A WAL pipeline that streamed, published and confirmed one event and
/// has nothing left to do: where the idle-reader tests begin.
async fn idle_after_one_event(t: &WalTestDb) -> Pipeline {
    create_counters(t).await;
    let pipeline = start(t, "", Faults::none()).await;
    pipeline.wait_streaming(t).await;
    let first = write_counted(pool(t), "a", json!({})).await;
    wait_all_published(t).await;
    wait_confirmed_past(t, &first).await;
    pipeline
}

/// With no outbox insert to stream, the database's other writes (here to a
/// table outside the publication; on a real server, every other
/// database's too) still advance the WAL: the idle reader must confirm past
/// them, or its slot would hold that WAL for as long as the outbox is
/// quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_an_idle_reader_releases_wal_written_outside_the_outbox() {
    let t = TestDb::postgres_wal().await;
    let pipeline = idle_after_one_event(&t).await;
    for i in 0..200 {
        t.exec(&format!(
            "INSERT INTO public.counters (id, n) VALUES ('other-{i}', {i})"
        ))
        .await;
    }
    let end = t.text("SELECT pg_current_wal_insert_lsn()::text").await;
    // More WAL after `end`, so a position past it exists to be confirmed.
    t.exec("INSERT INTO public.counters (id, n) VALUES ('other-last', 0)")
        .await;
    wait_confirmed_past(&t, &end).await;
    let lag = pipeline.metric("outboxd_relay_wal_lag_bytes");
    assert!(lag.is_some(), "outboxd_relay_wal_lag_bytes is exported");
    pipeline.stop().await;
}

/// An idle reader makes no query: when other writes move the server's WAL
/// (here a table outside the publication; on a real server, every other
/// database's too), the reader confirms past them from the stream's
/// keepalives alone. It used to ask the server for its WAL end each time
/// the position moved, one query per `status_interval` on a busy server.
/// Everything the test itself runs in the window goes over a connection of
/// its own, so the backends of the pool show only the relay's statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_an_idle_reader_makes_no_query_while_other_writes_move_the_wal() {
    use sqlx::Connection;
    let t = TestDb::postgres_wal().await;
    let pipeline = idle_after_one_event(&t).await;
    // Past `status_interval` (250 ms): a read of the WAL end would be due.
    tokio::time::sleep(Duration::from_millis(600)).await;

    let mut own = sqlx::PgConnection::connect(&t.url)
        .await
        .expect("a connection of the test's own");
    let since: String = sqlx::query_scalar("SELECT clock_timestamp()::text")
        .fetch_one(&mut own)
        .await
        .expect("now");
    let confirmed_past = |lsn: String| {
        format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{}' AND confirmed_flush_lsn >= '{lsn}'::pg_lsn",
            t.slot
        )
    };
    for round in 0..5 {
        for i in 0..40 {
            sqlx::query("INSERT INTO public.counters (id, n) VALUES ($1, 0)")
                .bind(format!("other-{round}-{i}"))
                .execute(&mut own)
                .await
                .expect("a write outside the outbox");
        }
        let end: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text")
            .fetch_one(&mut own)
            .await
            .expect("lsn");
        sqlx::query("INSERT INTO public.counters (id, n) VALUES ($1, 0)")
            .bind(format!("other-{round}-last"))
            .execute(&mut own)
            .await
            .expect("more WAL");
        eventually(
            Duration::from_secs(60),
            format!("the idle reader never confirmed past {end}"),
            async || {
                let n: i64 = sqlx::query_scalar(&confirmed_past(end.clone()))
                    .fetch_one(&mut own)
                    .await
                    .expect("slot");
                n == 1
            },
        )
        .await;
        // Longer than `status_interval`, so a due read would have run.
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let queries: Vec<String> = sqlx::query_scalar(
        "SELECT query FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid()
            AND query_start > $1::timestamptz AND backend_type = 'client backend'",
    )
    .bind(&since)
    .fetch_all(&mut own)
    .await
    .expect("pg_stat_activity");
    assert!(
        queries.is_empty(),
        "an idle WAL reader made queries while other writes moved the WAL: {queries:?}"
    );
    own.close().await.expect("close");
    pipeline.stop().await;
}

// ---- the lag cap -------------------------------------------------------------

/// A slow broker under a flood of large events: the slot falls behind the
/// server's WAL by more than `relay.wal.max_lag_bytes`. The relay must
/// notice and fall back to polling (`outboxd_relay_wal_fallback`), keep
/// confirming the slot so that it retains no WAL, and still publish every
/// event in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_a_slot_further_behind_than_max_lag_bytes_falls_back_to_polling() {
    const MAX_LAG: i64 = 16 << 20;
    let t = TestDb::postgres_wal().await;
    create_counters(&t).await;
    install_test_broker(&t).await;
    let text = wal_config_toml(&t.url, &t.slot, "").replace(
        "sender_timeout = \"5s\"",
        &format!("sender_timeout = \"5s\"\nmax_lag_bytes = {MAX_LAG}"),
    );
    let config = outboxd::config::Config::from_toml("(lag test)", &text, std::iter::empty())
        .expect("config");
    let pipeline = start_with(&t, &config, Faults::none()).await;
    pipeline.wait_streaming(&t).await;

    // 100 ms a message: about 10 events/s, 2 MB/s of these payloads,
    // slower than the writers below produce WAL.
    t.exec("UPDATE public.test_broker SET delay = 0.1").await;
    let lag_sql = format!(
        "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = '{}'",
        t.slot
    );
    let mut writers = JoinSet::new();
    for w in 0..2 {
        let db = pool(&t).clone();
        writers.spawn(async move {
            for i in 0..150 {
                // About 200 kB of incompressible text per event.
                let blob: String = (0..6_250)
                    .map(|_| uuid::Uuid::new_v4().simple().to_string())
                    .collect();
                write_counted(
                    &db,
                    &format!("big-{}", (w * 150 + i) % 5),
                    json!({ "blob": blob }),
                )
                .await;
            }
        });
    }
    let mut worst = 0;
    let mut exceeded: Option<Instant> = None;
    let what = format!(
        "the slow broker never put the slot {MAX_LAG} bytes behind: this test proves nothing; make the broker slower"
    );
    eventually(Duration::from_secs(120), what, async || {
        let lag = t.count(&lag_sql).await;
        worst = worst.max(lag);
        if pipeline.metric("outboxd_relay_wal_fallback") == Some(1.0) {
            return Ok(());
        }
        if lag > MAX_LAG && exceeded.is_none() {
            exceeded = Some(Instant::now());
        }
        if let Some(since) = exceeded {
            assert!(
                since.elapsed() < Duration::from_secs(20),
                "the slot fell {lag} bytes behind the server's WAL (over relay.wal.max_lag_bytes = {MAX_LAG} for 20 s, \
                 worst {worst}; outboxd_relay_wal_lag_bytes = {:?}), and the relay did not fall back to polling",
                pipeline.metric("outboxd_relay_wal_lag_bytes")
            );
        }
        Err(format!("worst {worst}"))
    })
    .await;
    println!("fell back to polling with the slot {worst} bytes behind at worst");
    t.exec("UPDATE public.test_broker SET delay = 0").await;
    join_writers(writers).await;
    let last = write_counted(pool(&t), "big-0", json!({})).await;
    wait_all_published(&t).await;
    // Polling now, it still confirms the stream: the slot holds no WAL.
    wait_confirmed_past(&t, &last).await;
    pipeline.stop().await;
    let (_, events) = check_delivered(&t, true).await;
    assert_eq!(events, 301);
}
