use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use outboxd::broker::embedded::partition_for;
use outboxd::broker::redis::{
    Connection, RedisConsumer, RedisConsumerConfig, RedisPublisher, check_streams, client,
    messages_behind, start,
};
use outboxd::broker::{MessageSource, PublishError, Publisher};
use outboxd::config::redis::stream_key;
use outboxd::config::{RedisSection, RedisUrl};
use outboxd::message::Delivery;

use crate::support::brokers::{Cleanup, redis_url};
use crate::support::publisher::msg;
use crate::support::{TestDb, eventually, on_both};

fn section() -> RedisSection {
    RedisSection {
        url: RedisUrl(redis_url()),
        fetch_wait: Duration::from_millis(100),
        ..RedisSection::default()
    }
}

/// An entry's fields as XRANGE returns them.
type Fields = Vec<(Vec<u8>, Vec<u8>)>;
/// XPENDING's summary: the count, the lowest and highest ids, and the
/// count per consumer.
type PendingSummary = (
    i64,
    Option<String>,
    Option<String>,
    Option<Vec<(String, String)>>,
);

/// A topic of this test's own; its partition streams are deleted when the
/// test ends, passed or failed.
fn own_topic(prefix: &str) -> (String, Cleanup) {
    let name = format!("t.{prefix}.{}", uuid::Uuid::new_v4().simple());
    let cleanup = Cleanup::redis(&redis_url(), &name);
    (name, cleanup)
}

async fn conn() -> Connection {
    client(&section())
        .expect("client")
        .connect(Duration::from_secs(5))
        .await
        .expect("the machine's redis-server answers (start it: redis-server --daemonize yes)")
}

async fn publisher(topic: &str, maxlen: u64) -> RedisPublisher {
    let c = start(&section(), &BTreeSet::from([topic.to_string()]), 4, true)
        .await
        .expect("streams created");
    RedisPublisher::new(&c, 4, maxlen, Duration::from_secs(5))
        .await
        .expect("publisher")
}

/// A raw command's reply on the machine's server.
async fn raw<T: ::redis::FromRedisValue>(cmd: &mut ::redis::Cmd) -> T {
    cmd.query_async(&mut conn().await)
        .await
        .expect("redis command")
}

#[tokio::test]
async fn publish_appends_to_the_keys_partition_stream_with_its_fields_and_a_capped_length() {
    let (topic, _cleanup) = own_topic("pub");
    let p = publisher(&topic, 1_000_000).await;
    for n in 0..40 {
        p.publish(msg(&topic, &format!("k{}", n % 5), n))
            .await
            .expect("acknowledged");
    }
    let mut total = 0;
    for partition in 0..4 {
        let stream = stream_key(&topic, partition);
        let entries: Vec<(String, Fields)> =
            raw(::redis::cmd("XRANGE").arg(&stream).arg("-").arg("+")).await;
        total += entries.len();
        for (_, fields) in entries {
            let field = |name: &str| {
                fields
                    .iter()
                    .find(|(k, _)| k == name.as_bytes())
                    .map(|(_, v)| v.clone())
                    .unwrap_or_else(|| panic!("field `{name}` in {fields:?}"))
            };
            assert_eq!(partition_for(&field("key"), 4), partition, "{stream}");
            let id = String::from_utf8(field("id")).expect("utf-8");
            uuid::Uuid::parse_str(&id).expect("the message id");
            assert!(field("payload").starts_with(b"{\"n\":"));
            field("h:message-id");
        }
    }
    assert_eq!(total, 40, "every message once");
    // MAXLEN ~: the stream keeps about maxlen entries, never all of them.
    let (capped, _cleanup) = own_topic("cap");
    let p = publisher(&capped, 100).await;
    for n in 0..1000 {
        p.publish(msg(&capped, "one-key", n))
            .await
            .expect("acknowledged");
    }
    let len: usize =
        raw(::redis::cmd("XLEN").arg(stream_key(&capped, partition_for(b"one-key", 4)))).await;
    assert!(
        (100..1000).contains(&len),
        "{len} entries kept of 1000 with maxlen 100"
    );
}

