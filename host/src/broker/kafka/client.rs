//! The consumer's librdkafka side: the client it reads with, and its
//! messages turned into [`Delivery`] values that own their bytes, so they
//! outlive librdkafka's buffer and can be served again after a failed
//! handler.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Mutex;

use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};

use super::consumer::KafkaConsumerConfig;
use super::{KafkaSetupError, base_config, require, setup_error};
use crate::message::Delivery;

/// Records revoked partitions so `fetch` can drop what it buffered for them.
#[derive(Default)]
pub(super) struct GroupContext {
    pub(super) revoked: Mutex<Vec<(String, i32)>>,
    /// Partitions revoked from this member so far. A cooperative rebalance
    /// revokes only those that change owner; an eager one revokes all.
    pub(super) revoked_total: std::sync::atomic::AtomicU64,
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(list) = rebalance
            && let Ok(mut revoked) = self.revoked.lock()
        {
            self.revoked_total
                .fetch_add(list.count() as u64, std::sync::atomic::Ordering::Relaxed);
            for e in list.elements() {
                revoked.push((e.topic().to_string(), e.partition()));
            }
        }
    }
}

/// The librdkafka consumer, with automatic commits and offset stores off,
/// and `group.id` set to the consumer's name; a group member uses the
/// cooperative-sticky assignor and, with an instance id, static
/// membership. librdkafka needs a group id even to read assigned
/// partitions; such a reader never joins the group and never commits to
/// it.
pub(super) fn client(
    props: &BTreeMap<String, String>,
    cfg: &KafkaConsumerConfig,
) -> Result<StreamConsumer<GroupContext>, KafkaSetupError> {
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
    if cfg.partitions.is_none() {
        // A rebalance moves only the partitions that change owner, so the
        // other members keep consuming through it (user settings win).
        if !props.contains_key("partition.assignment.strategy") {
            config.set("partition.assignment.strategy", "cooperative-sticky");
        }
        if let Some(id) = &cfg.instance_id
            && !props.contains_key("group.instance.id")
        {
            config.set("group.instance.id", id);
        }
    }
    config
        .create_with_context(GroupContext::default())
        .map_err(|e| setup_error("consumer", e))
}

pub(super) fn to_delivery(m: &BorrowedMessage<'_>) -> Delivery {
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
