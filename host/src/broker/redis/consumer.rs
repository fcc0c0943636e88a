//! A consumer group member reading Redis Streams.
//!
//! Each partition's stream has one Redis consumer group per outboxd
//! consumer (its name), created at the stream's start (`0`) when missing.
//! Partitions are leased to members through the `transport_members` /
//! `transport_cursors` leases the embedded transport uses (group
//! `redis:NAME`), so only a partition's owner reads it, as the Redis
//! consumer named after the member: one reader per partition keeps each
//! key's order. The owner acknowledges (`XACK`) after the inbox commit.
//!
//! The cursor in the database (the last entry whose effect committed) is
//! the truth. A member that takes a partition first claims every entry the
//! group holds unacknowledged there (`XAUTOCLAIM … 0`: a dead member's
//! pending entries come back at once, not after an idle time), then reads
//! its own pending entries from the start, in order, and only then new
//! ones (`>`). An entry at or below the cursor is handled work: it is
//! acknowledged and skipped. A read that fails may have been delivered
//! without its reply reaching us, so after it each partition reads its
//! pending entries again from the last one held.
//!
//! Entry ids `MS-SEQ` map to the cursor's i64 as `MS << 20 | SEQ`
//! ([`offset_of`]), which keeps their order while SEQ is below 2^20 (a
//! million entries within one millisecond of one stream) and MS below 2^43
//! (the year 2248).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use ::redis::Value;
use ::redis::streams::{StreamAutoClaimReply, StreamInfoConsumersReply, StreamInfoGroupsReply};
use chrono::Utc;
use uuid::Uuid;

use super::{Client, Connection, HEADER_PREFIX, ID_FIELD, KEY_FIELD, PAYLOAD_FIELD, stream_key};
use crate::broker::{ConsumeError, MessageSource};
use crate::message::{Delivery, headers};
use crate::store::Db;
use crate::store::transport;

/// Settings of one Redis consumer.
#[derive(Debug, Clone)]
pub struct RedisConsumerConfig {
    pub group: String,
    pub topics: Vec<String>,
    pub partitions: i32,
    /// How long a partition stays ours without renewal.
    pub lease: Duration,
    /// How long an idle read blocks for new entries.
    pub fetch_wait: Duration,
    /// Entries read from a partition's stream at a time.
    pub batch: usize,
}

/// Bits of an offset that hold an entry id's sequence number.
const SEQ_BITS: u32 = 20;

/// The cursor offset of stream entry id `MS-SEQ`: `MS << 20 | SEQ`, in
/// the entries' order; `None` for an id outside what that holds.
pub fn offset_of(id: &str) -> Option<i64> {
    let (ms, seq) = id.split_once('-')?;
    let (ms, seq): (i64, i64) = (ms.parse().ok()?, seq.parse().ok()?);
    if !(0..1 << (63 - SEQ_BITS)).contains(&ms) || !(0..1 << SEQ_BITS).contains(&seq) {
        return None;
    }
    Some(ms << SEQ_BITS | seq)
}

/// The stream entry id of a cursor offset ([`offset_of`] reversed).
pub fn id_of(offset: i64) -> String {
    format!("{}-{}", offset >> SEQ_BITS, offset & ((1 << SEQ_BITS) - 1))
}

/// One stream entry as Redis returned it; `fields` is `None` for a pending
/// entry that was trimmed away before it was acknowledged.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub id: String,
    pub fields: Option<Vec<(Vec<u8>, Vec<u8>)>>,
}

fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.clone().into_bytes()),
        _ => None,
    }
}

/// The entries of an XRANGE reply (`[[id, [field, value, …]], …]`).
pub fn entries_of(v: &Value) -> Vec<Entry> {
    let Value::Array(items) = v else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let Value::Array(pair) = item else {
                return None;
            };
            let id = String::from_utf8(bytes(pair.first()?)?).ok()?;
            let fields = match pair.get(1) {
                Some(Value::Array(kv)) => Some(
                    kv.chunks(2)
                        .filter_map(|c| Some((bytes(c.first()?)?, bytes(c.get(1)?)?)))
                        .collect(),
                ),
                Some(Value::Map(kv)) => Some(
                    kv.iter()
                        .filter_map(|(k, v)| Some((bytes(k)?, bytes(v)?)))
                        .collect(),
                ),
                _ => None,
            };
            Some(Entry { id, fields })
        })
        .collect()
}

