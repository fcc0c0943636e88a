//! Consumer-group liveness: notices a group that has work no member is
//! doing, so a member can rejoin instead of waiting forever.
//!
//! Every few seconds a group member reads, for every partition of its
//! topics, the high watermark and the group's committed offset, and its own
//! assignment ([`probe`]). [`Liveness`] keeps, per partition, when its
//! committed offset last moved. A partition *stalls* when it has lag
//! (messages past the committed offset) and its committed offset has not
//! moved for the stall time. A partition this member holds messages of is
//! never counted: its handler is working on them (or failing, which is the
//! handler's story, told by the failure metrics and dead letters).
//!
//! The stall time is `consumers[].kafka_stall_timeout` on top of the group's
//! `session.timeout.ms`: after a member dies, its partitions legitimately
//! wait that long for the coordinator to notice, and then for a rebalance
//! (librdkafka's mock cluster took up to 12 s with 6 s sessions; counting
//! from the session timeout alone made members rejoin in the middle of it).
//!
//! Why: tansu 0.6.0's coordinator, when a member misses its heartbeats,
//! drops it and puts the group back into "forming" without a leader and
//! without a new generation, so the surviving members' heartbeats keep
//! succeeding and nobody is told to rebalance. The dead member's partitions
//! then have no owner until some member joins afresh. A fresh member (a new
//! client: new member id) is exactly what the recovery creates.
//!
//! The recoveries and the stalled partitions are counted per consumer
//! ([`LivenessFamilies`], at the end of this file).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

type PartitionKey = (String, i32);

/// Why a member recovered, as the metric's `reason` label shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reason {
    /// The member holds no partition while the group has stalled ones.
    NoAssignment,
    /// Partitions with lag made no progress, though the member has some.
    Stalled,
    /// The member could not read the group's state for the stall time
    /// (the coordinator or the brokers do not answer).
    Unreachable,
}

impl Reason {
    pub(super) fn label(self) -> &'static str {
        match self {
            Reason::NoAssignment => "no_assignment",
            Reason::Stalled => "stalled",
            Reason::Unreachable => "unreachable",
        }
    }
}

/// One look at the group from one member.
#[derive(Debug, Clone, Default)]
pub(super) struct Snapshot {
    /// What this member is assigned.
    pub assignment: BTreeSet<PartitionKey>,
    /// Every partition of the member's topics: the group's committed
    /// offset (`None`: never committed) and the log's low and high marks.
    pub partitions: BTreeMap<PartitionKey, Marks>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Marks {
    pub committed: Option<i64>,
    pub low: i64,
    pub high: i64,
}

impl Marks {
    /// Messages past the committed offset. A partition never committed
    /// starts at the log's start (`auto.offset.reset = earliest`, what
    /// outboxd sets) or at its end (`from_start` false: nothing is owed).
    fn lag(&self, from_start: bool) -> i64 {
        let start = match self.committed {
            Some(c) => c,
            None if from_start => self.low,
            None => self.high,
        };
        (self.high - start).max(0)
    }
}

/// A decision to recover, with what the warning line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Verdict {
    pub reason: Reason,
    /// Stalled partitions with their lag.
    pub stalled: Vec<(PartitionKey, i64)>,
    /// How long the oldest of them made no progress.
    pub for_how_long: Duration,
    pub assignment: Vec<PartitionKey>,
}

/// Per-partition progress, kept across probes.
#[derive(Debug)]
pub(super) struct Liveness {
    stall_after: Duration,
    from_start: bool,
    /// Per partition: the committed offset last seen and since when.
    seen: BTreeMap<PartitionKey, (Option<i64>, Instant)>,
    /// The last probe that answered (or the start, or the last recovery).
    last_answer: Instant,
}

impl Liveness {
    pub(super) fn new(stall_after: Duration, from_start: bool, now: Instant) -> Self {
        Self {
            stall_after,
            from_start,
            seen: BTreeMap::new(),
            last_answer: now,
        }
    }

    pub(super) fn stall_after(&self) -> Duration {
        self.stall_after
    }

    /// Starts every clock again: after a recovery, or a new client.
    pub(super) fn reset(&mut self, now: Instant) {
        self.seen.clear();
        self.last_answer = now;
    }

    /// A probe that did not answer: recover once none has answered for
    /// the stall time.
    pub(super) fn no_answer(&mut self, now: Instant) -> Option<Verdict> {
        let silent = now.saturating_duration_since(self.last_answer);
        (silent >= self.stall_after).then(|| Verdict {
            reason: Reason::Unreachable,
            stalled: Vec::new(),
            for_how_long: silent,
            assignment: Vec::new(),
        })
    }

