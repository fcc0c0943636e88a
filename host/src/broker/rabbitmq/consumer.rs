//! A consumer group member reading RabbitMQ.
//!
//! The member subscribes to every partition queue of its topics, each on a
//! channel of its own with a prefetch of `prefetch` unacknowledged
//! messages. The queues are single-active-consumer: the broker delivers a
//! partition to one member at a time and moves it to another when that
//! member's connection closes, returning the unacknowledged messages first,
//! in order. A message is acknowledged (with `multiple`, up to it) only
//! after its inbox transaction committed, so a crash before the ack means a
//! redelivery the inbox drops.
//!
//! Messages delivered and not committed (the consumer stopped at a failure)
//! are handed out again, first and in order, on the next fetch; poison
//! messages go to outboxd's own dead letters and parking, never to
//! RabbitMQ's requeue loop (nothing is rejected or requeued).
//!
//! A delivery's offset is its delivery tag, which counts per channel; the
//! channel's generation in the high bits keeps offsets rising across a
//! reconnect, and an ack for a channel that is gone is skipped (the broker
//! has already returned those messages to the queue).

use std::collections::VecDeque;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection};
use tokio::sync::mpsc;
use uuid::Uuid;

use super::KEY_HEADER;
use crate::broker::{ConsumeError, MessageSource};
use crate::message::Delivery;
use outboxd_core::config::RabbitSection;
use outboxd_core::config::rabbitmq::queue_name;
use outboxd_core::message::headers::MESSAGE_ID;

/// Settings of one RabbitMQ consumer.
#[derive(Debug, Clone)]
pub struct RabbitConsumerConfig {
    pub group: String,
    pub topics: Vec<String>,
    pub partitions: i32,
    /// Unacknowledged deliveries per partition channel.
    pub prefetch: u16,
    /// How long an idle fetch waits for a delivery.
    pub fetch_wait: Duration,
}

/// The bits of an offset below the channel generation.
const TAG_BITS: u32 = 40;

/// One partition queue this member subscribes to.
struct Part {
    channel: Channel,
    /// Delivered, not committed yet, in queue order.
    held: VecDeque<Delivery>,
}

/// What the subscriptions forward: a delivery of a partition, or the end
/// of one (the channel or connection closed).
enum Event {
    Delivery(usize, Box<lapin::message::Delivery>),
    Closed(usize, String),
}

pub struct RabbitConsumer {
    section: RabbitSection,
    cfg: RabbitConsumerConfig,
    /// The connection and this generation's parts, in `keys` order.
    conn: Option<Connection>,
    parts: Vec<Part>,
    keys: Vec<(String, i32)>,
    events: Option<mpsc::UnboundedReceiver<Event>>,
    generation: i64,
    tag: String,
}

impl RabbitConsumer {
    pub fn new(section: RabbitSection, cfg: RabbitConsumerConfig) -> Self {
        let keys = cfg
            .topics
            .iter()
            .flat_map(|t| (0..cfg.partitions.max(1)).map(move |p| (t.clone(), p)))
            .collect();
        Self {
            section,
            tag: format!("outboxd-{}-{}", cfg.group, Uuid::new_v4()),
            cfg,
            conn: None,
            parts: Vec::new(),
            keys,
            events: None,
            generation: 0,
        }
    }