/// The entries per stream of an XREADGROUP reply (`[[key, entries], …]`,
/// or nil when a blocking read timed out).
fn streams_of(v: &Value) -> BTreeMap<String, Vec<Entry>> {
    let pairs: Vec<(&Value, &Value)> = match v {
        Value::Array(items) => items
            .iter()
            .filter_map(|i| match i {
                Value::Array(p) if p.len() == 2 => Some((&p[0], &p[1])),
                _ => None,
            })
            .collect(),
        Value::Map(kv) => kv.iter().map(|(k, v)| (k, v)).collect(),
        _ => Vec::new(),
    };
    pairs
        .into_iter()
        .filter_map(|(k, e)| Some((String::from_utf8(bytes(k)?).ok()?, entries_of(e))))
        .collect()
}

/// The [`Delivery`] of an entry outboxd wrote: the key, the payload and the
/// headers from their fields, the message id from `id` when no
/// `message-id` header came along.
fn delivery_of(
    topic: &str,
    partition: i32,
    offset: i64,
    fields: &[(Vec<u8>, Vec<u8>)],
) -> Delivery {
    let mut d = Delivery {
        topic: topic.to_string(),
        partition,
        offset,
        key: None,
        payload: Vec::new(),
        headers: Vec::new(),
        attempt: 0,
    };
    let mut id = None;
    for (k, v) in fields {
        match k.as_slice() {
            k if k == KEY_FIELD.as_bytes() => d.key = Some(v.clone()),
            k if k == PAYLOAD_FIELD.as_bytes() => d.payload = v.clone(),
            k if k == ID_FIELD.as_bytes() => id = Some(v.clone()),
            k => {
                if let Some(name) = k.strip_prefix(HEADER_PREFIX.as_bytes()) {
                    d.headers
                        .push((String::from_utf8_lossy(name).into_owned(), v.clone()));
                }
            }
        }
    }
    if let Some(id) = id
        && d.header(headers::MESSAGE_ID).is_none()
    {
        d.headers.push((headers::MESSAGE_ID.to_string(), id));
    }
    d
}

/// One partition this member owns.
struct Owned {
    /// The last offset whose effect committed.
    cursor: i64,
    /// While `Some(id)`, this member's pending entries after `id` are read
    /// (again) before any new one.
    pending_after: Option<String>,
    /// Read, not committed yet, in stream order, with their entry ids.
    held: VecDeque<(Delivery, String)>,
}

impl Owned {
    /// The last offset read: the held tail, else the cursor.
    fn read_to(&self) -> i64 {
        self.held.back().map_or(self.cursor, |(d, _)| d.offset)
    }
}

pub struct RedisConsumer {
    db: Db,
    client: Client,
    conn: Option<Connection>,
    cfg: RedisConsumerConfig,
    owner: String,
    owned: BTreeMap<(String, i32), Owned>,
    renewed_at: Option<Instant>,
}

impl RedisConsumer {
    pub fn new(db: Db, client: Client, cfg: RedisConsumerConfig) -> Self {
        Self {
            db,
            client,
            conn: None,
            cfg,
            owner: Uuid::new_v4().to_string(),
            owned: BTreeMap::new(),
            renewed_at: None,
        }
    }

    /// The lease group of consumer group `group` in `transport_cursors`.
    pub fn lease_group(group: &str) -> String {
        format!("redis:{group}")
    }

    /// The partitions this member owns right now.
    pub fn assignment(&self) -> Vec<(String, i32)> {
        self.owned.keys().cloned().collect()
    }

    /// This member's connection (its blocking reads hold up no one else's
    /// commands), opened at the first use.
    async fn conn(&mut self) -> Result<Connection, ConsumeError> {
        if let Some(c) = &self.conn {
            return Ok(c.clone());
        }
        let c = self
            .client
            .connect(self.cfg.fetch_wait + Duration::from_secs(10))
            .await
            .map_err(|e| ConsumeError::Transport(e.to_string()))?;
        self.conn = Some(c.clone());
        Ok(c)
    }

