//! The Kafka consumer: a consumer group member, or a reader of statically
//! assigned partitions. Either way offsets are committed only after the
//! handler's transaction commits.
//!
//! A group member commits its offsets to the broker's group coordinator. A
//! consumer with assigned partitions (`consumers[].kafka_partitions`) joins
//! no group: it keeps its offsets in its own database
//! ([`crate::store::offsets`]) and starts from them, so it depends on no
//! coordinator and no rebalance. Running two processes with the same
//! partitions is a configuration error that costs work, not correctness:
//! the inbox drops the second effect.
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
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::{Offset, TopicPartitionList};

use super::KafkaSetupError;
use super::client::{client, to_delivery};
use crate::broker::{ConsumeError, Delivery, MessageSource};
use crate::store::{Db, offsets};

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
    /// Read these partitions of every topic without joining a group, with
    /// offsets in the database (`None`: be a member of the group `group`).
    pub partitions: Option<Vec<i32>>,
}

impl KafkaConsumerConfig {
    pub fn new(group: impl Into<String>, topics: Vec<String>) -> Self {
        Self {
            group: group.into(),
            topics,
            fetch_wait: Duration::from_millis(250),
            partition_limit: 1_000,
            partitions: None,
        }
    }
}

type PartitionKey = (String, i32);

/// Records revoked partitions so `fetch` can drop what it buffered for them.
#[derive(Default)]
pub(super) struct GroupContext {
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
    /// Where offsets go for statically assigned partitions; `None` for a
    /// group member, which commits them to the group coordinator.
    offsets_db: Option<Db>,
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
        let consumer = client(props, &cfg)?;
        let topics: Vec<&str> = cfg.topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(|e| KafkaSetupError::Client {
                role: "consumer",
                message: format!("group `{}` cannot subscribe to {topics:?}: {e}", cfg.group),
            })?;
        Ok(Self::with_client(consumer, cfg, None))
    }

    /// Reads `cfg.partitions` of every topic in `cfg.topics` without joining
    /// a group, from the offsets `cfg.group` (the consumer's name) stored in
    /// `db`, or from the start of a partition it never committed.
    pub async fn assigned(
        props: &BTreeMap<String, String>,
        cfg: KafkaConsumerConfig,
        db: Db,
    ) -> Result<Self, KafkaSetupError> {
        let partitions = cfg.partitions.clone().unwrap_or_default();
        if partitions.is_empty() {
            return Err(KafkaSetupError::Property {
                key: "kafka_partitions".into(),
                message: "list at least one partition to read".into(),
            });
        }
        let consumer = client(props, &cfg)?;
        let mut list = TopicPartitionList::new();
        for topic in &cfg.topics {
            let stored = offsets::load_offsets(&db, &cfg.group, topic)
                .await
                .map_err(|e| KafkaSetupError::Client {
                    role: "consumer",
                    message: format!(
                        "consumer `{}` cannot read its stored offsets of `{topic}` (table consumer_offsets; run the migrations): {e}",
                        cfg.group
                    ),
                })?;
            for &p in &partitions {
                let offset = stored
                    .get(&p)
                    .map_or(Offset::Beginning, |&next| Offset::Offset(next));
                list.add_partition_offset(topic, p, offset).map_err(|e| {
                    KafkaSetupError::Client {
                        role: "consumer",
                        message: format!("{topic}/{p}: {e}"),
                    }
                })?;
            }
        }
        consumer
            .assign(&list)
            .map_err(|e| KafkaSetupError::Client {
                role: "consumer",
                message: format!(
                    "consumer `{}` cannot be assigned partitions {partitions:?} of {:?}: {e}",
                    cfg.group, cfg.topics
                ),
            })?;
        tracing::info!(consumer = %cfg.group, topics = ?cfg.topics, ?partitions,
            "reading assigned partitions; offsets are kept in the database");
        Ok(Self::with_client(consumer, cfg, Some(db)))
    }

    fn with_client(
        consumer: StreamConsumer<GroupContext>,
        cfg: KafkaConsumerConfig,
        offsets_db: Option<Db>,
    ) -> Self {
        Self {
            consumer: Arc::new(consumer),
            cfg,
            buffer: BTreeMap::new(),
            paused: HashSet::new(),
            rotation: 0,
            offsets_db,
        }
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

    /// An empty fetch has waited `fetch_wait` for a first message.
    fn waits_for_messages(&self) -> bool {
        true
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
        if let Some(db) = &self.offsets_db {
            offsets::save_offset(db, &self.cfg.group, &d.topic, d.partition, d.offset + 1)
                .await
                .map_err(|e| {
                    ConsumeError::Transport(format!(
                        "consumer `{}` cannot store its offset {}/{}@{} in the database: {e}",
                        self.cfg.group,
                        d.topic,
                        d.partition,
                        d.offset + 1
                    ))
                })?;
        } else {
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
        }
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
