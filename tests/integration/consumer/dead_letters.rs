//! Consumer dead letters: a permanent failure, or too many retryable ones,
//! records the message and lets its partition move on; nothing is dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use outboxd::broker::Publisher;
use outboxd::broker::embedded::{EmbeddedConsumer, EmbeddedConsumerConfig, EmbeddedPublisher};
use outboxd::config::OnDead;
use outboxd::consumer::Consumer;
use outboxd::consumer::ConsumerConfig;
use outboxd::consumer::Handler;
use outboxd::consumer::HandlerError;
use outboxd::message::Delivery;
use outboxd::message::OutgoingMessage;
use outboxd::message::headers;
use outboxd::store::InboxTx;

use crate::support::{TestDb, on_both};

/// Fails retryably on payload "flaky", permanently on "poison", and
/// succeeds otherwise.
#[derive(Default)]
struct Picky {
    flaky_calls: AtomicU32,
}

impl Handler for Picky {
    async fn handle(&self, _tx: &mut InboxTx, d: &Delivery) -> Result<(), HandlerError> {
        match d.payload.as_slice() {
            b"flaky" => {
                self.flaky_calls.fetch_add(1, Ordering::SeqCst);
                Err(HandlerError::Retryable("downstream timeout".into()))
            }
            b"poison" => Err(HandlerError::Permanent("payload has no order_id".into())),
            _ => Ok(()),
        }
    }
}

fn msg(payload: &str, with_id: bool) -> OutgoingMessage {
    let id = uuid::Uuid::new_v4();
    let mut hdrs = vec![(headers::EVENT_TYPE.to_string(), b"t".to_vec())];
    if with_id {
        hdrs.push((headers::MESSAGE_ID.to_string(), id.to_string().into_bytes()));
    }
    OutgoingMessage {
        topic: "orders".into(),
        key: b"same-key".to_vec(),
        payload: payload.as_bytes().to_vec(),
        headers: hdrs,
        message_id: id,
        created_at: chrono::Utc::now(),
    }
}

async fn poison_and_exhausted_messages_are_dead_lettered_and_the_partition_moves_on(t: TestDb) {
    let p = EmbeddedPublisher::new(t.db.clone(), 1);
    for (payload, with_id) in [
        ("ok-1", true),
        ("poison", true),
        ("flaky", true),
        ("no-id", false),
        ("ok-2", true),
    ] {
        p.publish(msg(payload, with_id)).await.expect("publish");
    }
    let source = EmbeddedConsumer::new(
        t.db.clone(),
        EmbeddedConsumerConfig {
            group: "billing".into(),
            topics: vec!["orders".into()],
            partitions: 1,
            lease: Duration::from_secs(15),
        },
    );
    let handler = Arc::new(Picky::default());
    let config = ConsumerConfig {
        name: "billing".into(),
        max_attempts: 3,
        handler_id: "builtin:picky".into(),
        // All five share a key: this test is about the partition moving on
        // (per-key parking is in parking.rs).
        on_dead: OnDead::Skip,
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::new(t.db.clone(), source, handler.clone(), config);
    let stats = consumer.stats();
    for _ in 0..10 {
        consumer.step().await.expect("step");
        if stats.handled.load(Ordering::SeqCst) == 2 {
            break;
        }
    }
    assert_eq!(
        stats.handled.load(Ordering::SeqCst),
        2,
        "ok-1 and ok-2 handled: the partition moved on"
    );
    assert_eq!(stats.dead_lettered.load(Ordering::SeqCst), 3);
    assert_eq!(
        handler.flaky_calls.load(Ordering::SeqCst),
        3,
        "retried up to max_attempts"
    );
    assert_eq!(
        t.count("SELECT count(*) FROM consumer_dead_letters").await,
        3
    );
    assert_eq!(
        t.count("SELECT count(*) FROM consumer_dead_letters WHERE error LIKE '%no order_id%' AND attempts = 1 AND handler = 'builtin:picky' AND message_id IS NOT NULL").await,
        1,
        "permanent: at once, with the reason"
    );
    assert_eq!(t.count("SELECT count(*) FROM consumer_dead_letters WHERE error LIKE '%downstream timeout%' AND attempts = 3").await, 1);
    assert_eq!(
        t.count("SELECT count(*) FROM consumer_dead_letters WHERE message_id IS NULL AND error LIKE '%message-id%'").await,
        1,
        "a message without a message id is kept too"
    );
    // Dead letters keep the payload and headers.
    let with_headers = if t.is_postgres() {
        "SELECT count(*) FROM consumer_dead_letters WHERE headers::text LIKE '%event-type%'"
    } else {
        "SELECT count(*) FROM consumer_dead_letters WHERE headers LIKE '%event-type%'"
    };
    assert_eq!(t.count(with_headers).await, 3);
    // No inbox mark for a dead-lettered message: its effect never happened.
    assert_eq!(t.count("SELECT count(*) FROM inbox").await, 2);
    // Everything is committed: a new fetch returns nothing.
    assert_eq!(consumer.step().await.expect("step").handled(), 0);
}
on_both!(poison_and_exhausted_messages_are_dead_lettered_and_the_partition_moves_on);

/// Batched processing (savepoint per message): the same outcome as one
/// transaction per message, and a failing message rolls back only itself.
async fn batched_savepoints_roll_back_only_the_failing_message(t: TestDb) {
    let p = EmbeddedPublisher::new(t.db.clone(), 1);
    for payload in ["ok-1", "ok-2", "poison", "ok-3", "flaky", "ok-4"] {
        p.publish(msg(payload, true)).await.expect("publish");
    }
    // A duplicate of ok-1 (same message id) is published again.
    let first = t
        .count("SELECT min(\"offset\") FROM transport_messages")
        .await;
    let dup_sql = format!(
        "INSERT INTO transport_messages (topic, partition, message_key, payload, headers, message_id)
         SELECT topic, partition, message_key, payload, headers, message_id FROM transport_messages WHERE \"offset\" = {first}"
    );
    t.exec(&dup_sql).await;
    let source = EmbeddedConsumer::new(
        t.db.clone(),
        EmbeddedConsumerConfig {
            group: "billing".into(),
            topics: vec!["orders".into()],
            partitions: 1,
            lease: Duration::from_secs(15),
        },
    );
    let handler = Arc::new(Picky::default());
    let config = ConsumerConfig {
        name: "billing".into(),
        max_attempts: 2,
        batch_in_transaction: 50,
        // Same key throughout: this test is about savepoints, not parking.
        on_dead: OnDead::Skip,
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::new(t.db.clone(), source, handler.clone(), config);
    let stats = consumer.stats();
    for _ in 0..10 {
        consumer.step().await.expect("step");
        if stats.handled.load(Ordering::SeqCst) == 4 && stats.duplicates.load(Ordering::SeqCst) == 1
        {
            break;
        }
    }
    assert_eq!(stats.handled.load(Ordering::SeqCst), 4);
    assert_eq!(stats.duplicates.load(Ordering::SeqCst), 1);
    assert_eq!(stats.dead_lettered.load(Ordering::SeqCst), 2);
    assert_eq!(handler.flaky_calls.load(Ordering::SeqCst), 2);
    assert_eq!(
        t.count("SELECT count(*) FROM inbox").await,
        4,
        "no mark for failed messages"
    );
    assert_eq!(
        consumer.step().await.expect("step").handled(),
        0,
        "all committed"
    );
}
on_both!(batched_savepoints_roll_back_only_the_failing_message);
