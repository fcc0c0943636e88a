//! The Kafka consumer: a consumer group member, or a reader of statically
//! assigned partitions. Either way offsets are committed only after the
//! handler's transaction commits.
//!
//! A group member commits its offsets to the broker's group coordinator. A
//! consumer with assigned partitions (`consumers[].kafka_partitions`) joins
//! no group: it keeps its offsets in its own database
//! ([`crate::store::inbox::offsets`]) and starts from them, so it depends on no
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
//!
//! A group member also watches the group's progress ([`super::liveness`]):
//! when partitions with lag make no progress for the stall time, it drops
//! its client and joins again as a new member, which makes the coordinator
//! rebalance the group.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::KafkaSetupError;
use super::client::{GroupContext, client, to_delivery};
use super::liveness::LivenessSink;
use super::liveness::{Liveness, Snapshot, Verdict, probe};
use crate::broker::ConsumeError;
use crate::broker::MessageSource;
use crate::message::Delivery;
use crate::store::{Db, inbox::offsets};

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
    /// A group member whose group has partitions with lag and no progress
    /// for this long on top of the group's `session.timeout.ms` joins again
    /// with a new client. `None`: never.
    pub stall_timeout: Option<Duration>,
    /// A group member's static-membership id (`group.instance.id`): a
    /// member that restarts with it within `session.timeout.ms` gets its
    /// partitions back without a rebalance. `None`: a dynamic member (a
    /// `group.instance.id` property still wins).
    pub instance_id: Option<String>,
}

impl KafkaConsumerConfig {
    pub fn new(group: impl Into<String>, topics: Vec<String>) -> Self {
        Self {
            group: group.into(),
            topics,
            fetch_wait: Duration::from_millis(250),
            partition_limit: 1_000,
            partitions: None,
            stall_timeout: Some(DEFAULT_STALL_TIMEOUT),
            instance_id: None,
        }
    }
}

type PartitionKey = (String, i32);

/// `consumers[].kafka_stall_timeout`'s default.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// librdkafka's `session.timeout.ms` default.
const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(45);

/// How long one request of a liveness probe may wait.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A group member's watch over its group's progress.
struct Watch {
    liveness: Liveness,
    /// When the next probe starts.
    next: Instant,
    every: Duration,
    /// The probe in flight, off the async threads.
    running: Option<tokio::task::JoinHandle<Result<Snapshot, String>>>,
}

impl Watch {
    fn new(props: &BTreeMap<String, String>, stall_timeout: Duration) -> Self {
        let session = props
            .get("session.timeout.ms")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(DEFAULT_SESSION_TIMEOUT, Duration::from_millis);
        // A dead member's partitions wait `session.timeout.ms` for the
        // coordinator to notice, and then a rebalance: the watch counts
        // from there.
        let stall_after = stall_timeout + session;
        let from_start = props.get("auto.offset.reset").is_none_or(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "earliest" | "smallest" | "beginning"
            )
        });
        let every = (stall_after / 6).clamp(Duration::from_millis(250), Duration::from_secs(5));
        let now = Instant::now();
        Self {
            liveness: Liveness::new(stall_after, from_start, now),
            next: now + every,
            every,
            running: None,
        }
    }
}

