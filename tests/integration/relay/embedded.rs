//! The embedded transport's delivery semantics: per-key order, cursors
//! advanced only by commit, redelivery after a crash, lease takeover.

use std::time::Duration;

use outboxd::broker::MessageSource;
use outboxd::broker::Publisher;
use outboxd::broker::embedded::{
    EmbeddedConsumer, EmbeddedConsumerConfig, EmbeddedPublisher, partition_for,
};

use crate::support::publisher::msg;
use crate::support::{TestDb, eventually, on_both};

fn consumer(t: &TestDb, group: &str, lease: Duration) -> EmbeddedConsumer {
    EmbeddedConsumer::new(
        t.db.clone(),
        EmbeddedConsumerConfig {
            group: group.into(),
            topics: vec!["t".into()],
            partitions: 4,
            lease,
        },
    )
}

async fn per_key_order_and_commit_only_after_handling(t: TestDb) {
    let p = EmbeddedPublisher::new(t.db.clone(), 4);
    for n in 0..40 {
        p.publish(msg("t", &format!("k{}", n % 5), n))
            .await
            .expect("publish");
    }
    let mut c = consumer(&t, "g", Duration::from_secs(15));
    let batch = c.fetch(1000).await.expect("fetch");
    assert_eq!(batch.len(), 40);
    for d in &batch {
        assert_eq!(
            d.partition,
            partition_for(d.key.as_deref().unwrap_or_default(), 4)
        );
    }
    // Per key, payload order is publish order.
    for k in 0..5 {
        let key = format!("k{k}").into_bytes();
        let ns: Vec<usize> = batch
            .iter()
            .filter(|d| d.key.as_deref() == Some(&key[..]))
            .map(|d| {
                serde_json::from_slice::<serde_json::Value>(&d.payload).expect("json")["n"]
                    .as_u64()
                    .expect("n") as usize
            })
            .collect();
        assert!(
            ns.windows(2).all(|w| w[0] < w[1]),
            "key k{k} out of order: {ns:?}"
        );
    }
    // Nothing committed yet: a refetch returns everything again.
    assert_eq!(c.fetch(1000).await.expect("refetch").len(), 40);
    // Commit the first message of one partition only.
    let first = batch[0].clone();
    c.commit(&first).await.expect("commit");
    let again = c.fetch(1000).await.expect("fetch after commit");
    assert_eq!(again.len(), 39);
    assert!(
        !again
            .iter()
            .any(|d| d.partition == first.partition && d.offset <= first.offset)
    );
}
on_both!(per_key_order_and_commit_only_after_handling);

/// A backlog on one partition does not starve the others: a fetch gives
/// every partition with messages its share, and the consumer handles them
/// side by side. (It once filled the whole fetch from the lowest-numbered
/// partition, so under a backlog the others waited until it was empty.)
/// Postgres only: SQLite's fetch is one merge in global offset order,
/// oldest first, so a later message waits only behind older ones.
#[tokio::test]
async fn a_backlogged_partition_does_not_starve_the_others_on_postgres() {
    let t = TestDb::postgres().await;
    let p = EmbeddedPublisher::new(t.db.clone(), 4);
    let key_for = |part: i32| {
        (0..)
            .map(|i| format!("k{i}"))
            .find(|k| partition_for(k.as_bytes(), 4) == part)
            .expect("a key for each partition")
    };
    for n in 0..300 {
        p.publish(msg("t", &key_for(0), n)).await.expect("publish");
    }
    for part in 1..4 {
        p.publish(msg("t", &key_for(part), 1000 + part as usize))
            .await
            .expect("publish");
    }
    let mut c = consumer(&t, "g", Duration::from_secs(15));
    let batch = c.fetch(100).await.expect("fetch");
    assert!(batch.len() <= 100, "a fetch stays within its maximum");
    let partitions: std::collections::BTreeSet<i32> = batch.iter().map(|d| d.partition).collect();
    assert_eq!(
        partitions,
        (0..4).collect(),
        "every partition with messages is in the fetch, not only the backlogged one"
    );
    let first: Vec<i64> = batch
        .iter()
        .filter(|d| d.partition == 0)
        .map(|d| d.offset)
        .collect();
    assert!(
        first.len() >= 25 && first.windows(2).all(|w| w[0] < w[1]),
        "the backlogged partition gets its share, in offset order: {first:?}"
    );
}

async fn a_dead_members_partitions_are_taken_over_from_the_last_commit(t: TestDb) {
    let p = EmbeddedPublisher::new(t.db.clone(), 4);
    for n in 0..20 {
        p.publish(msg("t", &format!("k{n}"), n))
            .await
            .expect("publish");
    }
    let mut a = consumer(&t, "g", Duration::from_millis(300));
    let got = a.fetch(1000).await.expect("a fetch");
    assert_eq!(got.len(), 20);
    for d in &got[..5] {
        a.commit(d).await.expect("commit");
    }
    let committed: usize = 5;
    // `a` dies without releasing. `b` cannot take over until the lease expires.
    let mut b = consumer(&t, "g", Duration::from_millis(300));
    assert!(
        b.fetch(1000).await.expect("b fetch").is_empty(),
        "a still holds every lease"
    );
    let taken = eventually(
        Duration::from_secs(4),
        "b takes over once a's leases expire",
        async || {
            let taken = b.fetch(1000).await.expect("b fetch");
            (!taken.is_empty()).then_some(taken)
        },
    )
    .await;
    assert_eq!(
        taken.len(),
        20 - committed,
        "b resumes exactly after a's commits"
    );
    assert_eq!(b.assignment().len(), 4);
    // a's late commit is refused: it lost the lease, and b redelivers.
    assert!(a.commit(&got[10]).await.is_err());
}
on_both!(a_dead_members_partitions_are_taken_over_from_the_last_commit);

