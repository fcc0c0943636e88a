//! The Kafka transport: [`KafkaPublisher`] for the relay and [`KafkaConsumer`]
//! for consumer groups. This is the only module that links rdkafka.
//!
//! The publisher is an idempotent producer with `acks=all`; a publish
//! resolves only with the delivery report. A fatal producer error or a
//! delivery timeout replaces the producer, because librdkafka cannot recover
//! by itself from a broker that lost its producer state.
//!
//! The consumer never lets librdkafka commit or store offsets. It keeps every
//! message it has handed out and not yet seen committed in a per-partition
//! buffer, and each `fetch` serves that buffer again before new messages, so
//! a message whose handler failed comes back on the next fetch without a
//! seek. A rebalance that revokes a partition drops its buffer; the new owner
//! resumes from the last committed offset, and `commit` refuses deliveries
//! that are no longer buffered, so a stale member never moves a cursor it
//! does not own. A partition whose buffer fills up (its handler keeps
//! failing) is paused rather than left unpolled, which would cost the
//! group membership after `max.poll.interval.ms`.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures_util::FutureExt;
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer, PurgeConfig};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::{ConsumeError, Delivery, MessageSource, OutgoingMessage, PublishError, Publisher};
use crate::config::is_secret;

/// How long a publish waits for room in librdkafka's local queue.
const QUEUE_FULL_WAIT: Duration = Duration::from_secs(1);

/// Why a Kafka client could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum KafkaSetupError {
    #[error("transport.kafka.\"{key}\": {message}")]
    Property { key: String, message: String },
    #[error("cannot create the Kafka {role}: {message}")]
    Client { role: &'static str, message: String },
}

/// Whether a failed publish is worth another attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    Retryable,
    Permanent,
}

/// Classifies a librdkafka error code. Errors that no retry can fix because
/// the message itself is wrong (too large, invalid, an invalid topic name)
/// are permanent; anything about the broker's state, its metadata, the
/// credentials or the ACLs is retryable: the event is not at fault, it backs
/// off until `max_attempts` while the operator fixes the cluster.
pub fn classify(code: Option<RDKafkaErrorCode>) -> ErrorClass {
    use RDKafkaErrorCode as C;
    match code {
        Some(
            C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::MessageBatchTooLarge
            | C::InvalidMessage
            | C::InvalidRecord
            | C::InvalidTimestamp
            | C::InvalidTopic
            | C::UnsupportedForMessageFormat
            | C::UnsupportedCompressionType
            | C::PolicyViolation
            | C::InvalidArgument
            | C::KeySerialization
            | C::ValueSerialization,
        ) => ErrorClass::Permanent,
        _ => ErrorClass::Retryable,
    }
}

fn publish_error(topic: &str, err: &KafkaError) -> PublishError {
    let text = format!("topic `{topic}`: {err}");
    match classify(err.rdkafka_error_code()) {
        ErrorClass::Permanent => PublishError::Permanent(text),
        ErrorClass::Retryable => PublishError::Retryable(text),
    }
}

/// A librdkafka configuration error, with the value hidden for secrets.
fn setup_error(role: &'static str, err: KafkaError) -> KafkaSetupError {
    match err {
        KafkaError::ClientConfig(_, desc, key, value) => KafkaSetupError::Property {
            message: if is_secret(&key) {
                format!("{desc} (value hidden)")
            } else {
                format!("{desc} (value `{value}`)")
            },
            key,
        },
        other => KafkaSetupError::Client {
            role,
            message: other.to_string(),
        },
    }
}

/// Refuses a user property that would weaken a guarantee outboxd relies on.
fn require(
    props: &BTreeMap<String, String>,
    key: &str,
    accepted: &[&str],
    why: &str,
) -> Result<(), KafkaSetupError> {
    match props.get(key) {
        Some(v) if !accepted.contains(&v.trim().to_ascii_lowercase().as_str()) => {
            Err(KafkaSetupError::Property {
                key: key.into(),
                message: format!("must be {} ({why}); remove it or set it so", accepted[0]),
            })
        }
        _ => Ok(()),
    }
}

fn base_config(props: &BTreeMap<String, String>) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (k, v) in props {
        config.set(k, v);
    }
    config
}

