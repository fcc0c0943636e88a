use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream;
use outboxd::broker::embedded::partition_for;
use outboxd::broker::nats::{
    NatsConsumer, NatsConsumerConfig, NatsPublisher, check_streams, connect, start,
};
use outboxd::broker::{MessageSource, PublishError, Publisher};
use outboxd::config::NatsSection;
use outboxd::config::nats::stream_name;

use crate::support::publisher::msg;
use crate::support::{TestDb, eventually, on_both};

fn nats_url() -> String {
    std::env::var("OUTBOXD_TEST_NATS").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

fn section() -> NatsSection {
    NatsSection {
        url: nats_url(),
        ..NatsSection::default()
    }
}

/// A topic of this test's own; its stream is deleted when the test ends,
/// passed or failed.
struct Topic {
    name: String,
}

impl Topic {
    fn new(prefix: &str) -> Self {
        Self {
            name: format!("t.{prefix}.{}", uuid::Uuid::new_v4().simple()),
        }
    }
}

impl Drop for Topic {
    fn drop(&mut self) {
        let stream = stream_name(&self.name);
        let url = nats_url();
        // A thread of its own: the test's runtime may be shutting down.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                if let Ok(c) = async_nats::connect(url).await {
                    let _ = jetstream::new(c).delete_stream(&stream).await;
                }
            });
        })
        .join();
    }
}

async fn publisher(topic: &Topic, partitions: i32) -> NatsPublisher {
    let client = start(&section(), &BTreeSet::from([topic.name.clone()]), Some(1))
        .await
        .expect("stream created");
    NatsPublisher::new(client, partitions, Duration::from_secs(5))
}

/// The machine's server, straight through async-nats: what the stream holds.
async fn raw() -> jetstream::Context {
    jetstream::new(async_nats::connect(nats_url()).await.expect("connect"))
}

async fn stream_messages(topic: &Topic) -> u64 {
    let mut s = raw()
        .await
        .get_stream(stream_name(&topic.name))
        .await
        .expect("stream");
    s.info().await.expect("info").state.messages
}

#[tokio::test]
async fn publish_waits_for_the_ack_partitions_by_key_and_a_republish_is_dropped() {
    let topic = Topic::new("pub");
    let p = publisher(&topic, 4).await;
    let mut sent = Vec::new();
    for n in 0..40 {
        let m = msg(&topic.name, &format!("k{}", n % 5), n);
        p.publish(m.clone()).await.expect("acknowledged");
        sent.push(m);
    }
    assert_eq!(stream_messages(&topic).await, 40);
    // A relay that crashed after the publish and before marking the row
    // sends the same message ids again: JetStream's duplicate window drops
    // them.
    for m in sent.iter().take(10) {
        p.publish(m.clone()).await.expect("acknowledged again");
    }
    assert_eq!(stream_messages(&topic).await, 40, "re-publishes dropped");
    // Each message is on the subject of its key's partition.
    let s = raw()
        .await
        .get_stream(stream_name(&topic.name))
        .await
        .expect("stream");
    for seq in 1..=40u64 {
        let raw = s.get_raw_message(seq).await.expect("message");
        let key = raw
            .headers
            .get(outboxd::broker::nats::KEY_HEADER)
            .map(|v| v.as_str().to_string())
            .expect("key header");
        assert_eq!(
            raw.subject.as_str(),
            format!("{}.{}", topic.name, partition_for(key.as_bytes(), 4)),
        );
        assert!(
            raw.headers.get("Nats-Msg-Id").is_some(),
            "message id header"
        );
    }
}