    /// Takes a probe's answer; `held` are the partitions this member holds
    /// messages of. Returns the stalled partitions' count and, when some
    /// have stalled for the stall time, the verdict.
    pub(super) fn observe(
        &mut self,
        snap: &Snapshot,
        held: &BTreeSet<PartitionKey>,
        now: Instant,
    ) -> (usize, Option<Verdict>) {
        self.last_answer = now;
        self.seen.retain(|k, _| snap.partitions.contains_key(k));
        let mut stalled = Vec::new();
        let mut oldest = Duration::ZERO;
        for (key, marks) in &snap.partitions {
            let lag = marks.lag(self.from_start);
            let entry = self
                .seen
                .entry(key.clone())
                .or_insert((marks.committed, now));
            // Progress, no lag, or a handler busy with the partition's
            // messages in this member: the clock starts again.
            if entry.0 != marks.committed || lag == 0 || held.contains(key) {
                *entry = (marks.committed, now);
                continue;
            }
            let still = now.saturating_duration_since(entry.1);
            if still >= self.stall_after {
                stalled.push((key.clone(), lag));
                oldest = oldest.max(still);
            }
        }
        let count = stalled.len();
        if stalled.is_empty() {
            return (0, None);
        }
        let reason = if snap.assignment.is_empty() {
            Reason::NoAssignment
        } else {
            Reason::Stalled
        };
        let verdict = Verdict {
            reason,
            stalled,
            for_how_long: oldest,
            assignment: snap.assignment.iter().cloned().collect(),
        };
        (count, Some(verdict))
    }
}

/// Reads the group's state for `topics` from `consumer` (blocking: run it
/// off the async threads). Every request waits at most `timeout`.
pub(super) fn probe<C: Consumer<X>, X: rdkafka::consumer::ConsumerContext>(
    consumer: &C,
    topics: &[String],
    timeout: Duration,
) -> Result<Snapshot, String> {
    let mut snap = Snapshot::default();
    let assignment = consumer
        .assignment()
        .map_err(|e| format!("cannot read the assignment: {e}"))?;
    for e in assignment.elements() {
        snap.assignment
            .insert((e.topic().to_string(), e.partition()));
    }
    let mut list = TopicPartitionList::new();
    for topic in topics {
        let metadata = consumer
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| format!("no metadata for topic `{topic}`: {e}"))?;
        for t in metadata.topics() {
            for p in t.partitions() {
                let (low, high) = consumer
                    .fetch_watermarks(topic, p.id(), timeout)
                    .map_err(|e| format!("no watermarks for {topic}/{}: {e}", p.id()))?;
                snap.partitions.insert(
                    (topic.clone(), p.id()),
                    Marks {
                        committed: None,
                        low,
                        high,
                    },
                );
                list.add_partition(topic, p.id());
            }
        }
    }
    if snap.partitions.is_empty() {
        return Ok(snap);
    }
    let committed = consumer
        .committed_offsets(list, timeout)
        .map_err(|e| format!("cannot read the group's committed offsets: {e}"))?;
    for e in committed.elements() {
        if let (Offset::Offset(o), Some(marks)) = (
            e.offset(),
            snap.partitions
                .get_mut(&(e.topic().to_string(), e.partition())),
        ) {
            marks.committed = Some(o);
        }
    }
    Ok(snap)
}

// ---- metrics ----------------------------------------------------------------

/// `{consumer="NAME"}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ConsumerLabel {
    consumer: String,
}

