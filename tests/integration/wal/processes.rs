//! The WAL relay (`relay.source = "wal"`) as real `outboxd` processes: a
//! process SIGKILLed between publish and mark, and between mark and the
//! slot's confirm; a hot standby that takes the slot over from a killed
//! reader and from a frozen one (a partition); `outboxd migrate` creating the publication and slot; a login
//! without REPLICATION refused at start; and a crash with Kafka (tansu) as
//! the broker. The in-process invariants and the helpers are in
//! `relay.rs` (the helpers: `support/wal.rs`).

use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::support::process::{outboxd_with_config as outboxd, terminate};
use crate::support::wal::{
    check_delivered, confirmed_lsn, create_counters, join_writers, metric_value, pool, slot_active,
    spawn_writers, wait_all_published, wait_confirmed_past, wait_for_reader, write_counted,
};
use crate::support::{TestDb, WalTestDb, eventually, wal_config_toml};

// ---- a real process, killed --------------------------------------------------

fn write_config(dir: &tempfile::TempDir, t: &WalTestDb, extra: &str) -> std::path::PathBuf {
    let path = dir.path().join("outboxd.toml");
    let text = wal_config_toml(&t.url, &t.slot, extra);
    std::fs::write(&path, text).expect("write the config");
    path
}

/// A relay process armed to hang at `point` on its third hit is SIGKILLed
/// there while four writers commit 600 events on 40 aggregates; a
/// restarted process publishes everything and the slot catches up.
async fn kill_at_and_restart(t: &WalTestDb, extra: &str, point: &str) {
    create_counters(t).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(&dir, t, extra);
    let mut child = outboxd(&config)
        .arg("run")
        .env("OUTBOXD_FAULT", format!("{point}:hang:3"))
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn outboxd run");
    let stderr = child.stderr.take().expect("stderr");
    let (hit_tx, hit_rx) = tokio::sync::oneshot::channel();
    let log = tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        let mut hit = Some(hit_tx);
        let mut tail = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.starts_with("OUTBOXD FAULT")
                && let Some(h) = hit.take()
            {
                let _ = h.send(());
            }
            tail.push(line);
        }
        tail
    });
    wait_for_reader(t).await;
    let writers = spawn_writers(t, 4, 600, 40);
    let reached = tokio::time::timeout(Duration::from_secs(90), hit_rx).await;
    child.start_kill().expect("SIGKILL");
    let status = child.wait().await.expect("wait");
    let tail = log.await.expect("log reader");
    assert!(
        matches!(reached, Ok(Ok(()))),
        "the relay never reached {point} (status {status}); its log:\n{}",
        tail.join("\n")
    );
    println!(
        "killed at {point}: {} events marked, slot confirmed at {}",
        t.count("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
            .await,
        confirmed_lsn(t).await
    );
    join_writers(writers).await;
    let last = write_counted(pool(t), "last", json!({})).await;

    let mut restarted = outboxd(&config)
        .arg("run")
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("restart outboxd run");
    wait_all_published(t).await;
    wait_confirmed_past(t, &last).await;
    terminate(&mut restarted).await;
}

