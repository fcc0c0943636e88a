//! How far a consumer group is behind on its topics: per partition, the
//! high watermark minus the group's committed offset (minus the low
//! watermark where the group has committed nothing yet). Read with a
//! client of its own that never joins the group, so asking changes nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::{KafkaSetupError, base_config, setup_error};

/// Reads one group's lag on its topics.
pub struct GroupLag {
    client: BaseConsumer,
    group: String,
    topics: Vec<String>,
}

impl std::fmt::Debug for GroupLag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupLag")
            .field("group", &self.group)
            .field("topics", &self.topics)
            .finish_non_exhaustive()
    }
}

impl GroupLag {
    pub fn new(
        props: &BTreeMap<String, String>,
        group: impl Into<String>,
        topics: Vec<String>,
    ) -> Result<Self, KafkaSetupError> {
        let group = group.into();
        let mut config = base_config(props);
        config
            .set("group.id", &group)
            .set("enable.auto.commit", "false");
        let client = config.create().map_err(|e| setup_error("lag reader", e))?;
        Ok(Self {
            client,
            group,
            topics,
        })
    }

    /// Messages the group has not committed past, over every partition of
    /// its topics. librdkafka's calls block for up to `timeout` each: call
    /// it from a blocking thread.
    pub fn messages_behind(&self, timeout: Duration) -> Result<i64, String> {
        let mut wanted = TopicPartitionList::new();
        let mut marks = Vec::new();
        for topic in &self.topics {
            let metadata = self
                .client
                .fetch_metadata(Some(topic), timeout)
                .map_err(|e| format!("topic `{topic}`: cannot read its partitions: {e}"))?;
            for t in metadata.topics().iter().filter(|t| t.name() == topic) {
                for p in t.partitions() {
                    let (low, high) = self
                        .client
                        .fetch_watermarks(topic, p.id(), timeout)
                        .map_err(|e| {
                            format!(
                                "topic `{topic}` partition {}: cannot read its offsets: {e}",
                                p.id()
                            )
                        })?;
                    wanted.add_partition(topic, p.id());
                    marks.push((topic, p.id(), low, high));
                }
            }
        }
        let committed = self
            .client
            .committed_offsets(wanted, timeout)
            .map_err(|e| {
                format!(
                    "group `{}`: cannot read its committed offsets: {e}",
                    self.group
                )
            })?;
        Ok(marks
            .into_iter()
            .map(|(topic, partition, low, high)| {
                let from = match committed
                    .find_partition(topic, partition)
                    .map(|e| e.offset())
                {
                    Some(Offset::Offset(n)) => n.max(low),
                    _ => low,
                };
                (high - from).max(0)
            })
            .sum())
    }
}
