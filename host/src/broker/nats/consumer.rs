//! A consumer group member reading NATS JetStream.
//!
//! nats-server 2.9 has neither pinned-client groups nor multi-filter
//! consumers, so partitions are leased to members through the same
//! `transport_members` / `transport_cursors` leases the embedded transport
//! uses (group `nats:NAME`). Only a partition's owner pulls from it, through
//! a durable pull consumer `GROUP-PARTITION` on the topic's stream, filtered
//! to `TOPIC.PARTITION`, acknowledging explicitly after the inbox commit.
//!
//! The cursor in the database (the last stream sequence whose effect
//! committed) is the truth: a member that takes a partition recreates its
//! durable consumer from the cursor, so the previous owner's unacknowledged
//! messages come back at once and in order rather than after `ack_wait`.
//! A message at or below the cursor is a redelivery of handled work: it is
//! acknowledged and skipped. Each owned partition has a task that keeps a
//! pull subscription open and forwards what arrives, so a fetch returns as
//! soon as a message is there instead of after a pull request's expiry. Messages fetched and not committed (the
//! consumer stopped at a failure) are handed out again, first and in order,
//! on the next fetch, so a partition's messages are handled in stream order.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull};
use async_nats::jetstream::{self, AckKind, Message};
use chrono::Utc;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::KEY_HEADER;
use crate::broker::{ConsumeError, MessageSource};
use crate::message::Delivery;
use crate::store::Db;
use crate::store::transport;
use outboxd_core::config::nats::stream_name;

/// Settings of one NATS consumer.
#[derive(Debug, Clone)]
pub struct NatsConsumerConfig {
    pub group: String,
    pub topics: Vec<String>,
    pub partitions: i32,
    /// How long a partition stays ours without renewal.
    pub lease: Duration,
    /// JetStream's redelivery timeout for an unacknowledged message.
    pub ack_wait: Duration,
    /// How long an idle fetch waits for a message.
    pub fetch_wait: Duration,
    /// Messages a partition's subscription asks for at a time.
    pub batch: usize,
}