    /// Connects and subscribes to every partition queue (a new channel
    /// generation).
    async fn subscribe(&mut self) -> Result<(), ConsumeError> {
        let conn = super::connect(&self.section)
            .await
            .map_err(|e| ConsumeError::Transport(e.to_string()))?;
        self.generation += 1;
        let (tx, rx) = mpsc::unbounded_channel();
        let mut parts = Vec::with_capacity(self.keys.len());
        for (i, (topic, partition)) in self.keys.iter().enumerate() {
            let queue = queue_name(topic, *partition);
            let fail = |e: lapin::Error| {
                ConsumeError::Transport(format!(
                    "RabbitMQ queue `{queue}` (topic `{topic}`): {e}; declare it or start \
                     outboxd with [transport.topics] create = true"
                ))
            };
            let channel = conn.create_channel().await.map_err(fail)?;
            channel
                .basic_qos(self.cfg.prefetch.max(1), BasicQosOptions::default())
                .await
                .map_err(fail)?;
            let mut stream = channel
                .basic_consume(
                    queue.as_str().into(),
                    format!("{}-{partition}", self.tag).into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(fail)?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while let Some(d) = stream.next().await {
                    let sent = match d {
                        Ok(d) => tx.send(Event::Delivery(i, Box::new(d))),
                        Err(e) => {
                            let _ = tx.send(Event::Closed(i, e.to_string()));
                            return;
                        }
                    };
                    if sent.is_err() {
                        return;
                    }
                }
                let _ = tx.send(Event::Closed(i, "the subscription was cancelled".into()));
            });
            parts.push(Part {
                channel,
                held: VecDeque::new(),
            });
        }
        self.conn = Some(conn);
        self.parts = parts;
        self.events = Some(rx);
        Ok(())
    }

    /// Drops the connection: the broker returns every unacknowledged
    /// delivery to its queue and hands the partitions to another member.
    async fn drop_connection(&mut self) {
        if let Some(conn) = self.conn.take() {
            let _ = conn.close(200, "outboxd consumer stopping".into()).await;
        }
        self.parts.clear();
        self.events = None;
    }

    fn take(&mut self, event: Event) -> Result<(), ConsumeError> {
        match event {
            Event::Delivery(i, d) => {
                let (topic, partition) = &self.keys[i];
                let offset = (self.generation << TAG_BITS) | (d.delivery_tag as i64);
                let delivery = delivery_of(topic, *partition, offset, &d);
                self.parts[i].held.push_back(delivery);
                Ok(())
            }
            Event::Closed(i, why) => {
                let (topic, partition) = &self.keys[i];
                Err(ConsumeError::Transport(format!(
                    "RabbitMQ subscription to `{}` closed: {why}",
                    queue_name(topic, *partition)
                )))
            }
        }
    }

    /// Moves what has arrived into the parts' held queues, waiting up to
    /// `wait` for the first when nothing is held.
    async fn gather(&mut self, wait: Duration) -> Result<(), ConsumeError> {
        let Some(rx) = self.events.as_mut() else {
            return Ok(());
        };
        let mut got = Vec::new();
        while let Ok(e) = rx.try_recv() {
            got.push(e);
        }
        if got.is_empty() && self.parts.iter().all(|p| p.held.is_empty()) {
            match tokio::time::timeout(wait, rx.recv()).await {
                Ok(Some(e)) => got.push(e),
                Ok(None) => {
                    got.push(Event::Closed(0, "the connection closed".into()));
                }
                Err(_) => {}
            }
            while let Ok(e) = rx.try_recv() {
                got.push(e);
            }
        }
        for e in got {
            self.take(e)?;
        }
        Ok(())
    }
}

impl Drop for RabbitConsumer {
    /// A member dropped without [`MessageSource::release`] closes its
    /// connection too: an open one would stay the queues' single active
    /// consumer while nothing reads it.
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move {
                let _ = conn.close(200, "outboxd consumer dropped".into()).await;
            });
        }
    }
}

