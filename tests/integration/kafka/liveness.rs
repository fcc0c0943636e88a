//! Kafka consumer-group liveness: group members SIGKILLed again and again
//! (`outboxd run` processes) still drain the whole backlog within 60 s plus
//! the session timeout after the last kill, on tansu and on librdkafka's
//! mock cluster; and a member that sees partitions with lag and no progress
//! joins again with a new client, counted in
//! `outboxd_consumer_recoveries_total`.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use outboxd::broker::MessageSource;
use outboxd::broker::kafka::{KafkaConsumer, KafkaConsumerConfig, KafkaPublisher};
use outboxd::event::NewEvent;
use outboxd::metrics::Metrics;
use outboxd::relay::StepOutcome;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::mocking::MockCluster;
use serde_json::json;
use tokio::process::Child;

use crate::support::kafka::{bootstrap, create_topic, produce, props, unique};
use crate::support::process::outboxd_with_billing;
use crate::support::{TestDb, eventually};

/// The group's session timeout in these tests: how long a killed member's
/// partitions wait before the coordinator moves them.
const SESSION_TIMEOUT: Duration = Duration::from_secs(6);
/// How long the members are killed and restarted.
const KILL_PHASE: Duration = Duration::from_secs(40);
/// Orders in the topic before the first kill; more arrive during the kills.
const BACKLOG: usize = 600;
/// Orders committed after each kill.
const PER_KILL: usize = 30;

struct Group {
    t: TestDb,
    bootstrap: String,
    topic: String,
    name: String,
    dir: tempfile::TempDir,
    started: usize,
}

impl Group {
    /// Starts one `outboxd run` consumer process of the group, its stderr
    /// in a file of `dir`.
    fn spawn(&mut self) -> Child {
        self.started += 1;
        let log = self.dir.path().join(format!("member-{}.log", self.started));
        let file = std::fs::File::create(&log).expect("member log");
        let consumers = format!(
            r#"[{{name = "{}", topics = ["{}"], handler = "builtin:billing", batch_in_transaction = 10, kafka_stall_timeout = "10s"}}]"#,
            self.name, self.topic
        );
        outboxd_with_billing(&self.t)
            .arg("run")
            .env("OUTBOXD__RELAY__WORKERS", "0")
            .env("OUTBOXD__TRANSPORT__KIND", "kafka")
            .env(
                "OUTBOXD__TRANSPORT__KAFKA__bootstrap.servers",
                &self.bootstrap,
            )
            .env(
                "OUTBOXD__TRANSPORT__KAFKA__session.timeout.ms",
                format!("\"{}\"", SESSION_TIMEOUT.as_millis()),
            )
            .env(
                "OUTBOXD__TRANSPORT__KAFKA__heartbeat.interval.ms",
                "\"1000\"",
            )
            .env("OUTBOXD__CONSUMERS", consumers)
            .env("OUTBOXD_LOG", "warn,outboxd=info")
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .spawn()
            .expect("spawn outboxd run")
    }

    async fn invoices(&self) -> i64 {
        self.t
            .count("SELECT count(DISTINCT order_id) FROM invoices")
            .await
    }
}

/// Commits `n` orders whose events go to `topic`, starting at `first`.
async fn orders(t: &TestDb, topic: &str, first: usize, n: usize) {
    for i in first..first + n {
        t.enqueue(NewEvent::new(
            format!("order-{i}"),
            topic,
            json!({ "order_id": format!("order-{i}"), "customer_id": "c", "total_cents": 100 }),
        ))
        .await;
    }
}

/// Publishes every outbox row to Kafka, retrying what the broker refused
/// at once rather than after the relay's backoff.
async fn publish_all(t: &TestDb, publisher: &Arc<KafkaPublisher>) {
    let relay = t.relay(publisher.clone());
    eventually(
        Duration::from_secs(60),
        "every event published",
        async || {
            match relay.step().await.expect("relay step") {
                StepOutcome::Published(r) => {
                    assert_eq!(r.dead, 0, "{r:?}");
                    Err("publishing".to_string())
                }
                StepOutcome::Idle => {
                    let left = t
                        .count("SELECT count(*) FROM outbox WHERE published_at IS NULL")
                        .await;
                    if left == 0 {
                        return Ok(());
                    }
                    // What the broker refused is retried at this pace, not
                    // after the relay's backoff.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    t.make_all_due().await;
                    Err(format!("{left} events still unpublished"))
                }
            }
        },
    )
    .await
}

