//! Per-key parking (`consumers[].on_dead = "park_key"`): a message a
//! consumer dead-letters holds back the later messages of its key, in
//! order, while other keys (in the same partition) flow; a redrive or a
//! discard releases them, and they are applied exactly once, in order. On
//! Postgres and SQLite, with the embedded transport and with Kafka. The
//! same with processes and SIGKILLs is in `redrive_kills.rs`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use outboxd::broker::MessageSource;
use outboxd::broker::Publisher;
use outboxd::broker::embedded::{EmbeddedConsumer, EmbeddedConsumerConfig, EmbeddedPublisher};
use outboxd::broker::kafka::{KafkaConsumer, KafkaConsumerConfig, KafkaPublisher};
use outboxd::config::OnDead;
use outboxd::consumer::Consumer;
use outboxd::consumer::ConsumerConfig;
use outboxd::consumer::ConsumerStats;
use outboxd::message::OutgoingMessage;
use outboxd::message::headers;
use outboxd::ops::consumer_dead::{self, ConsumerDeadError, Target};

use crate::support::kafka::{bootstrap, create_topic, props, unique};
use crate::support::ledger::{Ledger, applied, create_applied};
use crate::support::{TestDb, eventually};

const CONSUMER: &str = "ledger";

fn msg(topic: &str, key: &str, seq: i64, poison: bool) -> OutgoingMessage {
    let id = uuid::Uuid::new_v4();
    OutgoingMessage {
        topic: topic.into(),
        key: key.as_bytes().to_vec(),
        payload: serde_json::json!({ "seq": seq, "poison": poison })
            .to_string()
            .into_bytes(),
        headers: vec![
            (headers::EVENT_TYPE.to_string(), b"ledger.entry".to_vec()),
            (headers::MESSAGE_ID.to_string(), id.to_string().into_bytes()),
        ],
        message_id: id,
        created_at: chrono::Utc::now(),
    }
}

async fn publish<P: Publisher>(p: &P, topic: &str, list: &[(&str, i64, bool)]) {
    for (key, seq, poison) in list {
        p.publish(msg(topic, key, *seq, *poison))
            .await
            .expect("publish");
    }
}

/// Steps the consumer until `done` holds (or fails after 60 s).
async fn step_until<S: MessageSource>(
    consumer: &mut Consumer<S, Ledger>,
    stats: &ConsumerStats,
    what: &str,
    done: impl Fn(&ConsumerStats) -> bool,
) {
    eventually(Duration::from_secs(60), what, async || {
        if done(stats) {
            return Ok(());
        }
        consumer.step().await.expect("step");
        Err(format!(
            "handled {}, parked {}, dead {}, redriven {}",
            stats.handled.load(Ordering::SeqCst),
            stats.parked.load(Ordering::SeqCst),
            stats.dead_lettered.load(Ordering::SeqCst),
            stats.redriven.load(Ordering::SeqCst)
        ))
    })
    .await
}

fn n(c: &std::sync::atomic::AtomicU64) -> u64 {
    c.load(Ordering::SeqCst)
}

