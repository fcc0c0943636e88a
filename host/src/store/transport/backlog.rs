//! What each consumer group of the embedded transport has yet to handle:
//! the messages past its cursors and when the oldest of them was
//! published. Kafka consumers keep their offsets in the broker, so they
//! have no row here.

use chrono::{DateTime, Utc};
use sqlx::Row;

use crate::store::{Db, on_pool};

/// One embedded consumer group's backlog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupBacklog {
    /// The group, which is the consumer's name.
    pub group: String,
    /// Messages published after the group's cursors.
    pub messages: i64,
    /// When the oldest of them was published; `None` when there are none.
    pub oldest_published_at: Option<DateTime<Utc>>,
}

/// Every embedded consumer group that has cursors, by name.
pub async fn embedded_backlog(db: &Db) -> Result<Vec<GroupBacklog>, sqlx::Error> {
    // The join walks the `(topic, partition, offset)` index from each
    // cursor, so it reads only the messages not yet handled.
    let sql = format!(
        "SELECT c.consumer_group, count(m.\"offset\"), min({published})
           FROM transport_cursors c
           LEFT JOIN transport_messages m
             ON m.topic = c.topic AND m.partition = c.partition AND m.\"offset\" > c.last_offset
          GROUP BY c.consumer_group
          ORDER BY c.consumer_group",
        published = db.epoch_micros("m.published_at"),
    );
    on_pool!(db, |p| {
        let rows = sqlx::query(&sql).fetch_all(p).await?;
        rows.iter()
            .map(|r| {
                Ok(GroupBacklog {
                    group: r.try_get(0)?,
                    messages: r.try_get(1)?,
                    oldest_published_at: r
                        .try_get::<Option<i64>, _>(2)?
                        .map(crate::store::outbox::sqlite_claim::from_micros),
                })
            })
            .collect()
    })
}