/// Two members of one group; during `KILL_PHASE` one of them is SIGKILLed
/// every 1 to 2.5 s and started again while orders keep arriving. After the
/// last kill both run, and every order must get its one invoice within 60 s
/// plus the session timeout.
async fn members_killed_again_and_again_drain_the_backlog(
    bootstrap: String,
    topic: String,
    seed: u64,
) {
    let t = TestDb::postgres().await;
    outboxd_demo::billing::create_schema(&t.db)
        .await
        .expect("billing schema");
    let publisher = Arc::new(
        KafkaPublisher::new(&props(&bootstrap), Duration::from_secs(10)).expect("publisher"),
    );
    orders(&t, &topic, 0, BACKLOG).await;
    publish_all(&t, &publisher).await;

    let mut group = Group {
        t,
        bootstrap,
        topic: topic.clone(),
        name: unique("ledger"),
        dir: tempfile::tempdir().expect("tempdir"),
        started: 0,
    };
    let mut members = [group.spawn(), group.spawn()];
    let mut total = BACKLOG;
    let mut kills = 0;
    let mut rng = Xorshift(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    // Which slot holds the member started last.
    let mut youngest = 1;
    let start = Instant::now();
    while start.elapsed() < KILL_PHASE {
        tokio::time::sleep(Duration::from_millis(1000 + rng.next() % 1500)).await;
        // The last kill takes the younger member, so the survivor is the
        // one most likely to lead the group: what left tansu 0.6.0's
        // coordinator with partitions assigned to a dead member.
        let last = start.elapsed() + Duration::from_millis(2500) >= KILL_PHASE;
        let victim = if last {
            youngest
        } else {
            (rng.next() % 2) as usize
        };
        youngest = victim;
        for m in &mut members {
            if let Some(status) = m.try_wait().expect("try_wait") {
                let logs = members_logs(&group);
                panic!(
                    "a member exited by itself ({status}); last lines:\n{}",
                    logs[logs.len().saturating_sub(20)..].join("\n")
                );
            }
        }
        members[victim].start_kill().expect("SIGKILL");
        members[victim].wait().await.expect("wait");
        kills += 1;
        // New orders while the group is in flux.
        orders(&group.t, &topic, total, PER_KILL).await;
        total += PER_KILL;
        publish_all(&group.t, &publisher).await;
        members[victim] = group.spawn();
    }
    let last_kill = Instant::now();
    let at_last_kill = group.invoices().await;
    let bound = Duration::from_secs(60) + SESSION_TIMEOUT;
    let want = i64::try_from(total).expect("count");
    let mut done = at_last_kill;
    while done < want && last_kill.elapsed() < bound {
        tokio::time::sleep(Duration::from_millis(200)).await;
        done = group.invoices().await;
    }
    let drain = last_kill.elapsed();
    let recoveries: Vec<String> = members_logs(&group)
        .into_iter()
        .filter(|l| l.contains("joining again with a new client"))
        .collect();
    println!(
        "{kills} kills in {KILL_PHASE:?}: {at_last_kill} of {total} invoices at the last kill, {done} after {drain:?}; {} recoveries",
        recoveries.len()
    );
    for line in &recoveries {
        println!("  {line}");
    }
    if done < want {
        for line in describe_group(&group.bootstrap, &group.name, &topic).await {
            println!("  {line}");
        }
        let logs = members_logs(&group);
        println!("the members' last log lines:");
        for line in &logs[logs.len().saturating_sub(30)..] {
            println!("  {line}");
        }
    }
    assert_eq!(
        done, want,
        "the backlog did not drain within {bound:?} of the last kill ({kills} kills)"
    );
    assert_eq!(
        group.t.count("SELECT count(*) FROM invoices").await,
        want,
        "one invoice per order"
    );
    for m in &mut members {
        m.start_kill().expect("stop");
        let _ = m.wait().await;
    }
}

/// What the coordinator says of `group` (its state, each member and its
/// assignment) and, per partition of `topic`, the group's committed offset
/// against the high watermark: what a stalled drain is diagnosed with.
async fn describe_group(bootstrap: &str, group: &str, topic: &str) -> Vec<String> {
    let (bootstrap, group, topic) = (bootstrap.to_string(), group.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        let reader: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("reader");
        let timeout = Duration::from_secs(10);
        match reader.fetch_group_list(Some(&group), timeout) {
            Ok(list) => {
                for g in list.groups() {
                    out.push(format!("group {} state {}", g.name(), g.state()));
                    for m in g.members() {
                        out.push(format!(
                            "  member {} assigned {:?}",
                            m.id(),
                            m.assignment().map(assigned_partitions)
                        ));
                    }
                }
            }
            Err(e) => out.push(format!("describe group: {e}")),
        }
        let mut list = rdkafka::TopicPartitionList::new();
        for p in 0..4 {
            list.add_partition(&topic, p);
        }
        let committed = reader.committed_offsets(list, timeout);
        for p in 0..4 {
            let high = reader.fetch_watermarks(&topic, p, timeout).map(|w| w.1);
            let at = committed
                .as_ref()
                .ok()
                .and_then(|c| c.find_partition(&topic, p))
                .map(|e| e.offset());
            out.push(format!(
                "  {topic}/{p}: committed {at:?}, high watermark {high:?}"
            ));
        }
        out
    })
    .await
    .expect("describe task")
}