/// Where a Kafka group member reports its liveness: the consumer's
/// metrics implement it, so this module needs none of theirs.
pub trait LivenessSink: Send + Sync + std::fmt::Debug {
    /// Partitions with lag and no progress at the last look.
    fn stalled_partitions(&self, n: u64);
    /// A rejoin with a new client, for `reason`.
    fn recovered(&self, reason: &'static str);
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RecoveryLabels {
    consumer: String,
    reason: &'static str,
}

/// Every consumer's `outboxd_consumer_recoveries_total{consumer, reason}`
/// and `outboxd_consumer_stalled_partitions{consumer}`; a Kafka group
/// member counts into its consumer's [`LivenessFamilies::handles`].
#[derive(Debug, Clone, Default)]
pub struct LivenessFamilies {
    recoveries: Family<RecoveryLabels, Counter>,
    stalled: Family<ConsumerLabel, Gauge<u64, AtomicU64>>,
}

impl LivenessFamilies {
    /// Registers both into the consumers' registry (prefix
    /// `outboxd_consumer`).
    pub fn register(&self, consumers: &mut Registry) {
        consumers.register(
            "recoveries",
            "Kafka group rejoins (a new client) because the group had lag and made no progress, by reason",
            self.recoveries.clone(),
        );
        consumers.register(
            "stalled_partitions",
            "Partitions with lag and no progress for the stall time, as the Kafka group member last saw them",
            self.stalled.clone(),
        );
    }

    /// `consumer`'s recoveries and stalled-partitions gauge (0 until a
    /// Kafka group member sets it).
    pub fn handles(&self, consumer: &str) -> (Recoveries, Gauge<u64, AtomicU64>) {
        let stalled = self.stalled.get_or_create_owned(&ConsumerLabel {
            consumer: consumer.to_string(),
        });
        let recoveries = Recoveries {
            consumer: consumer.to_string(),
            family: self.recoveries.clone(),
        };
        (recoveries, stalled)
    }
}

/// One consumer's rejoins, by reason; a reason appears with its first
/// recovery.
#[derive(Debug, Clone, Default)]
pub struct Recoveries {
    consumer: String,
    family: Family<RecoveryLabels, Counter>,
}

impl Recoveries {
    fn labels(&self, reason: &'static str) -> RecoveryLabels {
        RecoveryLabels {
            consumer: self.consumer.clone(),
            reason,
        }
    }

    pub fn inc(&self, reason: &'static str) {
        self.family.get_or_create(&self.labels(reason)).inc();
    }

    pub fn get(&self, reason: &'static str) -> u64 {
        self.family
            .get(&self.labels(reason))
            .map(|c| c.get())
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(p: i32) -> PartitionKey {
        ("t".to_string(), p)
    }

    fn snap(assigned: &[i32], parts: &[(i32, Option<i64>, i64)]) -> Snapshot {
        Snapshot {
            assignment: assigned.iter().map(|&p| key(p)).collect(),
            partitions: parts
                .iter()
                .map(|&(p, committed, high)| {
                    (
                        key(p),
                        Marks {
                            committed,
                            low: 0,
                            high,
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn lag_without_progress_stalls_after_the_stall_time() {
        let t0 = Instant::now();
        let stall = Duration::from_secs(30);
        let mut l = Liveness::new(stall, true, t0);
        let none = BTreeSet::new();
        // Partition 0 moves, partition 1 sits at 5 of 10.
        let s = |c0| snap(&[0], &[(0, Some(c0), 100), (1, Some(5), 10)]);
        assert_eq!(l.observe(&s(10), &none, t0), (0, None));
        assert_eq!(
            l.observe(&s(20), &none, t0 + Duration::from_secs(29)),
            (0, None)
        );
        let (n, v) = l.observe(&s(30), &none, t0 + Duration::from_secs(31));
        assert_eq!(n, 1);
        let v = v.expect("a verdict");
        assert_eq!(v.reason, Reason::Stalled);
        assert_eq!(v.stalled, vec![(key(1), 5)]);
        assert_eq!(v.for_how_long, Duration::from_secs(31));
        // After a recovery the clocks start again.
        l.reset(t0 + Duration::from_secs(31));
        assert_eq!(
            l.observe(&s(40), &none, t0 + Duration::from_secs(40)),
            (0, None)
        );
    }

    #[test]
    fn no_assignment_is_named_and_uncommitted_partitions_owe_from_the_start() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::from_secs(10), true, t0);
        let none = BTreeSet::new();
        let s = snap(&[], &[(0, None, 7), (1, Some(3), 3)]);
        assert_eq!(l.observe(&s, &none, t0), (0, None));
        let v = l
            .observe(&s, &none, t0 + Duration::from_secs(10))
            .1
            .expect("a verdict");
        assert_eq!(v.reason, Reason::NoAssignment);
        assert_eq!(v.stalled, vec![(key(0), 7)], "partition 1 has no lag");
        // With `auto.offset.reset = latest` a never-committed partition owes nothing.
        let mut latest = Liveness::new(Duration::from_secs(10), false, t0);
        latest.observe(&s, &none, t0);
        assert_eq!(
            latest.observe(&s, &none, t0 + Duration::from_secs(60)),
            (0, None)
        );
    }

    #[test]
    fn a_partition_whose_messages_this_member_holds_never_stalls() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::from_secs(10), true, t0);
        let held: BTreeSet<_> = [key(0)].into();
        let s = snap(&[0], &[(0, Some(1), 9)]);
        l.observe(&s, &held, t0);
        assert_eq!(
            l.observe(&s, &held, t0 + Duration::from_secs(60)),
            (0, None),
            "its handler is failing: a handler problem, not the group's"
        );
        // Once it holds nothing of it (not fetching it), it stalls.
        let none = BTreeSet::new();
        assert_eq!(
            l.observe(&s, &none, t0 + Duration::from_secs(61)),
            (0, None)
        );
        assert_eq!(
            l.observe(&s, &none, t0 + Duration::from_secs(71)).0,
            1,
            "stalled 10 s after it stopped holding messages"
        );
    }

    #[test]
    fn silence_for_the_stall_time_is_unreachable() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::from_secs(10), true, t0);
        assert_eq!(l.no_answer(t0 + Duration::from_secs(9)), None);
        let v = l
            .no_answer(t0 + Duration::from_secs(10))
            .expect("a verdict");
        assert_eq!(v.reason, Reason::Unreachable);
        l.observe(
            &Snapshot::default(),
            &BTreeSet::new(),
            t0 + Duration::from_secs(11),
        );
        assert_eq!(l.no_answer(t0 + Duration::from_secs(20)), None);
    }
}