#[tokio::test]
async fn bad_streams_are_refused_at_start_naming_the_stream_and_the_fix() {
    let (missing, _c1) = own_topic("missing");
    let mut c = conn().await;
    let e = check_streams(&mut c, &BTreeSet::from([missing.clone()]), 4, false)
        .await
        .expect_err("no stream")
        .to_string();
    assert!(
        e.contains(&format!("`{missing}:0`")) && e.contains("[transport.topics] create = true"),
        "{e}"
    );
    // A stream deleted while outboxd runs: the publish is retryable and
    // names the topic, so the relay keeps the event and tries again.
    let p = RedisPublisher::new(
        &client(&section()).expect("client"),
        4,
        1000,
        Duration::from_secs(2),
    )
    .await
    .expect("publisher");
    match p.publish(msg(&missing, "k", 1)).await {
        Err(e @ PublishError::TopicMissing { .. }) => {
            assert!(!e.is_permanent());
            assert!(e.to_string().contains(&missing), "{e}");
        }
        other => panic!("expected a missing-stream error, got {other:?}"),
    }
    // Entries outboxd did not write.
    let (foreign, _c2) = own_topic("foreign");
    let _: String = raw(::redis::cmd("XADD")
        .arg(stream_key(&foreign, 2))
        .arg("*")
        .arg("temp")
        .arg("21"))
    .await;
    let e = check_streams(&mut c, &BTreeSet::from([foreign.clone()]), 4, true)
        .await
        .expect_err("foreign entries")
        .to_string();
    assert!(
        e.contains(&format!("`{foreign}:2`"))
            && e.contains("did not write")
            && e.contains("`payload`")
            && e.contains("rename the topic"),
        "{e}"
    );
    // A key of another type.
    let (other, _c3) = own_topic("other");
    let _: () = raw(::redis::cmd("SET").arg(stream_key(&other, 0)).arg("x")).await;
    let e = check_streams(&mut c, &BTreeSet::from([other.clone()]), 4, true)
        .await
        .expect_err("a string key")
        .to_string();
    assert!(
        e.contains("is a string, not a stream") && e.contains(&format!("`{other}:0`")),
        "{e}"
    );
    // create = true makes the missing streams, empty, and checks pass after.
    check_streams(&mut c, &BTreeSet::from([missing.clone()]), 4, true)
        .await
        .expect("created");
    let len: usize = raw(::redis::cmd("XLEN").arg(stream_key(&missing, 3))).await;
    assert_eq!(len, 0);
    check_streams(&mut c, &BTreeSet::from([missing]), 4, false)
        .await
        .expect("present now");
}

#[tokio::test]
async fn a_wrong_scheme_is_a_config_error_naming_the_key_and_the_fix_without_the_password() {
    let text = "[transport]\nkind = \"redis\"\n[transport.redis]\nurl = \"http://app:pw-secret-3@cache:6379\"\n";
    let e = outboxd::config::Config::from_toml("t.toml", text, Vec::new())
        .expect_err("wrong scheme")
        .to_string();
    assert!(
        e.contains("transport.redis.url")
            && e.contains("redis://host:6379")
            && e.contains("rediss://"),
        "{e}"
    );
    assert!(!e.contains("pw-secret-3"), "{e}");
    // The URL's password never shows in a client's Debug or an error.
    let s = RedisSection {
        url: RedisUrl("redis://app:pw-secret-3@127.0.0.1:1".into()),
        ..RedisSection::default()
    };
    let c = client(&s).expect("client");
    assert!(
        !format!("{c:?} {}", c.url()).contains("pw-secret-3"),
        "{c:?}"
    );
    assert!(format!("{s:?}").contains("app:***@"), "{s:?}");
    let e = c
        .connect(Duration::from_secs(2))
        .await
        .expect_err("nothing listens on port 1");
    assert!(
        e.is_transient(),
        "an unreachable server is retried at start: {e}"
    );
    let text = e.to_string();
    assert!(
        text.contains("transport.redis.url") && text.contains("Redis"),
        "{text}"
    );
    assert!(!text.contains("pw-secret-3"), "{text}");
}