/// A consumer group member reading from Kafka.
pub struct KafkaConsumer {
    consumer: Arc<StreamConsumer<GroupContext>>,
    cfg: KafkaConsumerConfig,
    /// The user's properties, to create a new client on recovery. May
    /// hold secrets: never logged.
    props: BTreeMap<String, String>,
    /// Group members only, unless `stall_timeout` is `None`.
    watch: Option<Watch>,
    metrics: Option<Arc<dyn LivenessSink>>,
    /// Handed out and not yet committed, per partition, in offset order.
    buffer: BTreeMap<PartitionKey, VecDeque<Delivery>>,
    /// Partitions paused because their buffer reached the limit.
    paused: HashSet<PartitionKey>,
    /// How many times a partition was paused.
    pauses: u64,
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
        let consumer = subscribed(props, &cfg)?;
        let watch = cfg
            .stall_timeout
            .filter(|t| !t.is_zero())
            .map(|t| Watch::new(props, t));
        let mut this = Self::with_client(consumer, cfg, props, None);
        this.watch = watch;
        Ok(this)
    }

    /// Counts recoveries and stalled partitions in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<dyn LivenessSink>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// How long a group member waits for progress before it joins again
    /// (`None`: it does not watch).
    pub fn stall_after(&self) -> Option<Duration> {
        self.watch.as_ref().map(|w| w.liveness.stall_after())
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
        Ok(Self::with_client(consumer, cfg, props, Some(db)))
    }

    fn with_client(
        consumer: StreamConsumer<GroupContext>,
        cfg: KafkaConsumerConfig,
        props: &BTreeMap<String, String>,
        offsets_db: Option<Db>,
    ) -> Self {
        Self {
            consumer: Arc::new(consumer),
            cfg,
            props: props.clone(),
            watch: None,
            metrics: None,
            buffer: BTreeMap::new(),
            paused: HashSet::new(),
            pauses: 0,
            rotation: 0,
            offsets_db,
        }
    }

    /// Takes the answer of the liveness probe in flight, if it is there,
    /// and starts the next one when due. Never waits for a probe.
    async fn watch_group(&mut self) -> Result<(), ConsumeError> {
        let Some(watch) = self.watch.as_mut() else {
            return Ok(());
        };
        let now = Instant::now();
        let mut verdict = None;
        if watch.running.as_ref().is_some_and(|h| h.is_finished())
            && let Some(handle) = watch.running.take()
        {
            let held: std::collections::BTreeSet<PartitionKey> = self
                .buffer
                .iter()
                .filter(|(_, q)| !q.is_empty())
                .map(|(k, _)| k.clone())
                .collect();
            match handle.await {
                Ok(Ok(snap)) => {
                    let (stalled, v) = watch.liveness.observe(&snap, &held, now);
                    if let Some(m) = &self.metrics {
                        m.stalled_partitions(stalled as u64);
                    }
                    verdict = v;
                }
                Ok(Err(e)) => {
                    tracing::debug!(consumer = %self.cfg.group, error = %e, "liveness probe did not answer");
                    verdict = watch.liveness.no_answer(now);
                }
                Err(e) => {
                    tracing::warn!(consumer = %self.cfg.group, error = %e, "liveness probe task failed");
                }
            }
        }
        if verdict.is_none() && watch.running.is_none() && now >= watch.next {
            watch.next = now + watch.every;
            let consumer = self.consumer.clone();
            let topics = self.cfg.topics.clone();
            watch.running = Some(tokio::task::spawn_blocking(move || {
                probe(consumer.as_ref(), &topics, PROBE_TIMEOUT)
            }));
        }
        match verdict {
            Some(v) => self.recover(&v),
            None => Ok(()),
        }
    }

    /// Leaves the group and joins again with a new client (a new member
    /// id), which makes the coordinator rebalance. What this member held
    /// uncommitted is dropped: its partitions resume from the committed
    /// offsets, wherever they land.
    fn recover(&mut self, v: &Verdict) -> Result<(), ConsumeError> {
        let stalled: Vec<String> = v
            .stalled
            .iter()
            .map(|((t, p), lag)| format!("{t}/{p} (lag {lag})"))
            .collect();
        let assignment: Vec<String> = v
            .assignment
            .iter()
            .map(|(t, p)| format!("{t}/{p}"))
            .collect();
        tracing::warn!(
            consumer = %self.cfg.group,
            group = %self.cfg.group,
            reason = v.reason.label(),
            stalled = ?stalled,
            assignment = ?assignment,
            no_progress_for = ?v.for_how_long,
            "kafka consumer group made no progress; leaving it and joining again with a new client"
        );
        if let Some(m) = &self.metrics {
            m.recovered(v.reason.label());
        }
        // A static member that joins again with its instance id gets its
        // old assignment back without a rebalance, which is what this
        // recovery needs: the new client joins as a dynamic member.
        let dynamic = KafkaConsumerConfig {
            instance_id: None,
            ..self.cfg.clone()
        };
        let mut props = self.props.clone();
        props.remove("group.instance.id");
        let fresh = subscribed(&props, &dynamic)
            .map_err(|e| ConsumeError::Transport(format!("group `{}`: {e}", self.cfg.group)))?;
        let old = std::mem::replace(&mut self.consumer, Arc::new(fresh));
        self.buffer.clear();
        self.paused.clear();
        if let Some(watch) = self.watch.as_mut() {
            // A probe of the old client would describe the old member.
            if let Some(h) = watch.running.take() {
                h.abort();
            }
            watch.liveness.reset(Instant::now());
            watch.next = Instant::now() + watch.every;
        }
        // Closing sends LeaveGroup and may wait for the coordinator: off the
        // async threads, and nobody waits for it.
        drop(tokio::task::spawn_blocking(move || drop(old)));
        Ok(())
    }

    /// The client's fatal error, if it had one: it cannot consume again.
    /// A static member fenced by another process with the same
    /// `group.instance.id` is the usual one.
    fn fatal(&self) -> Option<ConsumeError> {
        let (code, reason) = self.consumer.client().fatal_error()?;
        let group = &self.cfg.group;
        let fenced = matches!(
            code,
            RDKafkaErrorCode::FencedInstanceId | RDKafkaErrorCode::Fenced
        );
        Some(ConsumeError::Fatal(if fenced {
            let id = self
                .props
                .get("group.instance.id")
                .or(self.cfg.instance_id.as_ref())
                .map_or("?", String::as_str);
            format!(
                "consumer `{group}`: the broker fenced this member: another process joined group \
                 `{group}` with the same instance id `{id}` ({reason}); give each process its own \
                 id (consumers[].instance_id or OUTBOXD_INSTANCE_ID) and restart this one"
            )
        } else {
            format!("consumer `{group}`: fatal Kafka client error {code:?}: {reason}")
        }))
    }

    /// How many partitions rebalances have taken from this member (since
    /// its last recovery, which starts a new client).
    pub fn partitions_revoked(&self) -> u64 {
        self.consumer
            .context()
            .revoked_total
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The partitions this member holds now.
    pub fn assignment(&self) -> std::collections::BTreeSet<(String, i32)> {
        self.consumer
            .assignment()
            .map(|list| {
                list.elements()
                    .iter()
                    .map(|e| (e.topic().to_string(), e.partition()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether the group rebalances incrementally (the cooperative-sticky
    /// assignor, outboxd's default) rather than revoking every partition.
    pub fn rebalances_incrementally(&self) -> bool {
        matches!(
            self.consumer.rebalance_protocol(),
            rdkafka::consumer::RebalanceProtocol::Cooperative
        )
    }

    /// How many times a partition was paused because its buffer was full.
    pub fn pauses(&self) -> u64 {
        self.pauses
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
            self.pauses += 1;
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
                    if let Some(fatal) = self.fatal() {
                        return Err(fatal);
                    }
                    if pulled > 0 || self.buffered() > 0 {
                        tracing::warn!(error = %e, group = %self.cfg.group, "kafka consumer error");
                        break;
                    }
                    return Err(ConsumeError::Transport(explain_consume_error(
                        &self.cfg.group,
                        &e,
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

/// A consume error as the operator reads it: the group and, where one
/// error has one usual cause, the fix.
fn explain_consume_error(group: &str, e: &rdkafka::error::KafkaError) -> String {
    if e.rdkafka_error_code() == Some(RDKafkaErrorCode::InconsistentGroupProtocol) {
        return format!(
            "group `{group}`: {e}: the group's other members use an assignor this member does \
             not (outboxd members use cooperative-sticky; an older outboxd or another client may \
             use range), and librdkafka cannot mix an eager assignor with a cooperative one; set \
             \"partition.assignment.strategy\" in [transport.kafka] to the other members' \
             assignor until every member runs with one setting (docs/kafka.md)"
        );
    }
    format!("group `{group}`: {e}")
}

impl MessageSource for KafkaConsumer {
    async fn fetch(&mut self, max: usize) -> Result<Vec<Delivery>, ConsumeError> {
        self.watch_group().await?;
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
                    if let Some(fatal) = self.fatal() {
                        return fatal;
                    }
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

/// A new client of `cfg.group`, subscribed to `cfg.topics`.
fn subscribed(
    props: &BTreeMap<String, String>,
    cfg: &KafkaConsumerConfig,
) -> Result<StreamConsumer<GroupContext>, KafkaSetupError> {
    let consumer = client(props, cfg)?;
    let topics: Vec<&str> = cfg.topics.iter().map(String::as_str).collect();
    consumer
        .subscribe(&topics)
        .map_err(|e| KafkaSetupError::Client {
            role: "consumer",
            message: format!("group `{}` cannot subscribe to {topics:?}: {e}", cfg.group),
        })?;
    Ok(consumer)
}

#[cfg(test)]
mod tests {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};

    #[test]
    fn a_join_refused_for_another_assignor_names_the_property() {
        let e = KafkaError::MessageConsumption(RDKafkaErrorCode::InconsistentGroupProtocol);
        let text = super::explain_consume_error("billing", &e);
        assert!(text.contains("group `billing`"), "{text}");
        assert!(text.contains("partition.assignment.strategy"), "{text}");
        let other = KafkaError::MessageConsumption(RDKafkaErrorCode::BrokerTransportFailure);
        let text = super::explain_consume_error("billing", &other);
        assert!(!text.contains("partition.assignment.strategy"), "{text}");
    }
}