#[tokio::test]
async fn a_missing_stream_is_refused_at_start_with_the_fix_and_retried_by_the_relay() {
    let topic = Topic::new("missing");
    let client = connect(&section()).await.expect("connect");
    let e = check_streams(
        &client,
        &BTreeSet::from([topic.name.clone()]),
        None,
        Duration::from_secs(120),
    )
    .await
    .expect_err("no stream")
    .to_string();
    assert!(
        e.contains(&stream_name(&topic.name))
            && e.contains(&format!("{}.*", topic.name))
            && e.contains("[transport.topics] create = true"),
        "{e}"
    );
    // A stream deleted while outboxd runs: the publish is retryable and
    // names the topic, so the relay keeps the event and tries again.
    let p = NatsPublisher::new(client.clone(), 4, Duration::from_secs(2));
    match p.publish(msg(&topic.name, "k", 1)).await {
        Err(e @ PublishError::TopicMissing { .. }) => {
            assert!(!e.is_permanent());
            assert!(e.to_string().contains(&topic.name), "{e}");
        }
        other => panic!("expected a missing-stream error, got {other:?}"),
    }
    // Two topics that map to one stream are refused, naming both.
    let e = check_streams(
        &client,
        &BTreeSet::from(["a.b".to_string(), "a_b".to_string()]),
        Some(1),
        Duration::from_secs(120),
    )
    .await
    .expect_err("collision")
    .to_string();
    assert!(e.contains("`a.b`") && e.contains("`a_b`"), "{e}");
}

fn consumer(
    t: &TestDb,
    topic: &Topic,
    group: &str,
    lease: Duration,
) -> impl std::future::Future<Output = NatsConsumer> {
    let db = t.db.clone();
    let topic = topic.name.clone();
    let group = group.to_string();
    async move {
        let client = connect(&section()).await.expect("connect");
        NatsConsumer::new(
            db,
            client,
            NatsConsumerConfig {
                group,
                topics: vec![topic],
                partitions: 4,
                lease,
                ack_wait: Duration::from_secs(30),
                fetch_wait: Duration::from_millis(100),
                batch: 100,
            },
        )
    }
}

fn n_of(d: &outboxd::message::Delivery) -> u64 {
    serde_json::from_slice::<serde_json::Value>(&d.payload).expect("json")["n"]
        .as_u64()
        .expect("n")
}

async fn fetch_all(c: &mut NatsConsumer, want: usize) -> Vec<outboxd::message::Delivery> {
    eventually(
        Duration::from_secs(20),
        format!("{want} messages fetched"),
        async || {
            let got = c.fetch(1000).await.expect("fetch");
            if got.len() >= want {
                Ok(got)
            } else {
                Err(format!("{} fetched", got.len()))
            }
        },
    )
    .await
}