/// Publishes to Kafka with an idempotent, `acks=all` producer.
pub struct KafkaPublisher {
    config: ClientConfig,
    producer: RwLock<Arc<FutureProducer>>,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The config may hold secrets, so it is left out.
        f.debug_struct("KafkaPublisher").finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// `props` are the user's librdkafka properties. `delivery_timeout` is
    /// the default `message.timeout.ms` (a user value wins); keep it under
    /// the relay's publish timeout, so that librdkafka reports a timeout,
    /// and the producer can be replaced, before the relay stops waiting.
    pub fn new(
        props: &BTreeMap<String, String>,
        delivery_timeout: Duration,
    ) -> Result<Self, KafkaSetupError> {
        let why = "a publish is acknowledged only once every in-sync replica has it, exactly once per send";
        require(props, "enable.idempotence", &["true"], why)?;
        require(props, "acks", &["all", "-1"], why)?;
        require(props, "request.required.acks", &["all", "-1"], why)?;
        let mut config = base_config(props);
        config.set("enable.idempotence", "true").set("acks", "all");
        if !props.contains_key("message.timeout.ms") && !props.contains_key("delivery.timeout.ms") {
            config.set(
                "message.timeout.ms",
                delivery_timeout.as_millis().max(1).to_string(),
            );
        }
        let producer = config
            .create::<FutureProducer>()
            .map_err(|e| setup_error("producer", e))?;
        Ok(Self {
            config,
            producer: RwLock::new(Arc::new(producer)),
        })
    }

    /// Asks the cluster for its metadata: `Ok` when a broker answered
    /// within `timeout`. Meant for health checks.
    pub async fn check(&self, timeout: Duration) -> Result<(), String> {
        let producer = self.current().map_err(|e| e.to_string())?;
        tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(None, timeout)
                .map(|_| ())
                .map_err(|e| format!("kafka brokers did not answer within {timeout:?}: {e}"))
        })
        .await
        .map_err(|e| format!("kafka health check task failed: {e}"))?
    }

    fn current(&self) -> Result<Arc<FutureProducer>, PublishError> {
        self.producer
            .read()
            .map(|p| p.clone())
            .map_err(|_| PublishError::Retryable("kafka producer lock poisoned".into()))
    }

    /// Swaps in a fresh producer (once, by whichever publish notices first)
    /// and drops what the old one still queues, so nothing it held can land
    /// after what the new one sends.
    fn replace(&self, failed: &Arc<FutureProducer>, why: &str) {
        let Ok(mut slot) = self.producer.write() else {
            return;
        };
        if !Arc::ptr_eq(&slot, failed) {
            return;
        }
        match self.config.create::<FutureProducer>() {
            Ok(fresh) => {
                tracing::warn!(reason = why, "replacing the kafka producer");
                failed.purge(PurgeConfig::default().queue());
                *slot = Arc::new(fresh);
            }
            Err(e) => {
                tracing::error!(error = %setup_error("producer", e), "cannot replace the kafka producer");
            }
        }
    }
}

/// Whether a producer that failed this way must be replaced. A fatal error
/// stops an idempotent producer for good. A message that timed out may mean
/// the broker forgot the producer id (a restart that lost its state):
/// librdkafka then bumps the epoch locally and retries with the same
/// unknown id forever, while a new producer asks the broker for a new id.
fn needs_new_producer(err: &KafkaError, fatal: bool) -> bool {
    fatal
        || matches!(
            err.rdkafka_error_code(),
            Some(RDKafkaErrorCode::Fatal | RDKafkaErrorCode::MessageTimedOut)
        )
}

impl Publisher for KafkaPublisher {
    async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        let producer = self.current()?;
        let mut headers = OwnedHeaders::new_with_capacity(msg.headers.len());
        for (name, value) in &msg.headers {
            headers = headers.insert(Header {
                key: name,
                value: Some(value),
            });
        }
        let record = FutureRecord::to(&msg.topic)
            .key(&msg.key)
            .payload(&msg.payload)
            .headers(headers);
        match producer.send(record, QUEUE_FULL_WAIT).await {
            Ok(_) => Ok(()),
            Err((err, _)) => {
                let fatal = producer.client().fatal_error();
                if needs_new_producer(&err, fatal.is_some()) {
                    let why = match &fatal {
                        Some((code, reason)) => format!("fatal error {code:?}: {reason}"),
                        None => format!("{err}"),
                    };
                    self.replace(&producer, &why);
                }
                Err(publish_error(&msg.topic, &err))
            }
        }
    }
}

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