/// [`kill_at_and_restart`] on the embedded transport; then nothing is lost
/// and a receiver that drops repeats sees every aggregate in commit order.
async fn killed_at(point: &str) -> (usize, usize) {
    let t = TestDb::postgres_wal().await;
    kill_at_and_restart(&t, "", point).await;
    check_delivered(&t, true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_process_killed_between_publish_and_mark_republishes_and_loses_nothing() {
    let (messages, events) = killed_at("after-publish-before-mark").await;
    assert!(
        messages > events,
        "a batch was published and not marked when the process died: some event must reach the broker twice ({messages} messages, {events} events)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_process_killed_between_mark_and_lsn_confirm_loses_nothing() {
    let (messages, events) = killed_at("wal-after-mark-before-confirm").await;
    println!("killed between mark and confirm: {messages} messages for {events} events");
}

// ---- hot standby -------------------------------------------------------------

const TOKEN: &str = "wal-standby-token-0123456789";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// GET /metrics of a process's admin API; `None` while it does not answer.
async fn scrape(port: u16) -> Option<String> {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let req = format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        text.starts_with("HTTP/1.1 200").then_some(text)
    };
    tokio::time::timeout(Duration::from_secs(2), fetch)
        .await
        .ok()
        .flatten()
}

async fn wal_active(port: u16) -> Option<f64> {
    scrape(port)
        .await
        .and_then(|m| metric_value(&m, "outboxd_relay_wal_active"))
}

/// How the active reader goes away in a standby test.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Loss {
    /// SIGKILL: the process dies and the kernel closes its connections.
    Crash,
    /// SIGSTOP: the process freezes with its connections open, as behind a
    /// network partition; only the server's wal_sender_timeout
    /// (relay.wal.sender_timeout, 5 s here) frees the slot.
    Partition,
}

/// Two `outboxd run` processes in WAL mode on one database; writers commit
/// 1,500 events on 100 aggregates; mid-stream the active reader is lost as
/// `loss` says. The standby takes the slot within `bound`, nothing is lost
/// and every aggregate keeps its commit order.
async fn standby_takes_over(loss: Loss, bound: Duration) {
    let t = TestDb::postgres_wal().await;
    create_counters(&t).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ports = [free_port(), free_port()];
    let mut children = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let sub = tempfile::Builder::new()
            .prefix(&format!("p{i}"))
            .tempdir_in(dir.path())
            .expect("dir");
        let config = write_config(
            &sub,
            &t,
            &format!(
                "[admin]\nenabled = true\nlisten = \"127.0.0.1:{port}\"\ntoken = \"{TOKEN}\"\nsample_seconds = 1\n"
            ),
        );
        let child = outboxd(&config)
            .arg("run")
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn outboxd run");
        children.push((child, *port, sub));
    }
    // Exactly one reads the slot; the other waits.
    let active = eventually(
        Duration::from_secs(60),
        "no single active reader",
        async || {
            let a = wal_active(ports[0]).await;
            let b = wal_active(ports[1]).await;
            match (a.map(|v| v == 1.0), b.map(|v| v == 1.0)) {
                (Some(true), Some(false)) => Ok(0),
                (Some(false), Some(true)) => Ok(1),
                (Some(true), Some(true)) => {
                    panic!("both processes report that they read the slot")
                }
                _ => Err(format!("outboxd_relay_wal_active: {a:?}, {b:?}")),
            }
        },
    )
    .await;
    let standby = 1 - active;
    assert!(slot_active(&t).await);

    let writers = spawn_writers(&t, 2, 1500, 100);
    t.wait_count(
        Duration::from_secs(90),
        "SELECT count(*) FROM (SELECT 1 FROM transport_messages LIMIT 300) x",
        300,
    )
    .await;
    // Mid-stream: lose the reader.
    let (mut victim, _, _) = children.remove(active);
    let pid = victim.id().expect("pid").to_string();
    let signal = match loss {
        Loss::Crash => "-KILL",
        Loss::Partition => "-STOP",
    };
    let sent = std::process::Command::new("kill")
        .args([signal, &pid])
        .status()
        .expect("kill");
    assert!(sent.success(), "kill {signal} {pid}");
    let lost = Instant::now();
    let took_over = eventually(
        Duration::from_secs(60),
        format!("the standby did not take the slot after the reader's loss ({loss:?})"),
        async || (wal_active(ports[standby]).await == Some(1.0)).then(|| lost.elapsed()),
    )
    .await;
    println!(
        "hot standby, {loss:?}: took over {took_over:?} after the reader was lost (standby_retry 250ms, sender_timeout 5s)"
    );
    assert!(
        took_over < bound,
        "{loss:?}: the standby must take over within {bound:?}, not {took_over:?}"
    );
    // The frozen reader is killed without being thawed: after a real
    // partition the server ends its other sessions too (TCP keepalives),
    // and until then a transaction it left open (a mark, a publish on the
    // embedded transport) would hold locks the survivor waits for, in
    // polling mode as much as here.
    victim.start_kill().expect("SIGKILL");
    victim.wait().await.expect("wait");
    join_writers(writers).await;
    let last = write_counted(pool(&t), "agg-0000", json!({})).await;
    wait_all_published(&t).await;
    wait_confirmed_past(&t, &last).await;
    let scraped = scrape(ports[standby]).await.expect("metrics");
    assert_eq!(
        metric_value(&scraped, "outboxd_relay_wal_takeovers_total"),
        Some(1.0),
        "the survivor became the reader once"
    );
    let (mut survivor, _, _) = children.remove(0);
    terminate(&mut survivor).await;
    let (messages, events) = check_delivered(&t, true).await;
    assert_eq!(events, 1501);
    println!("hot standby, {loss:?}: {events} events, {messages} messages across the takeover");
}

/// After a crash the standby takes over in about `standby_retry`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_hot_standby_takes_over_from_a_killed_reader_within_seconds() {
    standby_takes_over(Loss::Crash, Duration::from_secs(5)).await;
}

/// After a partition (here a frozen reader, its connection open) the
/// server drops the silent reader after `sender_timeout` (5 s here), and
/// the standby takes over then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_hot_standby_takes_over_from_a_partitioned_reader_within_sender_timeout() {
    standby_takes_over(Loss::Partition, Duration::from_secs(5 + 5)).await;
}

// ---- setup errors --------------------------------------------------------------