async fn per_key_order_and_commit_only_after_handling(t: TestDb) {
    let topic = Topic::new("order");
    let p = publisher(&topic, 4).await;
    for n in 0..40 {
        p.publish(msg(&topic.name, &format!("k{}", n % 5), n as usize))
            .await
            .expect("publish");
    }
    let client = connect(&section()).await.expect("connect");
    let topics = [topic.name.clone()];
    assert_eq!(
        outboxd::broker::nats::messages_behind(&client, "g", &topics, 4).await,
        Ok(40),
        "nothing read yet: the group is 40 behind"
    );
    let mut c = consumer(&t, &topic, "g", Duration::from_secs(15)).await;
    let batch = fetch_all(&mut c, 40).await;
    assert_eq!(batch.len(), 40);
    for k in 0..5 {
        let key = format!("k{k}").into_bytes();
        let ns: Vec<u64> = batch
            .iter()
            .filter(|d| d.key.as_deref() == Some(&key[..]))
            .map(n_of)
            .collect();
        assert_eq!(ns.len(), 8, "key k{k}");
        assert!(
            ns.windows(2).all(|w| w[0] < w[1]),
            "key k{k} out of order: {ns:?}"
        );
        assert!(
            batch
                .iter()
                .filter(|d| d.key.as_deref() == Some(&key[..]))
                .all(|d| d.partition == partition_for(&key, 4))
        );
    }
    // Nothing committed: a refetch hands out the same messages again.
    let again = c.fetch(1000).await.expect("refetch");
    assert_eq!(again.len(), 40);
    // Commit the first message of one partition only.
    let first = batch[0].clone();
    c.commit(&first).await.expect("commit");
    let after = c.fetch(1000).await.expect("fetch after commit");
    assert_eq!(after.len(), 39);
    assert!(
        !after
            .iter()
            .any(|d| d.partition == first.partition && d.offset <= first.offset)
    );
    eventually(
        Duration::from_secs(5),
        "39 behind after one ack",
        async || match outboxd::broker::nats::messages_behind(&client, "g", &topics, 4).await {
            Ok(39) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    c.release().await.expect("release");
}
on_both!(per_key_order_and_commit_only_after_handling);

/// A member that dies holding partitions: after its lease, another member
/// takes them and resumes just after the last committed message, in order,
/// without waiting for JetStream's ack_wait.
async fn a_dead_members_partitions_resume_from_the_cursor(t: TestDb) {
    let topic = Topic::new("takeover");
    let p = publisher(&topic, 4).await;
    for n in 0..20 {
        p.publish(msg(&topic.name, &format!("k{}", n % 4), n as usize))
            .await
            .expect("publish");
    }
    let lease = Duration::from_millis(900);
    let mut a = consumer(&t, &topic, "g", lease).await;
    let batch = fetch_all(&mut a, 20).await;
    // `a` handles and commits the first message of each partition, then
    // dies without releasing its leases.
    let mut committed = std::collections::BTreeMap::new();
    for d in &batch {
        if let std::collections::btree_map::Entry::Vacant(first) = committed.entry(d.partition) {
            a.commit(d).await.expect("commit");
            first.insert(n_of(d));
        }
    }
    drop(a);
    let mut b = consumer(&t, &topic, "g", lease).await;
    let rest = fetch_all(&mut b, 16).await;
    assert_eq!(rest.len(), 16, "everything after the cursors, once");
    for (partition, first) in &committed {
        let ns: Vec<u64> = rest
            .iter()
            .filter(|d| d.partition == *partition)
            .map(n_of)
            .collect();
        assert!(
            ns.iter().all(|n| n > first),
            "partition {partition}: {ns:?} after {first}"
        );
        assert!(
            ns.windows(2).all(|w| w[0] < w[1]),
            "partition {partition} in order: {ns:?}"
        );
    }
    b.release().await.expect("release");
}
on_both!(a_dead_members_partitions_resume_from_the_cursor);

/// A nats-server of this test's own, with a user and password, on a free
/// port; stopped when the test ends.
struct OwnServer {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl OwnServer {
    async fn start(user: &str, password: &str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("free port")
            .local_addr()
            .expect("addr")
            .port();
        let dir = tempfile::tempdir().expect("tempdir");
        let child = std::process::Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir.path())
            .args(["--user", user, "--pass", password])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nats-server (Debian's nats-server package) starts");
        eventually(
            Duration::from_secs(10),
            "nats-server listening",
            async || {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .map(|_| ())
            },
        )
        .await;
        Self {
            child,
            port,
            _dir: dir,
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn wrong_credentials_and_an_unreachable_server_say_what_to_fix_and_show_no_secret() {
    let server = OwnServer::start("outboxd", "right-secret-1").await;
    let url = format!("nats://127.0.0.1:{}", server.port);
    let mut s = NatsSection {
        url: url.clone(),
        user: Some("outboxd".into()),
        password: Some(outboxd::config::NatsSecret("wrong-secret-2".into())),
        ..NatsSection::default()
    };
    let e = connect(&s).await.expect_err("refused");
    let text = e.to_string();
    assert!(
        text.contains(&url)
            && text.contains("refused the credentials")
            && text.contains("password_env"),
        "{text}"
    );
    assert!(
        !text.contains("wrong-secret-2") && !text.contains("right-secret-1"),
        "{text}"
    );
    assert!(!e.is_transient(), "a refused login is not retried");
    s.password = Some(outboxd::config::NatsSecret("right-secret-1".into()));
    connect(&s).await.expect("the right password connects");
    drop(server);
    // Nothing listens there any more: worth another try at start.
    let e = connect(&s).await.expect_err("unreachable");
    assert!(e.is_transient(), "{e}");
    assert!(e.to_string().contains("transport.nats.url"), "{e}");
}