async fn a_dead_letter_parks_its_key_until_redriven<S: MessageSource, P: Publisher>(
    t: TestDb,
    topic: &str,
    source: S,
    publisher: P,
) {
    create_applied(&t).await;
    let handler = Arc::new(Ledger::default());
    let config = ConsumerConfig {
        name: CONSUMER.into(),
        max_attempts: 2,
        handler_id: "builtin:ledger".into(),
        on_dead: OnDead::ParkKey,
        parking_check: Duration::from_millis(50),
        retry_delay: Duration::from_millis(20),
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::new(t.db.clone(), source, handler.clone(), config);
    let stats = consumer.stats();

    // One partition: keys a, b and c interleave in it.
    publish(
        &publisher,
        topic,
        &[
            ("a", 1, false),
            ("a", 2, true),
            ("b", 1, false),
            ("a", 3, false),
            ("c", 1, true),
            ("b", 2, false),
            ("a", 4, false),
            ("c", 2, false),
            ("b", 3, false),
        ],
    )
    .await;
    step_until(&mut consumer, &stats, "a and c parked, b flowing", |s| {
        n(&s.handled) == 4 && n(&s.parked) == 3 && n(&s.dead_lettered) == 2
    })
    .await;
    assert_eq!(applied(&t, "a").await, [1], "a2 is dead, a3 and a4 wait");
    assert_eq!(applied(&t, "b").await, [1, 2, 3], "other keys flow");
    assert_eq!(applied(&t, "c").await, Vec::<i64>::new());

    let rows = consumer_dead::list(&t.db, CONSUMER, None, 100)
        .await
        .expect("list");
    let states: Vec<(String, String)> = rows
        .iter()
        .map(|r| (r.key.as_str().unwrap_or("").to_string(), r.state.clone()))
        .collect();
    assert_eq!(
        states,
        [
            ("a".to_string(), "dead".to_string()),
            ("a".into(), "parked".into()),
            ("c".into(), "dead".into()),
            ("a".into(), "parked".into()),
            ("c".into(), "parked".into()),
        ]
    );
    let a_dead = rows[0].id;
    let c_dead = rows[2].id;
    // A parked message is not an operator's to redrive alone.
    match consumer_dead::redrive(
        &t.db,
        CONSUMER,
        &Target::Id(rows[1].id),
        None,
        &Default::default(),
    )
    .await
    {
        Err(ConsumerDeadError::Parked { behind, .. }) => assert_eq!(behind, a_dead),
        other => panic!("a parked row refused, naming its dead letter: {other:?}"),
    }
    let summary = consumer_dead::summary(&t.db).await.expect("summary");
    assert_eq!(summary.len(), 1);
    assert_eq!(
        (
            summary[0].dead,
            summary[0].parked_keys,
            summary[0].parked_messages
        ),
        (2, 2, 3)
    );

    // Later messages of a parked key keep parking, in order; others flow.
    publish(&publisher, topic, &[("a", 5, false), ("b", 4, false)]).await;
    step_until(&mut consumer, &stats, "a5 parked, b4 handled", |s| {
        n(&s.handled) == 5 && n(&s.parked) == 4
    })
    .await;
    assert_eq!(applied(&t, "a").await, [1]);
    assert_eq!(applied(&t, "b").await, [1, 2, 3, 4]);

    // The fix, then the redrive: a2, a3, a4, a5 applied once, in order.
    handler.fixed.store(true, Ordering::SeqCst);
    let released = consumer_dead::redrive(
        &t.db,
        CONSUMER,
        &Target::Key("a".into()),
        None,
        &Default::default(),
    )
    .await
    .expect("redrive");
    assert_eq!(released, 1, "the dead letter; the parked ones follow it");
    step_until(&mut consumer, &stats, "key a released", |s| {
        n(&s.redriven) == 4
    })
    .await;
    assert_eq!(applied(&t, "a").await, [1, 2, 3, 4, 5]);
    // The key flows again: a6 is handled live.
    publish(&publisher, topic, &[("a", 6, false)]).await;
    step_until(&mut consumer, &stats, "a6 handled live", |s| {
        n(&s.handled) == 10
    })
    .await;
    assert_eq!(applied(&t, "a").await, [1, 2, 3, 4, 5, 6]);
    assert_eq!(n(&stats.parked), 4);

    // A discard: c1 is never applied, c2 runs after it.
    let discarded = consumer_dead::discard(
        &t.db,
        CONSUMER,
        c_dead,
        "customer c was deleted",
        chrono::Utc::now(),
    )
    .await
    .expect("discard");
    assert_eq!(discarded.released, 1);
    step_until(&mut consumer, &stats, "key c released", |s| {
        n(&s.redriven) == 5
    })
    .await;
    assert_eq!(applied(&t, "c").await, [2]);
    let discarded_again =
        consumer_dead::discard(&t.db, CONSUMER, c_dead, "again", chrono::Utc::now()).await;
    assert!(
        matches!(discarded_again, Err(ConsumerDeadError::Resolved { .. })),
        "{discarded_again:?}"
    );

    // Nothing unresolved is left; each applied once, the inbox agrees.
    assert!(
        consumer_dead::list(&t.db, CONSUMER, None, 100)
            .await
            .expect("list")
            .is_empty()
    );
    assert_eq!(t.count("SELECT count(*) FROM applied").await, 11);
    assert_eq!(
        t.count("SELECT count(*) FROM inbox WHERE consumer = 'ledger'")
            .await,
        11
    );
    assert_eq!(
        t.count("SELECT count(*) FROM consumer_dead_letters WHERE resolution = 'applied'")
            .await,
        5
    );
    let shown = consumer_dead::show(&t.db, CONSUMER, c_dead)
        .await
        .expect("show");
    assert_eq!(shown.resolution.as_deref(), Some("discarded"));
    assert_eq!(
        shown.resolve_reason.as_deref(),
        Some("customer c was deleted")
    );
    assert!(shown.payload.is_some() && shown.headers.is_some());
}

fn embedded(t: &TestDb) -> (EmbeddedConsumer, EmbeddedPublisher) {
    let source = EmbeddedConsumer::new(
        t.db.clone(),
        EmbeddedConsumerConfig {
            group: CONSUMER.into(),
            topics: vec!["entries".into()],
            partitions: 1,
            lease: Duration::from_secs(15),
        },
    );
    (source, EmbeddedPublisher::new(t.db.clone(), 1))
}

async fn kafka() -> (String, KafkaConsumer, KafkaPublisher) {
    let bootstrap = bootstrap();
    let topic = unique("parking");
    create_topic(&bootstrap, &topic, 1).await;
    let source = KafkaConsumer::new(
        &props(&bootstrap),
        KafkaConsumerConfig::new(unique("ledger"), vec![topic.clone()]),
    )
    .expect("consumer");
    let publisher =
        KafkaPublisher::new(&props(&bootstrap), Duration::from_secs(10)).expect("publisher");
    (topic, source, publisher)
}

mod a_dead_letter_parks_its_key_until_redriven {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_postgres() {
        let t = TestDb::postgres().await;
        let (s, p) = embedded(&t);
        a_dead_letter_parks_its_key_until_redriven(t, "entries", s, p).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_sqlite() {
        let t = TestDb::sqlite().await;
        let (s, p) = embedded(&t);
        a_dead_letter_parks_its_key_until_redriven(t, "entries", s, p).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kafka_postgres() {
        let t = TestDb::postgres().await;
        let (topic, s, p) = kafka().await;
        a_dead_letter_parks_its_key_until_redriven(t, &topic, s, p).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kafka_sqlite() {
        let t = TestDb::sqlite().await;
        let (topic, s, p) = kafka().await;
        a_dead_letter_parks_its_key_until_redriven(t, &topic, s, p).await
    }
}

/// `on_dead = "skip"`: the key moves on after a dead letter (the behaviour
/// before parking), and the dead letter can still be redriven.
async fn skip_lets_the_key_move_on_and_a_redrive_still_applies(t: TestDb) {
    create_applied(&t).await;
    let (source, publisher) = embedded(&t);
    let handler = Arc::new(Ledger::default());
    let config = ConsumerConfig {
        name: CONSUMER.into(),
        max_attempts: 1,
        on_dead: OnDead::Skip,
        parking_check: Duration::from_millis(50),
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::new(t.db.clone(), source, handler.clone(), config);
    let stats = consumer.stats();
    publish(
        &publisher,
        "entries",
        &[("a", 1, false), ("a", 2, true), ("a", 3, false)],
    )
    .await;
    step_until(&mut consumer, &stats, "a3 handled", |s| n(&s.handled) == 2).await;
    assert_eq!(applied(&t, "a").await, [1, 3]);
    assert_eq!(n(&stats.parked), 0);
    handler.fixed.store(true, Ordering::SeqCst);
    let released = consumer_dead::redrive(&t.db, CONSUMER, &Target::All, None, &Default::default())
        .await
        .expect("redrive");
    assert_eq!(released, 1);
    step_until(&mut consumer, &stats, "a2 redriven", |s| {
        n(&s.redriven) == 1
    })
    .await;
    assert_eq!(applied(&t, "a").await, [1, 3, 2]);
}
crate::support::on_both!(skip_lets_the_key_move_on_and_a_redrive_still_applies);