/// `outboxd migrate` with `relay.source = "wal"` creates what the relay
/// reads when it is missing: the publication of the outbox's inserts only
/// (the relay's marks and retention's deletes never stream back) and the
/// pgoutput slot. `store::wal::drop_slot` removes the slot first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_migrate_creates_the_publication_and_the_slot_when_missing() {
    let t = TestDb::postgres_wal().await;
    outboxd::store::outbox::wal::drop_slot(&t.db, &t.slot)
        .await
        .expect("drop the slot");
    t.exec("DROP PUBLICATION outboxd_outbox").await;
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{}'",
            t.slot
        ))
        .await,
        0
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(&dir, &t, "");
    let out = outboxd(&config)
        .arg("migrate")
        .output()
        .await
        .expect("run outboxd migrate");
    assert!(
        out.status.success(),
        "outboxd migrate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{}' AND plugin = 'pgoutput'",
            t.slot
        ))
        .await,
        1,
        "the pgoutput slot"
    );
    assert_eq!(
        t.count(
            "SELECT count(*) FROM pg_publication p JOIN pg_publication_tables pt ON pt.pubname = p.pubname
              WHERE p.pubname = 'outboxd_outbox' AND pt.schemaname = 'outboxd' AND pt.tablename = 'outbox'
                AND p.pubinsert AND NOT p.pubupdate AND NOT p.pubdelete"
        )
        .await,
        1,
        "a publication of the outbox's inserts only"
    );
}

/// A login without the REPLICATION attribute cannot read a slot: `outboxd
/// run` in WAL mode stops at start with an error that names the privilege,
/// instead of running without a relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_a_login_without_replication_is_refused_at_start_naming_the_privilege() {
    let t = TestDb::postgres_wal().await;
    // Roles belong to the cluster: named after the database, so tests/run.sh
    // drops it with the other leftovers.
    let role = format!("{}_norepl", t.database_name());
    t.exec(&format!(
        "CREATE ROLE {role} LOGIN NOSUPERUSER NOREPLICATION;
         GRANT USAGE ON SCHEMA outboxd TO {role};
         GRANT ALL ON ALL TABLES IN SCHEMA outboxd TO {role};
         GRANT ALL ON ALL SEQUENCES IN SCHEMA outboxd TO {role};"
    ))
    .await;
    let (scheme, rest) = t.url.split_once("://").expect("a URL");
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let url = format!("{scheme}://{role}@{host}");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("outboxd.toml");
    let text = wal_config_toml(&url, &t.slot, "").replace(
        "max_connections = 16",
        "max_connections = 16\nmigrate_on_start = false",
    );
    std::fs::write(&path, text).expect("write the config");
    let out = tokio::time::timeout(Duration::from_secs(60), outboxd(&path).arg("run").output())
        .await
        .expect("outboxd run stops by itself within 60 s")
        .expect("run outboxd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "started without REPLICATION: {stderr}"
    );
    assert!(stderr.contains("REPLICATION"), "{stderr}");
}

// ---- on a Kafka-compatible broker ----------------------------------------------

/// The WAL relay publishing to Kafka (tansu in CI): an `outboxd run` that
/// stops between publish and mark is SIGKILLed mid-stream and restarted. Every
/// event reaches the topic, keyed by its aggregate, one partition per
/// aggregate, and a reader that drops repeated message ids sees each
/// aggregate's events in commit order; the crashed batch arrives twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_kafka_crash_between_publish_and_mark_republishes_in_order() {
    use crate::support::kafka::{bootstrap, create_topic, read_all, unique};
    let bootstrap = bootstrap();
    let topic = unique("wal-orders");
    create_topic(&bootstrap, &topic, 4).await;
    let t = TestDb::postgres_wal().await;
    let extra = format!(
        r#"
[transport]
kind = "kafka"
[transport.kafka]
"bootstrap.servers" = "{bootstrap}"

[[routes]]
event_type = "order.*"
topic = "{topic}"
"#
    );
    kill_at_and_restart(&t, &extra, "after-publish-before-mark").await;

    let events = t.count("SELECT count(*) FROM outbox").await as usize;
    assert_eq!(events, 601);
    let seen = read_all(&bootstrap, &topic, events).await;
    let mut ids = std::collections::HashSet::new();
    let mut last_n: HashMap<Vec<u8>, i64> = HashMap::new();
    let mut partition_of: HashMap<Vec<u8>, i32> = HashMap::new();
    for s in &seen {
        assert_eq!(s.headers["aggregate-id"].as_bytes(), &s.key[..]);
        assert_eq!(
            *partition_of.entry(s.key.clone()).or_insert(s.partition),
            s.partition,
            "one partition per aggregate"
        );
        if !ids.insert(s.headers["message-id"].clone()) {
            continue;
        }
        let n = s.payload["n"].as_i64().expect("counter");
        let last = last_n.entry(s.key.clone()).or_insert(0);
        assert_eq!(
            n,
            *last + 1,
            "aggregate {}: event {n} after event {last}",
            String::from_utf8_lossy(&s.key)
        );
        *last = n;
    }
    assert_eq!(ids.len(), events, "every event reached the topic");
    assert!(
        seen.len() > events,
        "the batch published before the crash and never marked is published again ({} messages)",
        seen.len()
    );
}
