//! The embedded transport: a durable SQL pub/sub in the outbox's own
//! database, so the whole pipeline runs with nothing else installed.
//!
//! A topic has a fixed number of partitions and a message's partition comes
//! from its key, so one aggregate keeps its order as it does on Kafka. Each
//! consumer group has a cursor per partition, advanced only after handling
//! commits, and owns a partition through a lease that expires when the
//! consumer dies (then another member resumes from the cursor).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use chrono::Utc;
use sqlx::Row;
use uuid::Uuid;

use super::group_commit::{GroupCommit, GroupRow};
use super::{ConsumeError, Delivery, MessageSource, OutgoingMessage, PublishError, Publisher};
use crate::store::sqlite::micros;
use crate::store::{Db, on_pool};

/// Takes the free or expired partitions of one topic and renews ours.
const TAKE_LEASES: &str = "UPDATE transport_cursors SET lease_owner = $3, lease_until = $4
     WHERE consumer_group = $1 AND topic = $2
       AND (lease_owner IS NULL OR lease_owner = $3 OR lease_until < $5)
     RETURNING partition, last_offset";
const TAKE_LEASES_PG: &str = "UPDATE transport_cursors
       SET lease_owner = $3, lease_until = to_timestamp($4::bigint / 1000000.0)
     WHERE consumer_group = $1 AND topic = $2
       AND (lease_owner IS NULL OR lease_owner = $3 OR lease_until < to_timestamp($5::bigint / 1000000.0))
     RETURNING CAST(partition AS bigint), last_offset";

/// The next messages of one partition after an offset.
const FETCH_AFTER: &str =
    "SELECT \"offset\", message_key, payload, headers::text FROM transport_messages
    WHERE topic = $1 AND partition = $2 AND \"offset\" > $3
    ORDER BY \"offset\" LIMIT $4";
const FETCH_AFTER_SQLITE: &str =
    "SELECT \"offset\", message_key, payload, headers FROM transport_messages
    WHERE topic = $1 AND partition = $2 AND \"offset\" > $3
    ORDER BY \"offset\" LIMIT $4";

/// Headers as this transport stores them (a JSON array of `[name,
/// hex(value)]` pairs), kept in `outboxd-core` for the fuzz targets.
pub use outboxd_core::embedded_headers::{headers_json, parse_headers};

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

pub(super) fn db_error(e: sqlx::Error) -> PublishError {
    // A database that is down is worth retrying; a constraint violation is not.
    match &e {
        sqlx::Error::Database(d) if d.is_check_violation() || d.is_foreign_key_violation() => {
            PublishError::Permanent(format!("embedded transport rejected the message: {e}"))
        }
        _ => PublishError::Retryable(format!("embedded transport: {e}")),
    }
}

