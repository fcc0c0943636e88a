//! The embedded transport: a durable SQL pub/sub in the outbox's own
//! database, so the whole pipeline runs with nothing else installed.
//!
//! A topic has a fixed number of partitions and a message's partition comes
//! from its key, so one aggregate keeps its order as it does on Kafka. Each
//! consumer group has a cursor per partition, advanced only after handling
//! commits, and owns a partition through a lease that expires when the
//! consumer dies (then another member resumes from the cursor).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::Utc;
use uuid::Uuid;

use super::ConsumeError;
use super::MessageSource;
use super::PublishError;
use super::Publisher;
use super::group_commit::GroupCommit;
use crate::message::Delivery;
use crate::message::OutgoingMessage;
use crate::store::Db;
use crate::store::transport::{self, TransportMessage};
use outboxd_core::embedded_headers::headers_json;

/// Stable partitioning: FNV-1a, so every process maps a key the same way.
pub fn partition_for(key: &[u8], partitions: i32) -> i32 {
    let mut hash: u32 = 0x811c_9dc5;
    for b in key {
        hash ^= u32::from(*b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    (hash % partitions.max(1) as u32) as i32
}

#[derive(Clone, Debug)]
pub struct EmbeddedPublisher {
    db: Db,
    partitions: i32,
    /// Postgres: concurrent publishes share one transaction.
    group: GroupCommit,
}

impl EmbeddedPublisher {
    pub fn new(db: Db, partitions: i32) -> Self {
        Self {
            db,
            partitions: partitions.max(1),
            group: GroupCommit::default(),
        }
    }
}

impl Publisher for EmbeddedPublisher {
    async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        let row = TransportMessage {
            partition: partition_for(&msg.key, self.partitions),
            headers: headers_json(&msg.headers),
            topic: msg.topic,
            key: msg.key,
            payload: msg.payload,
            message_id: msg.message_id,
        };
        // One transaction for everything published at this moment.
        self.group.publish(&self.db, row).await
    }
}

/// Settings of one embedded consumer.
#[derive(Debug, Clone)]
pub struct EmbeddedConsumerConfig {
    pub group: String,
    pub topics: Vec<String>,
    pub partitions: i32,
    /// How long a partition stays ours without renewal.
    pub lease: Duration,
}

/// A consumer group member reading from the embedded transport.
pub struct EmbeddedConsumer {
    db: Db,
    cfg: EmbeddedConsumerConfig,
    owner: String,
    /// Committed offset of each owned partition.
    committed: HashMap<(String, i32), i64>,
    renewed_at: Option<Instant>,
    /// Ticks when something may have been published (Postgres's NOTIFY on
    /// [`NOTIFY_CHANNEL`], SQLite's commit watcher); an empty fetch waits
    /// for it, up to `fetch_wait`.
    wake: Option<(tokio::sync::watch::Receiver<u64>, Duration)>,
}

impl EmbeddedConsumer {
    pub fn new(db: Db, cfg: EmbeddedConsumerConfig) -> Self {
        Self {
            db,
            cfg,
            owner: Uuid::new_v4().to_string(),
            committed: HashMap::new(),
            renewed_at: None,
            wake: None,
        }
    }

    /// Makes an empty fetch wait up to `fetch_wait` for `wake` to tick (a
    /// publish notification: [`Db::listen`] on
    /// [`crate::store::Channel::Transport`]) and then look again, so a
    /// message is handed out as soon as it is committed, without polling
    /// fast.
    pub fn with_wake(
        mut self,
        wake: tokio::sync::watch::Receiver<u64>,
        fetch_wait: Duration,
    ) -> Self {
        self.wake = Some((wake, fetch_wait));
        self
    }

    /// The partitions this member owns right now.
    pub fn assignment(&self) -> Vec<(String, i32)> {
        let mut v: Vec<_> = self.committed.keys().cloned().collect();
        v.sort();
        v
    }

    /// Releases every lease so another member can take over at once.
    async fn release_leases(&mut self) -> Result<(), ConsumeError> {
        transport::release_leases(&self.db, &self.owner).await?;
        self.committed.clear();
        Ok(())
    }

    /// Takes free or expired partitions and renews the ones we hold.
    async fn refresh_leases(&mut self) -> Result<(), ConsumeError> {
        let renew_every = self.cfg.lease / 3;
        if self.renewed_at.is_some_and(|t| t.elapsed() < renew_every) {
            return Ok(());
        }
        let now = Utc::now();
        let until = now
            + chrono::Duration::from_std(self.cfg.lease).unwrap_or(chrono::Duration::seconds(15));
        let mut owned = HashMap::new();
        for topic in &self.cfg.topics {
            let taken = transport::take_leases(
                &self.db,
                &self.cfg.group,
                topic,
                self.cfg.partitions,
                &self.owner,
                until,
                now,
            )
            .await?;
            for (partition, last_offset) in taken {
                owned.insert((topic.clone(), partition), last_offset);
            }
        }
        self.committed = owned;
        self.renewed_at = Some(Instant::now());
        Ok(())
    }
}

impl MessageSource for EmbeddedConsumer {
    async fn fetch(&mut self, max: usize) -> Result<Vec<Delivery>, ConsumeError> {
        if let Some((w, _)) = self.wake.as_mut() {
            w.borrow_and_update();
        }
        let out = self.fetch_now(max).await?;
        let Some((w, fetch_wait)) = self.wake.as_mut().filter(|_| out.is_empty()) else {
            return Ok(out);
        };
        if let Ok(Err(_)) = tokio::time::timeout(*fetch_wait, w.changed()).await {
            // The listener is gone: poll from now on.
            self.wake = None;
        }
        self.fetch_now(max).await
    }

    async fn release(&mut self) -> Result<(), ConsumeError> {
        self.release_leases().await
    }

    fn waits_for_messages(&self) -> bool {
        self.wake.is_some()
    }

    async fn commit(&mut self, d: &Delivery) -> Result<(), ConsumeError> {
        self.commit_all(vec![d.clone()]).await
    }

    async fn commit_all(&mut self, ds: Vec<Delivery>) -> Result<(), ConsumeError> {
        let advanced =
            transport::advance_cursors(&self.db, &self.cfg.group, &ds, &self.owner).await?;
        let mut lost = Vec::new();
        for (d, ok) in ds.iter().zip(advanced) {
            let key = (d.topic.clone(), d.partition);
            if ok {
                self.committed.insert(key, d.offset);
            } else {
                self.committed.remove(&key);
                self.renewed_at = None;
                lost.push(format!("{}/{}", d.topic, d.partition));
            }
        }
        ConsumeError::unless_leases_lost(&lost, &self.cfg.group, "offset")
    }
}

impl EmbeddedConsumer {
    /// Reads what is there now from each owned partition, in partition order.
    async fn fetch_now(&mut self, max: usize) -> Result<Vec<Delivery>, ConsumeError> {
        self.refresh_leases().await?;
        Ok(transport::fetch_after(&self.db, &self.committed, max).await?)
    }
}