    /// Takes free or expired partitions and renews the ones held; a newly
    /// taken one claims the group's pending entries there first.
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
            let entry = match self.owned.remove(&key) {
                Some(o) => o,
                None => self.take_over(&key, cursor).await?,
            };
            owned.insert(key, entry);
        }
        self.owned = owned;
        self.renewed_at = Some(Instant::now());
        Ok(())
    }

    /// Starts owning `key`: makes sure the group exists on its stream,
    /// claims every entry the group holds unacknowledged there (a previous
    /// owner's), and forgets consumers that hold nothing and have been idle
    /// longer than a lease.
    async fn take_over(&mut self, key: &(String, i32), cursor: i64) -> Result<Owned, ConsumeError> {
        let mut conn = self.conn().await?;
        let stream = stream_key(&key.0, key.1);
        let group = &self.cfg.group;
        let created: Result<(), ::redis::RedisError> = ::redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&stream)
            .arg(group)
            .arg("0")
            .query_async(&mut conn)
            .await;
        match created {
            Ok(()) => {}
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) if e.to_string().contains("requires the key to exist") => {
                return Err(ConsumeError::Transport(format!(
                    "Redis stream `{stream}` (topic `{}`) does not exist; start outboxd with \
                     [transport.topics] create = true, or create it",
                    key.0
                )));
            }
            Err(e) => return Err(transport_error(&stream, &e)),
        }
        let mut start = "0-0".to_string();
        let mut trimmed = 0usize;
        loop {
            let reply: StreamAutoClaimReply = ::redis::cmd("XAUTOCLAIM")
                .arg(&stream)
                .arg(group)
                .arg(&self.owner)
                .arg(0)
                .arg(&start)
                .arg("COUNT")
                .arg(1000)
                .arg("JUSTID")
                .query_async(&mut conn)
                .await
                .map_err(|e| transport_error(&stream, &e))?;
            trimmed += reply.deleted_ids.len();
            if reply.next_stream_id == "0-0" {
                break;
            }
            start = reply.next_stream_id;
        }
        if trimmed > 0 {
            tracing::warn!(%stream, %group, entries = trimmed, "entries read and not acknowledged were trimmed from the stream before they were handled; raise transport.redis.maxlen above the largest backlog");
        }
        self.forget_idle_consumers(&mut conn, &stream).await;
        Ok(Owned {
            cursor,
            pending_after: Some("0-0".into()),
            held: VecDeque::new(),
        })
    }

    /// Deletes the group's consumers on `stream` that hold no entry and
    /// have been idle for two leases (members that died or moved on): they
    /// hold nothing, so nothing is lost, and a live one is recreated by its
    /// next read. Best effort.
    async fn forget_idle_consumers(&self, conn: &mut Connection, stream: &str) {
        let group = &self.cfg.group;
        let Ok(info) = ::redis::cmd("XINFO")
            .arg("CONSUMERS")
            .arg(stream)
            .arg(group)
            .query_async::<StreamInfoConsumersReply>(conn)
            .await
        else {
            return;
        };
        let idle_ms = (self.cfg.lease * 2).as_millis() as usize;
        for c in info.consumers {
            if c.name != self.owner && c.pending == 0 && c.idle > idle_ms {
                let _ = ::redis::cmd("XGROUP")
                    .arg("DELCONSUMER")
                    .arg(stream)
                    .arg(group)
                    .arg(&c.name)
                    .query_async::<i64>(conn)
                    .await;
            }
        }
    }

    /// Reads what the owned partitions have next: pending entries where a
    /// partition re-reads them, new ones elsewhere, blocking up to `wait`
    /// only when nothing is held or pending.
    async fn read(&mut self, wait: Duration) -> Result<(), ConsumeError> {
        let batch = self.cfg.batch.max(1);
        let want = |o: &Owned| o.held.len() < batch;
        let pending: Vec<(String, String)> = self
            .owned
            .iter()
            .filter(|(_, o)| want(o))
            .filter_map(|((t, p), o)| Some((stream_key(t, *p), o.pending_after.clone()?)))
            .collect();
        let fresh: Vec<(String, String)> = self
            .owned
            .iter()
            .filter(|(_, o)| want(o) && o.pending_after.is_none())
            .map(|((t, p), _)| (stream_key(t, *p), ">".to_string()))
            .collect();
        let mut got = BTreeMap::new();
        let mut failed = None;
        if !pending.is_empty() {
            match self.read_group(&pending, None).await {
                Ok(r) => {
                    // A partition whose pending entries are all read again
                    // goes on to new ones.
                    for (stream, _) in &pending {
                        if r.get(stream).is_none_or(Vec::is_empty) {
                            self.set_pending(stream, None);
                        }
                    }
                    got.extend(r);
                }
                Err(e) => failed = Some(e),
            }
        }
        if failed.is_none() && !fresh.is_empty() {
            let idle =
                got.values().all(Vec::is_empty) && self.owned.values().all(|o| o.held.is_empty());
            let block = (idle && !wait.is_zero()).then_some(wait);
            match self.read_group(&fresh, block).await {
                Ok(r) => got.extend(r),
                Err(e) => failed = Some(e),
            }
        }
        self.take_entries(got).await;
        if let Some(e) = failed {
            // The server may have handed out entries whose reply was lost:
            // they are this member's pending entries now, read again next.
            for o in self.owned.values_mut() {
                o.pending_after = Some(o.held.back().map_or("0-0".into(), |(_, id)| id.clone()));
            }
            return Err(e);
        }
        Ok(())
    }

    fn set_pending(&mut self, stream: &str, to: Option<String>) {
        if let Some(o) = self
            .owned
            .iter_mut()
            .find(|((t, p), _)| stream_key(t, *p) == stream)
            .map(|(_, o)| o)
        {
            o.pending_after = to;
        }
    }

    /// One XREADGROUP over `streams` (each with the id to read after).
    async fn read_group(
        &mut self,
        streams: &[(String, String)],
        block: Option<Duration>,
    ) -> Result<BTreeMap<String, Vec<Entry>>, ConsumeError> {
        let mut conn = self.conn().await?;
        let mut cmd = ::redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.cfg.group)
            .arg(&self.owner)
            .arg("COUNT")
            .arg(self.cfg.batch.max(1));
        if let Some(b) = block {
            cmd.arg("BLOCK").arg(b.as_millis().max(1) as u64);
        }
        cmd.arg("STREAMS");
        for (s, _) in streams {
            cmd.arg(s);
        }
        for (_, id) in streams {
            cmd.arg(id);
        }
        let reply: Value = cmd.query_async(&mut conn).await.map_err(|e| {
            if e.code() == Some("NOGROUP") {
                // The group or the stream went away (a server that lost its
                // data): take the partitions over again, which recreates it.
                self.renewed_at = None;
                self.owned.clear();
            }
            transport_error(&streams[0].0, &e)
        })?;
        Ok(streams_of(&reply))
    }

    /// Files what a read returned under its partitions: entries at or below
    /// the cursor are acknowledged and skipped, entries already held are
    /// skipped, and entries trimmed before they were handled are reported.
    async fn take_entries(&mut self, got: BTreeMap<String, Vec<Entry>>) {
        let mut handled: Vec<(String, Vec<String>)> = Vec::new();
        for ((topic, partition), o) in self.owned.iter_mut() {
            let stream = stream_key(topic, *partition);
            let Some(entries) = got.get(&stream) else {
                continue;
            };
            let mut ack = Vec::new();
            for e in entries {
                if o.pending_after.is_some() {
                    o.pending_after = Some(e.id.clone());
                }
                let Some(offset) = offset_of(&e.id) else {
                    tracing::error!(%stream, entry = %e.id, "a stream entry id outside the cursor's range (over 2^20 entries in one millisecond); it is skipped");
                    continue;
                };
                if offset <= o.cursor {
                    ack.push(e.id.clone());
                    continue;
                }
                if offset <= o.read_to() {
                    continue;
                }
                let Some(fields) = &e.fields else {
                    tracing::warn!(%stream, entry = %e.id, group = %self.cfg.group, "an entry read and not acknowledged was trimmed from the stream before it was handled; raise transport.redis.maxlen above the largest backlog");
                    ack.push(e.id.clone());
                    continue;
                };
                o.held
                    .push_back((delivery_of(topic, *partition, offset, fields), e.id.clone()));
            }
            if !ack.is_empty() {
                handled.push((stream, ack));
            }
        }
        if !handled.is_empty() {
            self.ack(handled).await;
        }
    }

    /// XACKs `ids` per stream in one pipeline. A lost ack only means a
    /// pending entry that a later owner skips (it is at or below the
    /// cursor).
    async fn ack(&mut self, ids: Vec<(String, Vec<String>)>) {
        let Ok(mut conn) = self.conn().await else {
            return;
        };
        let mut pipe = ::redis::pipe();
        for (stream, ids) in &ids {
            pipe.cmd("XACK")
                .arg(stream)
                .arg(&self.cfg.group)
                .arg(ids)
                .ignore();
        }
        if let Err(e) = pipe.query_async::<()>(&mut conn).await {
            tracing::debug!(error = %e, "Redis XACK failed; the entries stay pending and are skipped when read again");
        }
    }

    /// What each owned partition holds, first in, up to `max` in all,
    /// waiting up to `wait` for a first entry when none is held.
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
        self.read(wait).await?;
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