fn consumer(t: &TestDb, topic: &str, group: &str, lease: Duration) -> RedisConsumer {
    RedisConsumer::new(
        t.db.clone(),
        client(&section()).expect("client"),
        RedisConsumerConfig {
            group: group.into(),
            topics: vec![topic.into()],
            partitions: 4,
            lease,
            fetch_wait: Duration::from_millis(100),
            batch: 100,
        },
    )
}

fn n_of(d: &Delivery) -> u64 {
    serde_json::from_slice::<serde_json::Value>(&d.payload).expect("json")["n"]
        .as_u64()
        .expect("n")
}

async fn fetch_all(c: &mut RedisConsumer, want: usize) -> Vec<Delivery> {
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

async fn per_key_order_and_ack_only_after_the_commit(t: TestDb) {
    let (topic, _cleanup) = own_topic("order");
    let p = publisher(&topic, 1_000_000).await;
    for n in 0..40 {
        p.publish(msg(&topic, &format!("k{}", n % 5), n))
            .await
            .expect("publish");
    }
    let mut lag = conn().await;
    let topics = [topic.clone()];
    assert_eq!(
        messages_behind(&mut lag, "g", &topics, 4).await,
        Ok(40),
        "nothing read yet: the group is 40 behind"
    );
    let mut c = consumer(&t, &topic, "g", Duration::from_secs(15));
    let batch = fetch_all(&mut c, 40).await;
    assert_eq!(batch.len(), 40);
    for k in 0..5 {
        let key = format!("k{k}").into_bytes();
        let of_key: Vec<&Delivery> = batch
            .iter()
            .filter(|d| d.key.as_deref() == Some(&key[..]))
            .collect();
        let ns: Vec<u64> = of_key.iter().map(|d| n_of(d)).collect();
        assert_eq!(ns.len(), 8, "key k{k}");
        assert!(
            ns.windows(2).all(|w| w[0] < w[1]),
            "key k{k} out of order: {ns:?}"
        );
        assert!(of_key.iter().all(|d| d.partition == partition_for(&key, 4)));
        assert!(of_key.windows(2).all(|w| w[0].offset < w[1].offset));
        assert!(of_key.iter().all(|d| d.message_id().is_ok()));
    }
    // Read, not acknowledged: the group still counts all 40.
    assert_eq!(messages_behind(&mut lag, "g", &topics, 4).await, Ok(40));
    // Nothing committed: a refetch hands out the same messages again.
    let again = c.fetch(1000).await.expect("refetch");
    assert_eq!(again, batch);
    let first = batch[0].clone();
    c.commit(&first).await.expect("commit");
    let after = c.fetch(1000).await.expect("fetch after commit");
    assert_eq!(after.len(), 39);
    assert!(
        !after
            .iter()
            .any(|d| d.partition == first.partition && d.offset <= first.offset)
    );
    assert_eq!(
        messages_behind(&mut lag, "g", &topics, 4).await,
        Ok(39),
        "the commit acknowledged one entry"
    );
    c.release().await.expect("release");
}
on_both!(per_key_order_and_ack_only_after_the_commit);

/// Two members of one group, each handling and committing what it fetches:
/// the partitions are split between them, every message is handled once,
/// and each key's messages in order.
async fn two_members_share_the_partitions_in_per_key_order(t: TestDb) {
    let (topic, _cleanup) = own_topic("two");
    let p = publisher(&topic, 1_000_000).await;
    let lease = Duration::from_secs(3);
    let mut a = consumer(&t, &topic, "g", lease);
    let mut b = consumer(&t, &topic, "g", lease);
    // Both join before anything is published, so each takes its share.
    eventually(
        Duration::from_secs(20),
        "each member owns two partitions",
        async || {
            a.fetch(0).await.expect("a");
            b.fetch(0).await.expect("b");
            let (x, y) = (a.assignment().len(), b.assignment().len());
            if (x, y) == (2, 2) {
                Ok(())
            } else {
                Err(format!("{x} and {y}"))
            }
        },
    )
    .await;
    for n in 0..80 {
        p.publish(msg(&topic, &format!("k{}", n % 8), n))
            .await
            .expect("publish");
    }
    let mut handled: Vec<Delivery> = Vec::new();
    eventually(Duration::from_secs(30), "80 handled", async || {
        for c in [&mut a, &mut b] {
            let got = c.fetch(1000).await.expect("fetch");
            let mut last = BTreeMap::new();
            for d in got {
                last.insert(d.partition, d.clone());
                handled.push(d);
            }
            c.commit_all(last.into_values().collect())
                .await
                .expect("commit");
        }
        if handled.len() >= 80 {
            Ok(())
        } else {
            Err(format!("{}", handled.len()))
        }
    })
    .await;
    let ns: BTreeSet<u64> = handled.iter().map(n_of).collect();
    assert_eq!(
        (handled.len(), ns.len()),
        (80, 80),
        "each message handled once"
    );
    for k in 0..8 {
        let key = format!("k{k}").into_bytes();
        let order: Vec<u64> = handled
            .iter()
            .filter(|d| d.key.as_deref() == Some(&key[..]))
            .map(n_of)
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "key k{k}: {order:?}");
    }
    assert_eq!(
        messages_behind(&mut conn().await, "g", &[topic], 4).await,
        Ok(0)
    );
    a.release().await.expect("release");
    b.release().await.expect("release");
}
on_both!(two_members_share_the_partitions_in_per_key_order);

