//! Kafka group membership that survives restarts: group members use the
//! cooperative-sticky assignor, so a member joining moves only the
//! partitions that change owner, and with an instance id (static
//! membership) a member that restarts takes its partitions back without a
//! rebalance. A member fenced by another process with the same instance id
//! stops and says so. The first two run on the shared tansu; fencing on
//! librdkafka's mock cluster (tansu 0.6.0 never fences a static member: a
//! second process with the same id takes over the first one's member id).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use outboxd::broker::kafka::{KafkaConsumer, KafkaConsumerConfig};
use outboxd::broker::{ConsumeError, MessageSource};
use outboxd::consumer::runner::ConsumerError;
use outboxd::consumer::{Consumer, ConsumerConfig};
use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

use crate::support::kafka::{Accept, bootstrap, create_topic, produce, props, unique};
use crate::support::{TestDb, eventually};

fn member(bootstrap: &str, group: &str, topic: &str, instance: Option<&str>) -> KafkaConsumer {
    let mut cfg = KafkaConsumerConfig::new(group, vec![topic.to_string()]);
    cfg.instance_id = instance.map(str::to_string);
    cfg.fetch_wait = Duration::from_millis(100);
    cfg.stall_timeout = None;
    let mut p = props(bootstrap);
    p.insert("session.timeout.ms".into(), "10000".into());
    p.insert("heartbeat.interval.ms".into(), "500".into());
    KafkaConsumer::new(&p, cfg).expect("member")
}

/// Fetches from every member and commits what came, recording each
/// `(partition, offset)` handled, until `done` holds (within 60 s).
async fn drive(
    members: &mut [&mut KafkaConsumer],
    handled: &mut BTreeMap<(i32, i64), usize>,
    what: &str,
    done: impl Fn(&[&mut KafkaConsumer], &BTreeMap<(i32, i64), usize>) -> bool,
) {
    eventually(Duration::from_secs(60), what, async || {
        if done(members, handled) {
            return Ok(());
        }
        let seen = format!(
            "assignments {:?}, {} handled",
            members.iter().map(|m| m.assignment()).collect::<Vec<_>>(),
            handled.len()
        );
        for m in members.iter_mut() {
            let batch = m.fetch(10).await.expect("fetch");
            // Each partition's messages are handled, then committed
            // through the last one.
            let mut lasts = BTreeMap::new();
            for d in batch {
                *handled.entry((d.partition, d.offset)).or_default() += 1;
                lasts.insert(d.partition, d);
            }
            for d in lasts.values() {
                // A partition revoked in between is the new owner's.
                let _ = m.commit(d).await;
            }
        }
        Err(seen)
    })
    .await
}

fn sizes(members: &[&mut KafkaConsumer]) -> Vec<usize> {
    members.iter().map(|m| m.assignment().len()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_joining_moves_only_the_partitions_that_change_owner() {
    let bootstrap = bootstrap();
    let topic = unique("coop");
    create_topic(&bootstrap, &topic, 4).await;
    produce(
        &bootstrap,
        &topic,
        &["a", "b", "c", "d", "e", "f", "g", "h"],
        5,
    )
    .await;
    let group = unique("coop-group");
    let mut first = member(&bootstrap, &group, &topic, None);
    let mut handled = BTreeMap::new();
    drive(
        &mut [&mut first],
        &mut handled,
        "the first member to hold all 4",
        |m, h| sizes(m) == [4] && !h.is_empty(),
    )
    .await;
    assert!(
        first.rebalances_incrementally(),
        "group members use the cooperative-sticky assignor by default"
    );
    assert_eq!(first.partitions_revoked(), 0);

    let mut second = member(&bootstrap, &group, &topic, None);
    drive(
        &mut [&mut first, &mut second],
        &mut handled,
        "the partitions to be shared and every message handled",
        |m, h| sizes(m) == [2, 2] && h.len() == 40,
    )
    .await;
    assert_eq!(
        first.partitions_revoked(),
        2,
        "the first member gave up only the two partitions the second one took, \
         and kept consuming the others through the rebalance"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_static_member_that_restarts_takes_its_partitions_back_without_a_rebalance() {
    let bootstrap = bootstrap();
    let topic = unique("static");
    create_topic(&bootstrap, &topic, 4).await;
    produce(
        &bootstrap,
        &topic,
        &["a", "b", "c", "d", "e", "f", "g", "h"],
        5,
    )
    .await;
    let group = unique("static-group");
    let (id_a, id_b) = (unique("a"), unique("b"));
    let mut a = member(&bootstrap, &group, &topic, Some(&id_a));
    let mut b = member(&bootstrap, &group, &topic, Some(&id_b));
    let mut handled = BTreeMap::new();
    drive(
        &mut [&mut a, &mut b],
        &mut handled,
        "two static members to share the partitions",
        |m, _| sizes(m) == [2, 2],
    )
    .await;
    let held_by_a = a.assignment();
    let revoked_from_b = b.partitions_revoked();

    // A crash: the client goes without leaving the group (a static member
    // never sends LeaveGroup), and the process starts again with its id.
    drop(tokio::task::spawn_blocking(move || drop(a)).await);
    let mut again = member(&bootstrap, &group, &topic, Some(&id_a));
    drive(
        &mut [&mut again, &mut b],
        &mut handled,
        "the restarted member to hold its partitions again and every message handled",
        |m, h| m[0].assignment() == held_by_a && h.len() == 40,
    )
    .await;
    assert_eq!(
        b.partitions_revoked(),
        revoked_from_b,
        "the other member lost nothing while the first one restarted"
    );
    assert_eq!(b.assignment().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fenced_static_member_stops_and_names_its_instance_id() {
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic("orders", 2, 1).expect("topic");
    let bootstrap = mock.bootstrap_servers();
    let mut fenced = member(&bootstrap, "billing", "orders", Some("billing-7"));
    eventually(Duration::from_secs(30), "no assignment", async || {
        if !fenced.assignment().is_empty() {
            return true;
        }
        fenced.fetch(10).await.expect("fetch");
        false
    })
    .await;
    // The coordinator's answer when another process joined with the same
    // group.instance.id.
    mock.request_errors(
        RDKafkaApiKey::Heartbeat,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID; 5],
    );
    let t = TestDb::sqlite().await;
    let mut runner = Consumer::new(
        t.db.clone(),
        fenced,
        Arc::new(Accept),
        ConsumerConfig {
            name: "billing".into(),
            ..ConsumerConfig::default()
        },
    );
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    let outcome = match tokio::time::timeout(Duration::from_secs(30), runner.run(stop_rx)).await {
        Ok(outcome) => outcome,
        Err(_) => {
            // Closing a client the mock keeps refusing can block for
            // minutes: the failure is reported without waiting for it.
            std::mem::forget(runner);
            panic!("a fenced consumer stops instead of retrying");
        }
    };
    let Err(ConsumerError::Source(ConsumeError::Fatal(message))) = outcome else {
        panic!("expected a fatal transport error, got {outcome:?}");
    };
    assert!(
        message.contains("fenced")
            && message.contains("billing-7")
            && message.contains("OUTBOXD_INSTANCE_ID"),
        "{message}"
    );
}