fn transport_error(stream: &str, e: &::redis::RedisError) -> ConsumeError {
    ConsumeError::Transport(format!("Redis stream `{stream}`: {e}"))
}

impl MessageSource for RedisConsumer {
    async fn fetch(&mut self, max: usize) -> Result<Vec<Delivery>, ConsumeError> {
        let wait = self.cfg.fetch_wait;
        self.fetch_now(max, wait).await
    }

    async fn release(&mut self) -> Result<(), ConsumeError> {
        transport::release_leases(&self.db, &self.owner).await?;
        self.owned.clear();
        Ok(())
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
        let mut acks = Vec::new();
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
            let mut ids = Vec::new();
            while o.held.front().is_some_and(|(h, _)| h.offset <= d.offset) {
                if let Some((_, id)) = o.held.pop_front() {
                    ids.push(id);
                }
            }
            if !ids.is_empty() {
                acks.push((stream_key(&d.topic, d.partition), ids));
            }
        }
        if !acks.is_empty() {
            self.ack(acks).await;
        }
        ConsumeError::unless_leases_lost(&lost, &self.cfg.group, "entry")
    }
}

/// How many entries consumer group `group` has not acknowledged on
/// `topics`: per partition's stream, the group's lag (entries not yet read)
/// plus its pending entries (read, not acknowledged), or every entry of
/// the stream when the group has not read it yet (for `/api/consumers`).
pub async fn messages_behind(
    conn: &mut Connection,
    group: &str,
    topics: &[String],
    partitions: i32,
) -> Result<i64, String> {
    let mut behind: i64 = 0;
    for topic in topics {
        for partition in 0..partitions.max(1) {
            let stream = stream_key(topic, partition);
            let len: i64 = ::redis::cmd("XLEN")
                .arg(&stream)
                .query_async(conn)
                .await
                .map_err(|e| format!("Redis stream `{stream}` (topic `{topic}`): {e}"))?;
            let groups: StreamInfoGroupsReply = match ::redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(&stream)
                .query_async(conn)
                .await
            {
                Ok(g) => g,
                // No such stream: nothing published to it yet.
                Err(_) if len == 0 => continue,
                Err(e) => return Err(format!("Redis stream `{stream}`: {e}")),
            };
            let n = match groups.groups.iter().find(|g| g.name == group) {
                // The lag is unknown after entries were deleted from the
                // middle of the stream: every entry is the upper bound.
                Some(g) => g.lag.map_or(len, |l| l as i64) + g.pending as i64,
                None => len,
            };
            behind = behind.saturating_add(n);
        }
    }
    Ok(behind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_map_to_offsets_in_their_order_and_back() {
        let ids = [
            "0-1",
            "1-0",
            "1-1",
            "1-1048575",
            "2-0",
            "1733400000000-0",
            "1733400000000-7",
        ];
        let offsets: Vec<i64> = ids.iter().map(|i| offset_of(i).expect(i)).collect();
        assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
        for (id, o) in ids.iter().zip(&offsets) {
            assert_eq!(&id_of(*o), id);
        }
        assert_eq!(offset_of("0-0"), Some(0), "the cursor before any entry");
        assert_eq!(offset_of("1-1048576"), None, "a sequence past 2^20");
        assert_eq!(offset_of("8796093022208-0"), None, "milliseconds past 2^43");
        assert_eq!(offset_of("x-1"), None);
    }

    #[test]
    fn an_entry_becomes_a_delivery_with_its_key_payload_headers_and_message_id() {
        let f = |k: &str, v: &[u8]| (k.as_bytes().to_vec(), v.to_vec());
        let d = delivery_of(
            "orders",
            2,
            9,
            &[
                f("id", b"00000000-0000-0000-0000-000000000001"),
                f("key", &[0xff, b'k']),
                f("payload", b"{}"),
                f("h:traceparent", b"00-a-b-01"),
                f("stray", b"x"),
            ],
        );
        assert_eq!(d.key.as_deref(), Some(&[0xff, b'k'][..]));
        assert_eq!(d.payload, b"{}");
        assert_eq!(d.header("traceparent"), Some(&b"00-a-b-01"[..]));
        assert_eq!(
            d.message_id().expect("id").to_string(),
            "00000000-0000-0000-0000-000000000001"
        );
        assert_eq!(d.headers.len(), 2, "{:?}", d.headers);
    }

    #[test]
    fn replies_are_read_including_trimmed_pending_entries() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("orders:0"),
            Value::Array(vec![
                Value::Array(vec![
                    bulk("5-0"),
                    Value::Array(vec![bulk("payload"), bulk("{}")]),
                ]),
                Value::Array(vec![bulk("6-0"), Value::Nil]),
            ]),
        ])]);
        let got = streams_of(&reply);
        let entries = &got["orders:0"];
        assert_eq!(entries.len(), 2);
        assert_eq!(
            entries[0].fields.as_deref(),
            Some(&[(b"payload".to_vec(), b"{}".to_vec())][..])
        );
        assert_eq!(
            entries[1],
            Entry {
                id: "6-0".into(),
                fields: None
            }
        );
        assert!(
            streams_of(&Value::Nil).is_empty(),
            "a blocking read that timed out"
        );
    }
}