/// A member that dies holding partitions and unacknowledged entries: after
/// its lease another member takes the partitions, claims the dead one's
/// pending entries (XAUTOCLAIM) and handles everything after the cursors
/// once, in order; at the end nothing is pending.
async fn a_dead_members_pending_entries_go_to_the_next_owner_in_order(t: TestDb) {
    let (topic, _cleanup) = own_topic("takeover");
    let p = publisher(&topic, 1_000_000).await;
    for n in 0..20 {
        p.publish(msg(&topic, &format!("k{}", n % 4), n))
            .await
            .expect("publish");
    }
    let lease = Duration::from_millis(900);
    let mut a = consumer(&t, &topic, "g", lease);
    let batch = fetch_all(&mut a, 20).await;
    // `a` commits the first message of each partition, then dies without
    // releasing its leases: the other 16 are its pending entries.
    let mut committed = BTreeMap::new();
    for d in &batch {
        if let std::collections::btree_map::Entry::Vacant(first) = committed.entry(d.partition) {
            a.commit(d).await.expect("commit");
            first.insert(n_of(d));
        }
    }
    drop(a);
    let pending = |stream: String| async move {
        let summary: PendingSummary = raw(::redis::cmd("XPENDING").arg(stream).arg("g")).await;
        summary.0
    };
    let mut dead_pending = 0;
    for partition in 0..4 {
        dead_pending += pending(stream_key(&topic, partition)).await;
    }
    assert_eq!(dead_pending, 16, "the dead member's unacknowledged entries");
    let mut b = consumer(&t, &topic, "g", lease);
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
    let mut last = BTreeMap::new();
    for d in &rest {
        last.insert(d.partition, d.clone());
    }
    b.commit_all(last.into_values().collect())
        .await
        .expect("commit");
    for partition in 0..4 {
        assert_eq!(
            pending(stream_key(&topic, partition)).await,
            0,
            "partition {partition}"
        );
    }
    assert!(
        b.fetch(1000).await.expect("fetch").is_empty(),
        "nothing comes twice"
    );
    b.release().await.expect("release");
}
on_both!(a_dead_members_pending_entries_go_to_the_next_owner_in_order);