/// Creates `topics` with `partitions` partitions where they do not exist
/// yet (an existing topic is left as it is). For the demo and first runs
/// against a broker that does not auto-create topics.
pub async fn ensure_topics(
    props: &BTreeMap<String, String>,
    topics: &[String],
    partitions: i32,
) -> Result<(), String> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = base_config(props)
        .create()
        .map_err(|e| format!("cannot create a kafka admin client: {e}"))?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
        .collect();
    let results = admin
        .create_topics(
            &new,
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .map_err(|e| format!("kafka did not answer the create-topics request: {e}"))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(format!("cannot create topic {topic}: {code:?}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permanent_errors_are_about_the_message() {
        for code in [
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::InvalidTopic,
            RDKafkaErrorCode::MessageBatchTooLarge,
        ] {
            assert_eq!(classify(Some(code)), ErrorClass::Permanent, "{code:?}");
        }
    }

    #[test]
    fn broker_state_errors_are_retryable() {
        for code in [
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::RequestTimedOut,
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::QueueFull,
            RDKafkaErrorCode::NotEnoughReplicas,
            RDKafkaErrorCode::NotEnoughReplicasAfterAppend,
            RDKafkaErrorCode::LeaderNotAvailable,
            RDKafkaErrorCode::NotLeaderForPartition,
            RDKafkaErrorCode::Fatal,
            // A restarted broker answers "unknown topic" until it has
            // loaded its metadata (the chaos soak saw whole batches die of
            // it), and credentials or ACLs are the operator's to fix: the
            // events are not at fault, so they back off and wait.
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::UnknownTopic,
            RDKafkaErrorCode::UnknownPartition,
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::ClusterAuthorizationFailed,
            RDKafkaErrorCode::SaslAuthenticationFailed,
            RDKafkaErrorCode::Authentication,
        ] {
            assert_eq!(classify(Some(code)), ErrorClass::Retryable, "{code:?}");
        }
        assert_eq!(classify(None), ErrorClass::Retryable);
    }

    #[test]
    fn timeouts_and_fatal_errors_replace_the_producer() {
        let timed_out = KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut);
        let too_large = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert!(needs_new_producer(&timed_out, false));
        assert!(needs_new_producer(&too_large, true));
        assert!(!needs_new_producer(&too_large, false));
    }

    #[test]
    fn guarantees_cannot_be_weakened() {
        let props = |k: &str, v: &str| {
            BTreeMap::from([
                ("bootstrap.servers".to_string(), "127.0.0.1:1".to_string()),
                (k.to_string(), v.to_string()),
            ])
        };
        let timeout = Duration::from_secs(5);
        for (k, v) in [
            ("acks", "1"),
            ("enable.idempotence", "false"),
            ("request.required.acks", "0"),
        ] {
            let err = KafkaPublisher::new(&props(k, v), timeout).expect_err(k);
            assert!(err.to_string().contains(k), "{err}");
        }
        assert!(KafkaPublisher::new(&props("acks", "all"), timeout).is_ok());
        let cfg = KafkaConsumerConfig::new("g", vec!["t".into()]);
        assert!(KafkaConsumer::new(&props("enable.auto.commit", "true"), cfg.clone()).is_err());
        assert!(KafkaConsumer::new(&props("group.id", "x"), cfg).is_err());
    }

    #[test]
    fn config_errors_hide_secret_values() {
        let props = BTreeMap::from([
            ("bootstrap.servers".to_string(), "127.0.0.1:1".to_string()),
            ("sasl.password".to_string(), "hunter2".to_string()),
            ("no.such.password".to_string(), "hunter3".to_string()),
        ]);
        let err = KafkaPublisher::new(&props, Duration::from_secs(5)).expect_err("unknown key");
        let text = err.to_string();
        assert!(!text.contains("hunter"), "{text}");
    }
}
