//! The Kafka consumer: consumer groups, with offsets committed only after
//! the handler's transaction commits.
//!
//! It never lets librdkafka commit or store offsets. It keeps every message
//! it has handed out and not yet seen committed in a per-partition buffer,
//! and each `fetch` serves that buffer again before new messages, so a
//! message whose handler failed comes back on the next fetch without a seek.
//! A rebalance that revokes a partition drops its buffer; the new owner
//! resumes from the last committed offset, and `commit` refuses deliveries
//! that are no longer buffered, so a stale member never moves a cursor it
//! does not own. A partition whose buffer fills up (its handler keeps
//! failing) is paused rather than left unpolled, which would cost the group
//! membership after `max.poll.interval.ms`.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::{KafkaSetupError, base_config, require, setup_error};
use crate::broker::{ConsumeError, Delivery, MessageSource};

/// Settings of one Kafka consumer.
#[derive(Debug, Clone)]
pub struct KafkaConsumerConfig {
    pub group: String,
    pub topics: Vec<String>,
    /// How long `fetch` waits for a first message when nothing is buffered.
    pub fetch_wait: Duration,
    /// A partition with this many uncommitted messages is paused until
    /// commits bring it under half of that, so a partition whose handler
    /// keeps failing cannot grow the buffer without bound.
    pub partition_limit: usize,
}

impl KafkaConsumerConfig {
    pub fn new(group: impl Into<String>, topics: Vec<String>) -> Self {
        Self {
            group: group.into(),
            topics,
            fetch_wait: Duration::from_millis(250),
            partition_limit: 1_000,
        }
    }
}

type PartitionKey = (String, i32);

/// Records revoked partitions so `fetch` can drop what it buffered for them.
#[derive(Default)]
struct GroupContext {
    revoked: Mutex<Vec<PartitionKey>>,
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(list) = rebalance
            && let Ok(mut revoked) = self.revoked.lock()
        {
            for e in list.elements() {
                revoked.push((e.topic().to_string(), e.partition()));
            }
        }
    }
}

/// A consumer group member reading from Kafka.
pub struct KafkaConsumer {
    consumer: Arc<StreamConsumer<GroupContext>>,
    cfg: KafkaConsumerConfig,
    /// Handed out and not yet committed, per partition, in offset order.
    buffer: BTreeMap<PartitionKey, VecDeque<Delivery>>,
    /// Partitions paused because their buffer reached the limit.
    paused: HashSet<PartitionKey>,
    /// Rotates which partition is served first, so one stuck partition with
    /// a full buffer cannot starve the others.
    rotation: usize,
}

impl std::fmt::Debug for KafkaConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConsumer")
            .field("group", &self.cfg.group)
            .field("topics", &self.cfg.topics)
            .finish_non_exhaustive()
    }
}