impl Publisher for EmbeddedPublisher {
    async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        let partition = partition_for(&msg.key, self.partitions);
        // One transaction for everything published at this moment.
        self.group
            .publish(&self.db, GroupRow::new(msg, partition))
            .await
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

/// The channel a Postgres publish notifies at commit, so waiting consumers
/// fetch at once instead of at their next poll.
pub const NOTIFY_CHANNEL: &str = "outboxd_transport";

/// A consumer group member reading from the embedded transport.
pub struct EmbeddedConsumer {
    db: Db,
    cfg: EmbeddedConsumerConfig,
    owner: String,
    /// Committed offset of each owned partition.
    committed: HashMap<(String, i32), i64>,
    renewed_at: Option<Instant>,
    /// Postgres: ticks when something was published ([`NOTIFY_CHANNEL`]);
    /// an empty fetch waits for it, up to `fetch_wait`.
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
    /// publish notification; see [`crate::store::postgres::listen`] and
    /// [`NOTIFY_CHANNEL`]) and then look again, so a message is handed out
    /// as soon as it is committed, without polling fast.
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
    pub async fn release(&mut self) -> Result<(), ConsumeError> {
        match &self.db {
            Db::Postgres(pool) => {
                sqlx::query("UPDATE transport_cursors SET lease_owner = NULL, lease_until = NULL WHERE lease_owner = $1")
                    .bind(&self.owner)
                    .execute(pool)
                    .await?;
            }
            Db::Sqlite(pool) => {
                sqlx::query("UPDATE transport_cursors SET lease_owner = NULL, lease_until = NULL WHERE lease_owner = $1")
                    .bind(&self.owner)
                    .execute(pool)
                    .await?;
            }
        }
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
        // Both databases bind the times as microseconds since the epoch
        // (SQLite's storage) and return the partition as a bigint.
        let take = match &self.db {
            Db::Postgres(_) => TAKE_LEASES_PG,
            Db::Sqlite(_) => TAKE_LEASES,
        };
        for topic in &self.cfg.topics {
            on_pool!(&self.db, |pool| {
                for p in 0..self.cfg.partitions {
                    sqlx::query("INSERT INTO transport_cursors (consumer_group, topic, partition) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING")
                        .bind(&self.cfg.group).bind(topic).bind(p).execute(pool).await?;
                }
                let rows = sqlx::query(take)
                    .bind(&self.cfg.group)
                    .bind(topic)
                    .bind(&self.owner)
                    .bind(micros(until))
                    .bind(micros(now))
                    .fetch_all(pool)
                    .await?;
                for r in rows {
                    owned.insert(
                        (topic.clone(), r.get::<i64, _>(0) as i32),
                        r.get::<i64, _>(1),
                    );
                }
            });
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

    fn waits_for_messages(&self) -> bool {
        self.wake.is_some()
    }

    async fn commit(&mut self, d: &Delivery) -> Result<(), ConsumeError> {
        self.commit_now(d).await
    }
}

impl EmbeddedConsumer {
    /// Reads what is there now from each owned partition, in partition order.
    async fn fetch_now(&mut self, max: usize) -> Result<Vec<Delivery>, ConsumeError> {
        self.refresh_leases().await?;
        if let Db::Sqlite(pool) = &self.db {
            return self.fetch_now_sqlite(pool.clone(), max).await;
        }
        let mut out = Vec::new();
        let mut parts: Vec<_> = self
            .committed
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        parts.sort();
        for ((topic, partition), after) in parts {
            if out.len() >= max {
                break;
            }
            let limit = (max - out.len()) as i64;
            // SQLite keeps headers as text already.
            let sql = match &self.db {
                Db::Postgres(_) => FETCH_AFTER,
                Db::Sqlite(_) => FETCH_AFTER_SQLITE,
            };
            on_pool!(&self.db, |pool| {
                let rows = sqlx::query(sql)
                    .bind(&topic)
                    .bind(partition)
                    .bind(after)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?;
                for r in rows {
                    out.push(Delivery {
                        attempt: 0,
                        topic: topic.clone(),
                        partition,
                        offset: r.get(0),
                        key: r.get(1),
                        payload: r.get(2),
                        headers: parse_headers(r.get::<&str, _>(3)),
                    });
                }
            });
        }
        Ok(out)
    }

    /// SQLite: one query per topic for all owned partitions (a round trip per
    /// partition on every fetch adds up, with one writer at a time anyway).
    /// Offsets are one AUTOINCREMENT sequence over the whole table, so
    /// merging by offset keeps each partition's order.
    async fn fetch_now_sqlite(
        &mut self,
        pool: sqlx::SqlitePool,
        max: usize,
    ) -> Result<Vec<Delivery>, ConsumeError> {
        let mut by_topic: BTreeMap<String, Vec<(i32, i64)>> = BTreeMap::new();
        for ((topic, partition), after) in &self.committed {
            by_topic
                .entry(topic.clone())
                .or_default()
                .push((*partition, *after));
        }
        let mut out = Vec::new();
        for (topic, mut parts) in by_topic {
            if out.len() >= max {
                break;
            }
            parts.sort_unstable();
            // One indexed range scan per partition, merged by offset.
            let scans: Vec<String> = (0..parts.len())
                .map(|i| {
                    format!(
                        "SELECT * FROM (SELECT \"offset\", partition, message_key, payload, headers
                           FROM transport_messages
                          WHERE topic = $1 AND partition = ${} AND \"offset\" > ${}
                          ORDER BY \"offset\" LIMIT $2)",
                        2 * i + 3,
                        2 * i + 4
                    )
                })
                .collect();
            let sql = format!("{} ORDER BY 1 LIMIT $2", scans.join(" UNION ALL "));
            let mut q = sqlx::query(&sql)
                .bind(&topic)
                .bind((max - out.len()) as i64);
            for (partition, after) in &parts {
                q = q.bind(*partition).bind(*after);
            }
            for r in q.fetch_all(&pool).await? {
                out.push(Delivery {
                    attempt: 0,
                    topic: topic.clone(),
                    partition: r.get::<i64, _>(1) as i32,
                    offset: r.get(0),
                    key: r.get(2),
                    payload: r.get(3),
                    headers: parse_headers(r.get::<&str, _>(4)),
                });
            }
        }
        Ok(out)
    }

    async fn commit_now(&mut self, d: &Delivery) -> Result<(), ConsumeError> {
        let sql = "UPDATE transport_cursors SET last_offset = $4
                    WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND lease_owner = $5";
        let affected = match &self.db {
            Db::Postgres(pool) => sqlx::query(sql)
                .bind(&self.cfg.group)
                .bind(&d.topic)
                .bind(d.partition)
                .bind(d.offset)
                .bind(&self.owner)
                .execute(pool)
                .await?
                .rows_affected(),
            Db::Sqlite(pool) => sqlx::query(sql)
                .bind(&self.cfg.group)
                .bind(&d.topic)
                .bind(d.partition)
                .bind(d.offset)
                .bind(&self.owner)
                .execute(pool)
                .await?
                .rows_affected(),
        };
        let key = (d.topic.clone(), d.partition);
        if affected == 0 {
            // Lost the lease: another member took the partition and will
            // redeliver from the last committed offset (at least once).
            self.committed.remove(&key);
            self.renewed_at = None;
            return Err(ConsumeError::Transport(format!(
                "lost the lease on {}/{} for group {}; the new owner resumes from the last committed offset",
                d.topic, d.partition, self.cfg.group
            )));
        }
        self.committed.insert(key, d.offset);
        Ok(())
    }
}