/// The [`Delivery`] of an AMQP message: the key from [`KEY_HEADER`], the
/// message id from the `message-id` header or, for a message another
/// producer sent, the `message_id` property; the other headers as bytes.
fn delivery_of(topic: &str, partition: i32, offset: i64, d: &lapin::message::Delivery) -> Delivery {
    let mut key = None;
    let mut headers = Vec::new();
    if let Some(table) = d.properties.headers() {
        for (name, value) in table.inner() {
            let bytes = match value {
                AMQPValue::LongString(s) => s.as_bytes().to_vec(),
                AMQPValue::ShortString(s) => s.as_str().as_bytes().to_vec(),
                AMQPValue::ByteArray(b) => b.as_slice().to_vec(),
                other => format!("{other:?}").into_bytes(),
            };
            if name.as_str() == KEY_HEADER {
                key = Some(bytes);
            } else {
                headers.push((name.as_str().to_string(), bytes));
            }
        }
    }
    if !headers.iter().any(|(k, _)| k == MESSAGE_ID)
        && let Some(id) = d.properties.message_id()
    {
        headers.push((MESSAGE_ID.to_string(), id.as_str().as_bytes().to_vec()));
    }
    Delivery {
        topic: topic.to_string(),
        partition,
        offset,
        key,
        payload: d.data.clone(),
        headers,
        attempt: 0,
    }
}

impl MessageSource for RabbitConsumer {
    async fn fetch(&mut self, max: usize) -> Result<Vec<Delivery>, ConsumeError> {
        if self.conn.as_ref().is_none_or(|c| !c.status().connected()) {
            self.drop_connection().await;
            self.subscribe().await?;
        }
        if let Err(e) = self.gather(self.cfg.fetch_wait).await {
            // What this member held goes back to the queues with the
            // connection; the next fetch subscribes again.
            self.drop_connection().await;
            return Err(e);
        }
        if max == 0 {
            return Ok(Vec::new());
        }
        let busy = self
            .parts
            .iter()
            .filter(|p| !p.held.is_empty())
            .count()
            .max(1);
        let share = max.div_ceil(busy);
        Ok(self
            .parts
            .iter()
            .flat_map(|p| p.held.iter().take(share).cloned())
            .collect())
    }

    fn waits_for_messages(&self) -> bool {
        true
    }

    async fn release(&mut self) -> Result<(), ConsumeError> {
        self.drop_connection().await;
        Ok(())
    }

    async fn commit(&mut self, d: &Delivery) -> Result<(), ConsumeError> {
        if d.offset >> TAG_BITS != self.generation {
            // Delivered on a channel that is gone: the broker returned it
            // to the queue, and the inbox drops the redelivery.
            return Ok(());
        }
        let Some(i) = self
            .keys
            .iter()
            .position(|(t, p)| *t == d.topic && *p == d.partition)
        else {
            return Ok(());
        };
        let Some(part) = self.parts.get_mut(i) else {
            return Ok(());
        };
        while part.held.front().is_some_and(|h| h.offset <= d.offset) {
            part.held.pop_front();
        }
        let tag = (d.offset & ((1 << TAG_BITS) - 1)) as u64;
        if let Err(e) = part
            .channel
            .basic_ack(tag, BasicAckOptions { multiple: true })
            .await
        {
            // The inbox has the effect: a lost ack only means a redelivery
            // that is dropped.
            tracing::debug!(error = %e, "RabbitMQ ack failed; the redelivery will be dropped by the inbox");
        }
        Ok(())
    }
}

/// How many messages wait in `topics`' partition queues, not yet delivered
/// to a member (a member's unacknowledged prefetch is not counted): for
/// `/api/consumers`.
pub async fn messages_behind(
    conn: &Connection,
    topics: &[String],
    partitions: i32,
) -> Result<i64, String> {
    use lapin::options::QueueDeclareOptions;
    let mut behind: i64 = 0;
    for topic in topics {
        for partition in 0..partitions.max(1) {
            let queue = queue_name(topic, partition);
            let ch = conn
                .create_channel()
                .await
                .map_err(|e| format!("RabbitMQ: {e}"))?;
            let q = ch
                .queue_declare(
                    queue.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(|e| format!("RabbitMQ queue `{queue}`: {e}"))?;
            behind = behind.saturating_add(i64::from(q.message_count()));
            let _ = ch.close(200, "counted".into()).await;
        }
    }
    Ok(behind)
}