/// One partition this member owns.
struct Owned {
    /// The last stream sequence whose effect committed.
    cursor: i64,
    /// Which subscription task feeds it: messages of an earlier one are
    /// ignored.
    generation: u64,
    task: tokio::task::AbortHandle,
    /// Fetched, not committed yet, in stream order.
    held: VecDeque<(Delivery, Message)>,
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a partition's subscription task forwards.
type Arrival = ((String, i32), u64, Result<Message, String>);

pub struct NatsConsumer {
    db: Db,
    js: jetstream::Context,
    cfg: NatsConsumerConfig,
    owner: String,
    owned: BTreeMap<(String, i32), Owned>,
    renewed_at: Option<Instant>,
    tx: mpsc::UnboundedSender<Arrival>,
    rx: mpsc::UnboundedReceiver<Arrival>,
    next_generation: u64,
}

impl NatsConsumer {
    pub fn new(db: Db, client: super::Client, cfg: NatsConsumerConfig) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            db,
            js: client.jetstream(),
            cfg,
            owner: Uuid::new_v4().to_string(),
            owned: BTreeMap::new(),
            renewed_at: None,
            tx,
            rx,
            next_generation: 0,
        }
    }

    /// The lease group of consumer group `group` in `transport_cursors`.
    pub fn lease_group(group: &str) -> String {
        format!("nats:{group}")
    }

    /// The durable consumer's name for `group` on `partition`.
    pub fn durable_name(group: &str, partition: i32) -> String {
        format!("{}-{partition}", stream_name(group))
    }

    /// The partitions this member owns right now.
    pub fn assignment(&self) -> Vec<(String, i32)> {
        self.owned.keys().cloned().collect()
    }

    /// Releases every lease so another member can take over at once.
    async fn release_leases(&mut self) -> Result<(), ConsumeError> {
        transport::release_leases(&self.db, &self.owner).await?;
        self.owned.clear();
        Ok(())
    }

    /// Takes free or expired partitions, renews the ones held, and
    /// (re)creates the durable consumer of each newly taken one from the
    /// committed cursor.
    async fn refresh_leases(&mut self) -> Result<(), ConsumeError> {
        if self
            .renewed_at
            .is_some_and(|t| t.elapsed() < self.cfg.lease / 3)
        {
            return Ok(());
        }
        let now = Utc::now();
        let until = now
            + chrono::Duration::from_std(self.cfg.lease).unwrap_or(chrono::Duration::seconds(15));
        let group = Self::lease_group(&self.cfg.group);
        let mut taken = Vec::new();
        for topic in &self.cfg.topics {
            for (partition, cursor) in transport::take_leases(
                &self.db,
                &group,
                topic,
                self.cfg.partitions,
                &self.owner,
                until,
                now,
            )
            .await?
            {
                taken.push(((topic.clone(), partition), cursor));
            }
        }
        let mut owned = BTreeMap::new();
        for (key, cursor) in taken {
            let kept = self.owned.remove(&key);
            let entry = match kept {
                Some(o) => o,
                None => self.subscribe(&key, cursor).await?,
            };
            owned.insert(key, entry);
        }
        self.owned = owned;
        self.renewed_at = Some(Instant::now());
        Ok(())
    }

    /// Starts reading `key` from just after `cursor`: a durable consumer
    /// from there and a task that forwards what it delivers.
    async fn subscribe(&mut self, key: &(String, i32), cursor: i64) -> Result<Owned, ConsumeError> {
        let consumer = self.start_partition(&key.0, key.1, cursor).await?;
        self.next_generation += 1;
        let generation = self.next_generation;
        let tx = self.tx.clone();
        let key = key.clone();
        let batch = self.cfg.batch.max(1);
        let task = tokio::spawn(async move {
            let forward =
                |r: Result<Message, String>| tx.send((key.clone(), generation, r)).is_ok();
            let mut messages = match consumer
                .stream()
                .max_messages_per_batch(batch)
                .messages()
                .await
            {
                Ok(m) => m,
                Err(e) => {
                    forward(Err(e.to_string()));
                    return;
                }
            };
            while let Some(m) = messages.next().await {
                if !forward(m.map_err(|e| e.to_string())) {
                    return;
                }
            }
            forward(Err("the subscription ended".into()));
        })
        .abort_handle();
        Ok(Owned {
            cursor,
            generation,
            task,
            held: VecDeque::new(),
        })
    }

    /// Moves what the subscriptions delivered into the owned partitions'
    /// held queues; a failed subscription starts again from the cursor.
    async fn take_arrivals(&mut self, wait: Duration) -> Result<(), ConsumeError> {
        let mut got = Vec::new();
        while let Ok(a) = self.rx.try_recv() {
            got.push(a);
        }
        if got.is_empty()
            && !wait.is_zero()
            && self.owned.values().all(|o| o.held.is_empty())
            && let Ok(Some(a)) = tokio::time::timeout(wait, self.rx.recv()).await
        {
            got.push(a);
            while let Ok(a) = self.rx.try_recv() {
                got.push(a);
            }
        }
        let mut restart = Vec::new();
        for (key, generation, m) in got {
            let Some(o) = self.owned.get_mut(&key) else {
                continue;
            };
            if o.generation != generation {
                continue;
            }
            let m = match m {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(topic = %key.0, partition = key.1, error = %e, "NATS subscription failed; starting it again from the cursor");
                    restart.push(key);
                    continue;
                }
            };
            let Ok(info) = m.info() else { continue };
            let seq = info.stream_sequence as i64;
            let held_to = o.held.back().map_or(o.cursor, |(d, _)| d.offset);
            if seq <= o.cursor {
                // Handled before: acknowledge the redelivery.
                let _ = m.ack().await;
                continue;
            }
            if seq <= held_to {
                // A redelivery of one we hold: the held copy goes first.
                continue;
            }
            o.held.push_back((delivery_of(&key.0, key.1, seq, &m), m));
        }
        for key in restart {
            if let Some(old) = self.owned.remove(&key) {
                let fresh = self.subscribe(&key, old.cursor).await?;
                self.owned.insert(key, fresh);
            }
        }
        Ok(())
    }

    /// Recreates the durable consumer of `topic`/`partition` to deliver
    /// from just after `cursor`.
    async fn start_partition(
        &self,
        topic: &str,
        partition: i32,
        cursor: i64,
    ) -> Result<PullConsumer, ConsumeError> {
        let stream_name = stream_name(topic);
        let stream = self.js.get_stream(&stream_name).await.map_err(|e| {
            ConsumeError::Transport(format!(
                "JetStream stream `{stream_name}` (topic `{topic}`): {e}; create it or start \
                 outboxd with [transport.topics] create = true"
            ))
        })?;
        let name = Self::durable_name(&self.cfg.group, partition);
        // A previous owner's consumer holds its unacknowledged messages
        // until ack_wait; a fresh one from the cursor delivers them now.
        let _ = stream.delete_consumer(&name).await;
        let deliver_policy = if cursor > 0 {
            DeliverPolicy::ByStartSequence {
                start_sequence: cursor as u64 + 1,
            }
        } else {
            DeliverPolicy::All
        };
        stream
            .create_consumer(pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: format!("{topic}.{partition}"),
                deliver_policy,
                ack_policy: AckPolicy::Explicit,
                ack_wait: self.cfg.ack_wait,
                max_ack_pending: 10_000,
                ..Default::default()
            })
            .await
            .map_err(|e| {
                ConsumeError::Transport(format!(
                    "cannot create the durable consumer `{name}` on stream `{stream_name}`: {e}"
                ))
            })
    }

    /// What each owned partition holds, first in, up to `max` in all,
    /// waiting up to `wait` for a first message when none is held.
    async fn fetch_now(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, ConsumeError> {
        self.refresh_leases().await?;
        if self.owned.is_empty() || max == 0 {
            if !wait.is_zero() && self.owned.is_empty() {
                tokio::time::sleep(wait).await;
            }
            return Ok(Vec::new());
        }
        self.take_arrivals(wait).await?;
        let busy = self
            .owned
            .values()
            .filter(|o| !o.held.is_empty())
            .count()
            .max(1);
        let share = max.div_ceil(busy);
        Ok(self
            .owned
            .values()
            .flat_map(|o| o.held.iter().take(share).map(|(d, _)| d.clone()))
            .collect())
    }
}

