//! Consumers' metrics (`outboxd_consumer_*`), one series per consumer
//! name: messages processed, duplicates, failures and dead letters, the lag
//! from the event's commit to the consumer's, parked keys, and (Kafka group
//! members) liveness from `broker/kafka/liveness.rs`. A runner holds its
//! consumer's handles ([`ConsumerMetrics`]), resolved once when the
//! consumer starts, so a message's update is an atomic add and no family
//! lookup.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::broker::kafka::{LivenessFamilies, LivenessSink, Recoveries};

/// Bucket bounds in seconds of a consumer's lag histogram (the event's
/// commit to the consumer's).
const LAG_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0,
];

/// `{consumer="NAME"}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ConsumerLabel {
    pub consumer: String,
}

/// A counter the admin API reads as the atomic it is (`load`), as it did
/// before the counters were prometheus-client's; exported as a counter.
#[derive(Debug, Clone, Default)]
pub struct Count(Counter);

impl Count {
    pub fn inc(&self) {
        self.0.inc();
    }

    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

impl std::ops::Deref for Count {
    type Target = AtomicU64;

    fn deref(&self) -> &AtomicU64 {
        self.0.inner()
    }
}

/// One consumer's handles into the families; [`Default`] gives free-standing
/// ones that nothing exports.
#[derive(Debug)]
pub struct ConsumerMetrics {
    pub processed: Count,
    pub duplicates: Count,
    pub failed: Count,
    pub dead_lettered: Count,
    /// From the event's commit to the consumer's commit.
    pub lag: Histogram,
    /// Kafka group members: rejoins because the group stopped making
    /// progress, by reason (`broker::kafka` liveness).
    pub recoveries: Recoveries,
    /// Kafka group members: partitions with lag and no progress for the
    /// stall time, at the last look.
    pub stalled_partitions: Gauge<u64, AtomicU64>,
    /// Per-key parking (`on_dead = "park_key"`): see [`ParkingMetrics`].
    pub parking: ParkingMetrics,
}

impl Default for ConsumerMetrics {
    fn default() -> Self {
        Self {
            processed: Count::default(),
            duplicates: Count::default(),
            failed: Count::default(),
            dead_lettered: Count::default(),
            lag: Histogram::new(LAG_BUCKETS),
            recoveries: Recoveries::default(),
            stalled_partitions: Gauge::default(),
            parking: ParkingMetrics::default(),
        }
    }
}

impl LivenessSink for ConsumerMetrics {
    fn stalled_partitions(&self, n: u64) {
        self.stalled_partitions.set(n);
    }