impl KafkaConsumer {
    /// Joins `cfg.group` and subscribes to `cfg.topics`. Offsets are only
    /// ever committed by [`MessageSource::commit`].
    pub fn new(
        props: &BTreeMap<String, String>,
        cfg: KafkaConsumerConfig,
    ) -> Result<Self, KafkaSetupError> {
        let why = "offsets are committed only after the handler's transaction commits";
        require(props, "enable.auto.commit", &["false"], why)?;
        require(props, "enable.auto.offset.store", &["false"], why)?;
        if props.contains_key("group.id") {
            return Err(KafkaSetupError::Property {
                key: "group.id".into(),
                message: "each consumer's group is its name; remove this property".into(),
            });
        }
        let mut config = base_config(props);
        config
            .set("group.id", &cfg.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        if !props.contains_key("auto.offset.reset") {
            // A new group must see events published before it first joined.
            config.set("auto.offset.reset", "earliest");
        }
        let consumer: StreamConsumer<GroupContext> = config
            .create_with_context(GroupContext::default())
            .map_err(|e| setup_error("consumer", e))?;
        let topics: Vec<&str> = cfg.topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(|e| KafkaSetupError::Client {
                role: "consumer",
                message: format!("group `{}` cannot subscribe to {topics:?}: {e}", cfg.group),
            })?;
        Ok(Self {
            consumer: Arc::new(consumer),
            cfg,
            buffer: BTreeMap::new(),
            paused: HashSet::new(),
            rotation: 0,
        })
    }

    /// How many messages are handed out and not yet committed.
    pub fn buffered(&self) -> usize {
        self.buffer.values().map(VecDeque::len).sum()
    }

    fn drop_revoked(&mut self) {
        let revoked = match self.consumer.context().revoked.lock() {
            Ok(mut r) => std::mem::take(&mut *r),
            Err(_) => return,
        };
        for key in revoked {
            if self.paused.remove(&key) {
                // Undo the pause in case it outlives the assignment, so the
                // partition is read again if it comes back to us.
                self.set_paused(&key, false);
            }
            if let Some(dropped) = self.buffer.remove(&key)
                && !dropped.is_empty()
            {
                tracing::info!(topic = %key.0, partition = key.1, dropped = dropped.len(), group = %self.cfg.group,
                    "partition revoked; its uncommitted messages go to the new owner");
            }
        }
    }

    fn set_paused(&self, key: &PartitionKey, pause: bool) {
        let mut list = TopicPartitionList::new();
        list.add_partition(&key.0, key.1);
        let result = if pause {
            self.consumer.pause(&list)
        } else {
            self.consumer.resume(&list)
        };
        if let Err(e) = result {
            tracing::warn!(topic = %key.0, partition = key.1, pause, error = %e, "cannot pause or resume a partition");
        }
    }

    fn push(&mut self, d: Delivery) {
        let key = (d.topic.clone(), d.partition);
        let queue = self.buffer.entry(key.clone()).or_default();
        if queue.iter().any(|held| *held == d) {
            // librdkafka fetched a message we already hold (after a pause).
            return;
        }
        if queue.back().is_some_and(|last| last.offset >= d.offset) {
            // The partition went back to a different message (an offset
            // reset after the broker lost data): what was buffered no longer
            // describes the log, so start again from this message.
            tracing::warn!(topic = %d.topic, partition = d.partition, offset = d.offset,
                "partition offsets went backwards; dropping the buffered messages");
            queue.clear();
        }
        queue.push_back(d);
        let full = queue.len() >= self.cfg.partition_limit;
        if full && self.paused.insert(key.clone()) {
            self.set_paused(&key, true);
        }
    }

    /// Pulls what librdkafka has: waits up to `fetch_wait` for the first
    /// message when `wait` is set, then takes only what is ready.
    async fn pull(&mut self, max: usize, wait: bool) -> Result<(), ConsumeError> {
        let mut pulled = 0;
        while pulled < max {
            let consumer = self.consumer.clone();
            let next = if wait && pulled == 0 {
                tokio::time::timeout(self.cfg.fetch_wait, consumer.recv())
                    .await
                    .ok()
            } else {
                consumer.recv().now_or_never()
            };
            let delivery = match next {
                None => break,
                Some(Ok(m)) => to_delivery(&m),
                Some(Err(e)) => {
                    if pulled > 0 || self.buffered() > 0 {
                        tracing::warn!(error = %e, group = %self.cfg.group, "kafka consumer error");
                        break;
                    }
                    return Err(ConsumeError::Transport(format!(
                        "group `{}`: {e}",
                        self.cfg.group
                    )));
                }
            };
            self.drop_revoked();
            self.push(delivery);
            pulled += 1;
        }
        Ok(())
    }
}

fn to_delivery(m: &BorrowedMessage<'_>) -> Delivery {
    let mut headers = Vec::new();
    if let Some(h) = m.headers() {
        for idx in 0..h.count() {
            // rdkafka panics on a header name that is not UTF-8; such a header
            // cannot be one of ours, so it is dropped instead of the message.
            match std::panic::catch_unwind(AssertUnwindSafe(|| {
                h.try_get(idx)
                    .map(|x| (x.key.to_string(), x.value.map(<[u8]>::to_vec)))
            })) {
                Ok(Some((name, value))) => headers.push((name, value.unwrap_or_default())),
                Ok(None) => {}
                Err(_) => tracing::warn!(
                    topic = m.topic(),
                    partition = m.partition(),
                    offset = m.offset(),
                    "dropped a header whose name is not UTF-8"
                ),
            }
        }
    }
    Delivery {
        attempt: 0,
        topic: m.topic().to_string(),
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(<[u8]>::to_vec),
        payload: m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
        headers,
    }
}

impl MessageSource for KafkaConsumer {
    async fn fetch(&mut self, max: usize) -> Result<Vec<Delivery>, ConsumeError> {
        self.drop_revoked();
        let buffered = self.buffered();
        let room = max.saturating_sub(buffered);
        self.pull(room.max(1), buffered == 0).await?;

        let keys: Vec<PartitionKey> = self.buffer.keys().cloned().collect();
        let mut out = Vec::new();
        if keys.is_empty() {
            return Ok(out);
        }
        self.rotation = self.rotation.wrapping_add(1);
        let start = self.rotation % keys.len();
        for key in keys[start..].iter().chain(&keys[..start]) {
            if let Some(queue) = self.buffer.get(key) {
                let take = max.saturating_sub(out.len()).min(queue.len());
                out.extend(queue.iter().take(take).cloned());
            }
        }
        Ok(out)
    }

    async fn commit(&mut self, d: &Delivery) -> Result<(), ConsumeError> {
        let key = (d.topic.clone(), d.partition);
        self.drop_revoked();
        let held = self
            .buffer
            .get(&key)
            .is_some_and(|q| q.iter().any(|x| x.offset == d.offset));
        if !held {
            return Err(ConsumeError::Transport(format!(
                "{}/{}@{}: not held by this member of group `{}` (revoked in a rebalance); the new owner resumes from the last committed offset",
                d.topic, d.partition, d.offset, self.cfg.group
            )));
        }
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&d.topic, d.partition, Offset::Offset(d.offset + 1))
            .map_err(|e| ConsumeError::Transport(e.to_string()))?;
        let consumer = self.consumer.clone();
        tokio::task::spawn_blocking(move || consumer.commit(&list, CommitMode::Sync))
            .await
            .map_err(|e| ConsumeError::Transport(format!("commit task failed: {e}")))?
            .map_err(|e| {
                ConsumeError::Transport(format!(
                    "group `{}` cannot commit {}/{}@{}: {e}",
                    self.cfg.group,
                    d.topic,
                    d.partition,
                    d.offset + 1
                ))
            })?;
        let mut left = 0;
        if let Some(queue) = self.buffer.get_mut(&key) {
            while queue.front().is_some_and(|x| x.offset <= d.offset) {
                queue.pop_front();
            }
            left = queue.len();
        }
        if left <= self.cfg.partition_limit / 2 && self.paused.remove(&key) {
            self.set_paused(&key, false);
        }
        Ok(())
    }
}