/// The [`Delivery`] of a JetStream message: the key from [`KEY_HEADER`],
/// the stream sequence as the offset, the other headers as they came.
fn delivery_of(topic: &str, partition: i32, seq: i64, m: &Message) -> Delivery {
    let mut key = None;
    let mut headers = Vec::new();
    if let Some(h) = &m.headers {
        for (name, values) in h.iter() {
            let name: &str = name.as_ref();
            if name.eq_ignore_ascii_case("Nats-Msg-Id") {
                continue;
            }
            for v in values {
                if name == KEY_HEADER {
                    key = Some(v.as_str().as_bytes().to_vec());
                } else {
                    headers.push((name.to_string(), v.as_str().as_bytes().to_vec()));
                }
            }
        }
    }
    Delivery {
        topic: topic.to_string(),
        partition,
        offset: seq,
        key,
        payload: m.payload.to_vec(),
        headers,
        attempt: 0,
    }
}

impl MessageSource for NatsConsumer {
    async fn fetch(&mut self, max: usize) -> Result<Vec<Delivery>, ConsumeError> {
        let wait = self.cfg.fetch_wait;
        self.fetch_now(max, wait).await
    }

    async fn release(&mut self) -> Result<(), ConsumeError> {
        self.release_leases().await
    }

    fn waits_for_messages(&self) -> bool {
        true
    }

    async fn commit(&mut self, d: &Delivery) -> Result<(), ConsumeError> {
        self.commit_all(vec![d.clone()]).await
    }

    async fn commit_all(&mut self, ds: Vec<Delivery>) -> Result<(), ConsumeError> {
        let group = Self::lease_group(&self.cfg.group);
        let advanced = transport::advance_cursors(&self.db, &group, &ds, &self.owner).await?;
        let mut lost = Vec::new();
        for (d, ok) in ds.iter().zip(advanced) {
            let key = (d.topic.clone(), d.partition);
            if !ok {
                self.owned.remove(&key);
                self.renewed_at = None;
                lost.push(format!("{}/{}", d.topic, d.partition));
                continue;
            }
            let Some(o) = self.owned.get_mut(&key) else {
                continue;
            };
            o.cursor = d.offset;
            while o.held.front().is_some_and(|(h, _)| h.offset <= d.offset) {
                if let Some((_, m)) = o.held.pop_front() {
                    // The cursor is committed: a lost ack only means a
                    // redelivery that is skipped.
                    if let Err(e) = m.ack_with(AckKind::Ack).await {
                        tracing::debug!(error = %e, "NATS ack failed; the redelivery will be skipped");
                    }
                }
            }
        }
        ConsumeError::unless_leases_lost(&lost, &self.cfg.group, "stream sequence")
    }
}

/// How many messages consumer group `group` has not acknowledged on
/// `topics`: per partition, what its durable consumer has pending and
/// unacknowledged, or every message of the partition's subject when no
/// member has read it yet (for `/api/consumers`).
pub async fn messages_behind(
    client: &super::Client,
    group: &str,
    topics: &[String],
    partitions: i32,
) -> Result<i64, String> {
    use futures_util::TryStreamExt;
    let js = client.jetstream();
    let mut behind: i64 = 0;
    for topic in topics {
        let name = stream_name(topic);
        let stream = js
            .get_stream(&name)
            .await
            .map_err(|e| format!("JetStream stream `{name}` (topic `{topic}`): {e}"))?;
        let mut unread: std::collections::BTreeMap<String, usize> = stream
            .info_with_subjects(format!("{topic}.*"))
            .await
            .map_err(|e| format!("stream `{name}`: {e}"))?
            .try_collect()
            .await
            .map_err(|e| format!("stream `{name}`: {e}"))?;
        for partition in 0..partitions.max(1) {
            let durable = NatsConsumer::durable_name(group, partition);
            let n = match stream.consumer_info(&durable).await {
                Ok(info) => info.num_pending + info.num_ack_pending as u64,
                Err(_) => unread
                    .remove(&format!("{topic}.{partition}"))
                    .map_or(0, |n| n as u64),
            };
            behind = behind.saturating_add(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
    Ok(behind)
}