    fn recovered(&self, reason: &'static str) {
        self.recoveries.inc(reason);
    }
}

/// A consumer's parked keys: counters of messages parked and applied back
/// from dead letters, and gauges of what is held back now (set each time
/// the runner reads its parked keys).
#[derive(Debug, Default)]
pub struct ParkingMetrics {
    /// Messages recorded as parked behind a dead letter of their key.
    pub parked: Counter,
    /// Dead or parked messages applied after a redrive or a discard.
    pub redriven: Counter,
    pub parked_keys: Gauge<u64, AtomicU64>,
    pub parked_messages: Gauge<u64, AtomicU64>,
    /// Seconds since the oldest parked key's dead letter (0 when none).
    pub oldest_parked_seconds: Gauge<u64, AtomicU64>,
}

type CounterFamily = Family<ConsumerLabel, Counter>;
type GaugeFamily = Family<ConsumerLabel, Gauge<u64, AtomicU64>>;

/// Every consumer's series, registered once; [`Consumers::get`] adds a
/// consumer's members.
#[derive(Debug, Clone)]
struct Families {
    processed: CounterFamily,
    duplicates: CounterFamily,
    failed: CounterFamily,
    dead_lettered: CounterFamily,
    lag: Family<ConsumerLabel, Histogram, fn() -> Histogram>,
    parked: CounterFamily,
    redriven: CounterFamily,
    parked_keys: GaugeFamily,
    parked_messages: GaugeFamily,
    oldest_parked_seconds: GaugeFamily,
    liveness: LivenessFamilies,
}

impl Default for Families {
    fn default() -> Self {
        Self {
            processed: Family::default(),
            duplicates: Family::default(),
            failed: Family::default(),
            dead_lettered: Family::default(),
            lag: Family::new_with_constructor(|| Histogram::new(LAG_BUCKETS)),
            parked: Family::default(),
            redriven: Family::default(),
            parked_keys: Family::default(),
            parked_messages: Family::default(),
            oldest_parked_seconds: Family::default(),
            liveness: LivenessFamilies::default(),
        }
    }
}

/// The consumers this process runs, with their metrics, by name.
#[derive(Debug, Default)]
pub struct Consumers {
    families: Families,
    by_name: Mutex<BTreeMap<String, Arc<ConsumerMetrics>>>,
}

impl Consumers {
    /// Registers `outboxd_consumer_*` into `registry` (prefix `outboxd`).
    pub fn register(&self, registry: &mut Registry) {
        let f = &self.families;
        let r = registry.sub_registry_with_prefix("consumer");
        r.register(
            "processed",
            "Messages whose effect committed",
            f.processed.clone(),
        );
        r.register(
            "duplicates",
            "Redelivered messages dropped by the inbox",
            f.duplicates.clone(),
        );
        r.register(
            "failed",
            "Handler failures (rolled back, redelivered)",
            f.failed.clone(),
        );
        r.register(
            "dead_lettered",
            "Messages moved to a dead-letter record",
            f.dead_lettered.clone(),
        );
        r.register(
            "lag_seconds",
            "From the event's commit to the consumer's commit",
            f.lag.clone(),
        );
        r.register(
            "parked",
            "Messages parked behind a dead letter of their key",
            f.parked.clone(),
        );
        r.register(
            "redriven",
            "Dead or parked messages applied after a redrive or discard",
            f.redriven.clone(),
        );
        r.register(
            "parked_keys",
            "Keys held back by an unresolved dead letter",
            f.parked_keys.clone(),
        );
        r.register(
            "parked_messages",
            "Messages waiting behind a dead letter of their key",
            f.parked_messages.clone(),
        );
        r.register(
            "oldest_parked_seconds",
            "Age of the oldest parked key's dead letter (0 when none)",
            f.oldest_parked_seconds.clone(),
        );
        f.liveness.register(r);
    }

    /// `name`'s metrics, its series created (at zero) the first time.
    pub fn get(&self, name: &str) -> Arc<ConsumerMetrics> {
        let mut map = match self.by_name.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        map.entry(name.to_string())
            .or_insert_with(|| Arc::new(self.families.handles(name)))
            .clone()
    }

    /// Every consumer, by name.
    pub fn all(&self) -> Vec<(String, Arc<ConsumerMetrics>)> {
        let map = match self.by_name.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

impl Families {
    fn handles(&self, name: &str) -> ConsumerMetrics {
        let label = ConsumerLabel {
            consumer: name.to_string(),
        };
        let (recoveries, stalled_partitions) = self.liveness.handles(name);
        ConsumerMetrics {
            processed: Count(self.processed.get_or_create_owned(&label)),
            duplicates: Count(self.duplicates.get_or_create_owned(&label)),
            failed: Count(self.failed.get_or_create_owned(&label)),
            dead_lettered: Count(self.dead_lettered.get_or_create_owned(&label)),
            lag: self.lag.get_or_create_owned(&label),
            recoveries,
            stalled_partitions,
            parking: ParkingMetrics {
                parked: self.parked.get_or_create_owned(&label),
                redriven: self.redriven.get_or_create_owned(&label),
                parked_keys: self.parked_keys.get_or_create_owned(&label),
                parked_messages: self.parked_messages.get_or_create_owned(&label),
                oldest_parked_seconds: self.oldest_parked_seconds.get_or_create_owned(&label),
            },
        }
    }
}
