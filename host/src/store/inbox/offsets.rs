//! Kafka offsets kept in the consumer's own database, for consumers whose
//! partitions are assigned statically (`consumers[].kafka_partitions`)
//! instead of by a broker-side consumer group.
//!
//! The offset is written after the handler's transaction commits, so it
//! may lag behind the effects (a crash in between replays those messages,
//! which the inbox turns into no-ops) but never runs ahead of them.

use std::collections::HashMap;

use sqlx::Row;

use crate::store::{Db, on_pool};

/// The next offset to read for each partition of `topic` that `consumer`
/// has committed before; partitions it never committed are absent.
pub async fn load_offsets(
    db: &Db,
    consumer: &str,
    topic: &str,
) -> Result<HashMap<i32, i64>, sqlx::Error> {
    let sql =
        "SELECT partition, next_offset FROM consumer_offsets WHERE consumer = $1 AND topic = $2";
    let rows = on_pool!(db, |p| sqlx::query(sql)
        .bind(consumer)
        .bind(topic)
        .fetch_all(p)
        .await?
        .iter()
        .map(|r| Ok((r.try_get::<i32, _>(0)?, r.try_get::<i64, _>(1)?)))
        .collect::<Result<Vec<_>, sqlx::Error>>()?);
    Ok(rows.into_iter().collect())
}

/// Records that `consumer` has committed the effects of every message of
/// `topic`/`partition` before `next_offset`. The stored offset only moves
/// forward: a stale writer (a process that lost the partition to a restart
/// of itself) cannot move it back.
pub async fn save_offset(
    db: &Db,
    consumer: &str,
    topic: &str,
    partition: i32,
    next_offset: i64,
) -> Result<(), sqlx::Error> {
    on_pool!(db, |p| sqlx::query(
        "INSERT INTO consumer_offsets (consumer, topic, partition, next_offset)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (consumer, topic, partition) DO UPDATE
            SET next_offset = excluded.next_offset, updated_at = CURRENT_TIMESTAMP
          WHERE consumer_offsets.next_offset < excluded.next_offset",
    )
    .bind(consumer)
    .bind(topic)
    .bind(partition)
    .bind(next_offset)
    .execute(p)
    .await
    .map(|_| ()))?;
    Ok(())
}