/// The partitions in a consumer protocol assignment (version, then per
/// topic its name and partitions).
fn assigned_partitions(bytes: &[u8]) -> Vec<i32> {
    let mut at = 2; // version
    let mut take = |n: usize| {
        let s = bytes.get(at..at + n).map(<[u8]>::to_vec);
        at += n;
        s
    };
    let mut parts = Vec::new();
    let int = |b: Option<Vec<u8>>| b.map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    let topics = int(take(4)).unwrap_or(0);
    for _ in 0..topics {
        let Some(len) = take(2).map(|b| i16::from_be_bytes([b[0], b[1]])) else {
            break;
        };
        take(usize::try_from(len).unwrap_or(0));
        let n = int(take(4)).unwrap_or(0);
        for _ in 0..n {
            if let Some(p) = int(take(4)) {
                parts.push(p);
            }
        }
    }
    parts
}

/// The kill schedule's dice: a fixed seed, so a failure replays.
struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Every line the members wrote to stderr so far.
fn members_logs(group: &Group) -> Vec<String> {
    let mut lines = Vec::new();
    for n in 1..=group.started {
        let path = group.dir.path().join(format!("member-{n}.log"));
        if let Ok(text) = std::fs::read_to_string(&path) {
            lines.extend(text.lines().map(|l| format!("member-{n}: {l}")));
        }
    }
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_group_members_killed_again_and_again_drain_the_backlog() {
    let bootstrap = bootstrap();
    let topic = unique("liveness");
    create_topic(&bootstrap, &topic, 4).await;
    members_killed_again_and_again_drain_the_backlog(bootstrap, topic, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_group_members_killed_again_and_again_drain_the_backlog() {
    let mock = MockCluster::new(1).expect("mock cluster");
    let topic = unique("liveness");
    mock.create_topic(&topic, 4, 1).expect("mock topic");
    members_killed_again_and_again_drain_the_backlog(mock.bootstrap_servers(), topic, 2).await;
}

/// A member whose group has a partition with lag that nobody moves (its
/// owner is alive and heartbeats, but never commits) joins again with a new
/// client once the stall time has passed, and counts it by reason.
#[tokio::test(flavor = "multi_thread")]
async fn mock_member_rejoins_when_a_partition_with_lag_makes_no_progress() {
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic("t", 2, 1).expect("topic");
    let bootstrap = mock.bootstrap_servers();
    produce(&bootstrap, "t", &["a", "b", "c", "d", "e", "f"], 5).await;
    let session = "6000";

    // The idle owner: polls (so it stays in the group) and never commits.
    // It speaks the group's assignor, as an outboxd member does: librdkafka
    // cannot mix an eager assignor with cooperative-sticky in one group.
    let idle: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "g")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", session)
        .set("heartbeat.interval.ms", "500")
        .create()
        .expect("idle member");
    idle.subscribe(&["t"]).expect("subscribe");
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let poller = tokio::spawn(async move {
        while !stopped.load(Ordering::SeqCst) {
            let _ = tokio::time::timeout(Duration::from_millis(200), idle.recv()).await;
        }
    });

    let metrics = Metrics::default();
    let mut p = props(&bootstrap);
    p.insert("session.timeout.ms".into(), session.into());
    p.insert("heartbeat.interval.ms".into(), "500".into());
    let mut cfg = KafkaConsumerConfig::new("g", vec!["t".into()]);
    cfg.stall_timeout = Some(Duration::from_secs(1));
    let mut member = KafkaConsumer::new(&p, cfg)
        .expect("member")
        .with_metrics(metrics.consumer("g"));
    let stall_after = member.stall_after().expect("a group member watches");
    assert_eq!(
        stall_after,
        Duration::from_secs(7),
        "the stall timeout on top of the session timeout"
    );

    let started = Instant::now();
    let recovered = eventually(Duration::from_secs(40), "no recovery", async || {
        // Everything this member gets, it handles and commits at once.
        let batch = member.fetch(100).await.expect("fetch");
        let mut last = std::collections::BTreeMap::new();
        for d in batch {
            last.insert(d.partition, d);
        }
        for d in last.values() {
            member.commit(d).await.expect("commit");
        }
        if metrics.consumer("g").recoveries.get("stalled") > 0 {
            Ok(started.elapsed())
        } else {
            Err(format!("/metrics says:\n{}", metrics.render(None)))
        }
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    poller.await.expect("poller");
    assert!(
        recovered >= stall_after,
        "recovered after {recovered:?}, before the stall time {stall_after:?}"
    );
    let text = metrics.render(None);
    assert!(
        text.contains("outboxd_consumer_recoveries_total{consumer=\"g\",reason=\"stalled\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE outboxd_consumer_stalled_partitions gauge"),
        "{text}"
    );
}