/// Members of a group share its partitions: each holds at most
/// ceil(partitions / live members). A member that joins a group whose
/// first member holds everything gets its share once that member renews
/// (it gives the rest back), and a member that leaves hands its share back.
/// (Each member used to take every free partition, so in a soak one
/// consumer process did all the work while the other waited.)
async fn members_share_a_groups_partitions(t: TestDb) {
    let lease = Duration::from_millis(1500);
    // Leases are renewed every third of the lease.
    let renewal = Duration::from_millis(600);
    let mut a = consumer(&t, "g", lease);
    a.fetch(10).await.expect("a fetch");
    assert_eq!(
        a.assignment().len(),
        4,
        "alone, a member takes every partition"
    );
    let mut b = consumer(&t, "g", lease);
    b.fetch(10).await.expect("b fetch");
    assert_eq!(b.assignment().len(), 0, "a's leases are still valid");
    tokio::time::sleep(renewal).await;
    a.fetch(10).await.expect("a renews");
    assert_eq!(a.assignment().len(), 2, "two members: a keeps its share");
    tokio::time::sleep(renewal).await;
    b.fetch(10).await.expect("b renews");
    assert_eq!(
        b.assignment().len(),
        2,
        "b takes the partitions a gave back"
    );
    let (mut both, pa) = (a.assignment(), b.assignment());
    both.extend(pa);
    both.sort();
    both.dedup();
    assert_eq!(both.len(), 4, "no partition is held twice");
    // b leaves: a takes everything back at its next renewal.
    b.release().await.expect("release");
    tokio::time::sleep(renewal).await;
    a.fetch(10).await.expect("a renews");
    assert_eq!(
        a.assignment().len(),
        4,
        "a member that left hands its share back"
    );
}
on_both!(members_share_a_groups_partitions);

async fn groups_are_independent(t: TestDb) {
    let p = EmbeddedPublisher::new(t.db.clone(), 4);
    for n in 0..3 {
        p.publish(msg("t", "k", n)).await.expect("publish");
    }
    let mut g1 = consumer(&t, "g1", Duration::from_secs(15));
    let mut g2 = consumer(&t, "g2", Duration::from_secs(15));
    let b1 = g1.fetch(100).await.expect("g1");
    for d in &b1 {
        g1.commit(d).await.expect("commit");
    }
    assert_eq!(g1.fetch(100).await.expect("g1 again").len(), 0);
    assert_eq!(g2.fetch(100).await.expect("g2").len(), 3);
}
on_both!(groups_are_independent);

/// On Postgres, messages published at the same moment (as the relay
/// publishes a batch) share one transaction: one commit, one WAL flush.
/// Every message is stored once, and a fetch sees them all in key order.
#[tokio::test(flavor = "current_thread")]
async fn concurrent_publishes_share_one_transaction_on_postgres() {
    let t = TestDb::postgres().await;
    let p = EmbeddedPublisher::new(t.db.clone(), 4);
    let msgs: Vec<_> = (0..20)
        .map(|n| msg("t", &format!("k{}", n % 5), n))
        .collect();
    let results = futures_util::future::join_all(msgs.into_iter().map(|m| p.publish(m))).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(t.count("SELECT count(*) FROM transport_messages").await, 20);
    assert_eq!(
        t.count("SELECT count(DISTINCT xmin::text) FROM transport_messages")
            .await,
        1,
        "one transaction for the 20 concurrent publishes"
    );
    // Published one at a time, each is its own transaction again.
    for n in 20..23 {
        p.publish(msg("t", "k0", n)).await.expect("publish");
    }
    assert_eq!(
        t.count("SELECT count(DISTINCT xmin::text) FROM transport_messages")
            .await,
        4
    );
    let mut c = consumer(&t, "g", Duration::from_secs(15));
    let batch = c.fetch(1000).await.expect("fetch");
    assert_eq!(batch.len(), 23);
    let k0: Vec<String> = batch
        .iter()
        .filter(|d| d.key.as_deref() == Some(b"k0".as_slice()))
        .map(|d| String::from_utf8_lossy(&d.payload).into_owned())
        .collect();
    assert_eq!(
        k0,
        ["0", "5", "10", "15", "20", "21", "22"].map(|n| format!("{{\"n\":{n}}}"))
    );
}

/// On Postgres a publish notifies at commit: an empty fetch that waits for
/// the notification returns the message as soon as it is committed, not
/// at the end of its (here 30 s) wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_fetch_wakes_on_a_publish_notification() {
    let t = TestDb::postgres().await;
    let outboxd::store::Db::Postgres(pool) = &t.db else {
        unreachable!("a postgres test database")
    };
    let wake =
        outboxd::store::backend::notify::listen(pool, outboxd::store::transport::NOTIFY_CHANNEL)
            .await
            .expect("listen");
    let mut c = consumer(&t, "g", Duration::from_secs(15)).with_wake(wake, Duration::from_secs(30));
    assert!(c.waits_for_messages());
    let publisher = EmbeddedPublisher::new(t.db.clone(), 4);
    let publishing = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        publisher.publish(msg("t", "k", 7)).await.expect("publish");
    });
    let started = std::time::Instant::now();
    let got = c.fetch(100).await.expect("fetch");
    let waited = started.elapsed();
    publishing.await.expect("publisher task");
    assert_eq!(got.len(), 1, "the message published during the wait");
    assert!(
        waited < Duration::from_secs(20),
        "woken by the notification, not by the end of the 30 s wait ({waited:?})"
    );
}
