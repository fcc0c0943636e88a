//! The embedded transport's tables: `transport_messages` (what was
//! published, by topic and partition, in offset order) and
//! `transport_cursors` (each consumer group's committed offset and lease
//! per partition). `broker/embedded.rs` decides what to publish and fetch;
//! the SQL of either database is here.

pub mod backlog;

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use outboxd_core::embedded_headers::parse_headers;
use outboxd_core::message::Delivery;
use sqlx::{PgPool, Row, SqlitePool};

use crate::store::backend::stored_time::StoredTime;
use crate::store::{Db, on_pool};

/// The channel a Postgres publish notifies at commit, so waiting consumers
/// fetch at once instead of at their next poll.
pub const NOTIFY_CHANNEL: &str = crate::store::backend::notify::TRANSPORT_CHANNEL;

/// One message as it is stored.
#[derive(Debug, Clone)]
pub struct TransportMessage {
    pub topic: String,
    pub partition: i32,
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
    /// The JSON array of `outboxd_core::embedded_headers`.
    pub headers: String,
    pub message_id: uuid::Uuid,
}

/// Stores `rows` in one transaction; on Postgres waiting consumers are
/// notified at its commit.
pub async fn store_messages(db: &Db, rows: &[TransportMessage]) -> Result<(), sqlx::Error> {
    match db {
        Db::Postgres(pool) => store_pg(pool, rows).await,
        Db::Sqlite(pool) => store_sqlite(pool, rows).await,
    }
}

/// One transaction of plain INSERTs: SQLite has one writer at a time, so
/// the `offset` (an AUTOINCREMENT key) follows commit order by itself.
async fn store_sqlite(pool: &SqlitePool, rows: &[TransportMessage]) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    for r in rows {
        sqlx::query(
            "INSERT INTO transport_messages (topic, partition, message_key, payload, headers, message_id)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&r.topic)
        .bind(r.partition)
        .bind(&r.key)
        .bind(&r.payload)
        .bind(&r.headers)
        .bind(r.message_id.to_string())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await
}

/// One transaction: the partitions' advisory locks in a fixed order (so two
/// writers cannot deadlock), then every row in one INSERT. Offsets are
/// identity values drawn at insert time; holding each partition's lock
/// until commit makes offset order commit order within a partition, so a
/// consumer's cursor never skips a late commit.
async fn store_pg(pool: &PgPool, rows: &[TransportMessage]) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    let mut partitions: Vec<(&str, i32)> = rows
        .iter()
        .map(|r| (r.topic.as_str(), r.partition))
        .collect();
    partitions.sort_unstable();
    partitions.dedup();
    for (topic, partition) in partitions {
        sqlx::query(crate::store::backend::locks::PARTITION_LOCK)
            .bind(topic)
            .bind(i64::from(partition))
            .execute(&mut *tx)
            .await?;
    }
    // The insert and the wake-up of waiting consumers (delivered at commit)
    // in one statement.
    sqlx::query(
        "WITH stored AS (
           INSERT INTO transport_messages (topic, partition, message_key, payload, headers, message_id)
           SELECT t, p, k, v, h::jsonb, m
             FROM unnest($1::text[], $2::int[], $3::bytea[], $4::bytea[], $5::text[], $6::uuid[])
               AS x(t, p, k, v, h, m)
           RETURNING 1)
         SELECT pg_notify($7, '') WHERE EXISTS (SELECT 1 FROM stored)",
    )
    .bind(rows.iter().map(|r| r.topic.as_str()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.partition).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.key.as_slice()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.payload.as_slice()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.headers.as_str()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.message_id).collect::<Vec<_>>())
    .bind(NOTIFY_CHANNEL)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// Records `owner` as a live member of `group` until `until`, renews the
/// partitions of `topic` (numbered below `partitions`) it holds and takes
/// free or expired ones, up to its share: ceil(partitions / live members).
/// Partitions above the share are given back (lowest numbers are kept);
/// what the member handled is committed, so the next holder reads on from
/// there. Returns each held partition's committed offset. A group's
/// cursors are created on first use.
pub async fn take_leases(
    db: &Db,
    group: &str,
    topic: &str,
    partitions: i32,
    owner: &str,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Vec<(i32, i64)>, sqlx::Error> {
    on_pool!(db, |pool| {
        for p in 0..partitions {
            sqlx::query("INSERT INTO transport_cursors (consumer_group, topic, partition) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING")
                .bind(group).bind(topic).bind(p).execute(pool).await?;
        }
        sqlx::query(
            "INSERT INTO transport_members (consumer_group, member, seen_until) VALUES ($1, $2, $3)
             ON CONFLICT (consumer_group, member) DO UPDATE SET seen_until = excluded.seen_until",
        )
        .bind(group)
        .bind(owner)
        .bind(StoredTime(until))
        .execute(pool)
        .await?;
        sqlx::query("DELETE FROM transport_members WHERE consumer_group = $1 AND seen_until < $2")
            .bind(group)
            .bind(StoredTime(now))
            .execute(pool)
            .await?;
        let live: i64 = sqlx::query_scalar(
            "SELECT CAST(count(*) AS bigint) FROM transport_members WHERE consumer_group = $1",
        )
        .bind(group)
        .fetch_one(pool)
        .await?;
        let share = (partitions.max(0) as u64).div_ceil(live.max(1) as u64) as usize;
        // 1: ours and valid, 0: free or expired, 2: another member's.
        let rows = sqlx::query(
            "SELECT CAST(partition AS bigint),
                    CAST(CASE WHEN lease_owner = $3 AND lease_until >= $4 THEN 1
                              WHEN lease_owner IS NULL OR lease_until < $4 THEN 0
                              ELSE 2 END AS bigint)
               FROM transport_cursors WHERE consumer_group = $1 AND topic = $2 AND partition < $5
              ORDER BY partition",
        )
        .bind(group)
        .bind(topic)
        .bind(owner)
        .bind(StoredTime(now))
        .bind(partitions)
        .fetch_all(pool)
        .await?;
        let of = |state: i64| -> Vec<i64> {
            rows.iter()
                .filter(|r| r.get::<i64, _>(1) == state)
                .map(|r| r.get::<i64, _>(0))
                .collect()
        };
        let (mine, free) = (of(1), of(0));
        for p in mine.iter().skip(share) {
            sqlx::query("UPDATE transport_cursors SET lease_owner = NULL, lease_until = NULL
                          WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND lease_owner = $4")
                .bind(group).bind(topic).bind(p).bind(owner).execute(pool).await?;
        }
        // Renew what we keep in one statement (the steady state)...
        let mut held: Vec<(i32, i64)> = sqlx::query(
            "UPDATE transport_cursors SET lease_until = $4
              WHERE consumer_group = $1 AND topic = $2 AND lease_owner = $3
                AND lease_until >= $5 AND partition < $6
             RETURNING CAST(partition AS bigint), last_offset",
        )
        .bind(group)
        .bind(topic)
        .bind(owner)
        .bind(StoredTime(until))
        .bind(StoredTime(now))
        .bind(partitions)
        .fetch_all(pool)
        .await?
        .iter()
        .map(|r| (r.get::<i64, _>(0) as i32, r.get::<i64, _>(1)))
        .collect();
        // ...then take free ones up to the share, lowest first, each
        // rechecked: another member may have taken it since the read above.
        for p in &free {
            if held.len() >= share {
                break;
            }
            let row = sqlx::query(
                "UPDATE transport_cursors SET lease_owner = $4, lease_until = $5
                  WHERE consumer_group = $1 AND topic = $2 AND partition = $3
                    AND (lease_owner IS NULL OR lease_owner = $4 OR lease_until < $6)
                 RETURNING last_offset",
            )
            .bind(group)
            .bind(topic)
            .bind(p)
            .bind(owner)
            .bind(StoredTime(until))
            .bind(StoredTime(now))
            .fetch_optional(pool)
            .await?;
            if let Some(row) = row {
                held.push((*p as i32, row.get::<i64, _>(0)));
            }
        }
        Ok(held)
    })
}

/// Releases every lease `owner` holds and leaves the group, so another
/// member can take over at once.
pub async fn release_leases(db: &Db, owner: &str) -> Result<(), sqlx::Error> {
    on_pool!(db, |pool| {
        sqlx::query("UPDATE transport_cursors SET lease_owner = NULL, lease_until = NULL WHERE lease_owner = $1")
            .bind(owner)
            .execute(pool)
            .await?;
        sqlx::query("DELETE FROM transport_members WHERE member = $1")
            .bind(owner)
            .execute(pool)
            .await?;
    });
    Ok(())
}

/// Moves `group`'s cursor on each delivery's topic and partition to its
/// offset if `owner` still holds that lease, all in one transaction (one
/// flush to disk, not one per partition). For each delivery, whether the
/// lease was still held (false: another member took the partition).
pub async fn advance_cursors(
    db: &Db,
    group: &str,
    ds: &[Delivery],
    owner: &str,
) -> Result<Vec<bool>, sqlx::Error> {
    let sql = "UPDATE transport_cursors SET last_offset = $4
                WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND lease_owner = $5";
    let mut advanced = Vec::with_capacity(ds.len());
    on_pool!(db, |pool| {
        let mut tx = pool.begin().await?;
        for d in ds {
            let n = sqlx::query(sql)
                .bind(group)
                .bind(&d.topic)
                .bind(d.partition)
                .bind(d.offset)
                .bind(owner)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            advanced.push(n > 0);
        }
        tx.commit().await?;
    });
    Ok(advanced)
}

/// Up to `max` messages after each partition's offset in `after` (keyed
/// by topic and partition), each partition's in offset order.
pub async fn fetch_after(
    db: &Db,
    after: &HashMap<(String, i32), i64>,
    max: usize,
) -> Result<Vec<Delivery>, sqlx::Error> {
    match db {
        Db::Postgres(pool) => fetch_pg(pool, after, max).await,
        Db::Sqlite(pool) => fetch_sqlite(pool, after, max).await,
    }
}

/// Postgres: one round trip per topic, each partition an indexed range
/// scan of at most its share of `max`. Every partition with messages gets
/// its share, so a backlog on one never starves the others (the consumer
/// handles partitions side by side); a partition with less leaves its
/// share to the next fetch.
async fn fetch_pg(
    pool: &PgPool,
    after: &HashMap<(String, i32), i64>,
    max: usize,
) -> Result<Vec<Delivery>, sqlx::Error> {
    if after.is_empty() || max == 0 {
        return Ok(Vec::new());
    }
    let share = max.div_ceil(after.len()) as i64;
    let mut by_topic: BTreeMap<&str, (Vec<i32>, Vec<i64>)> = BTreeMap::new();
    for ((topic, partition), after) in after {
        let (partitions, afters) = by_topic.entry(topic.as_str()).or_default();
        partitions.push(*partition);
        afters.push(*after);
    }
    let mut out = Vec::new();
    for (topic, (partitions, afters)) in by_topic {
        let rows = sqlx::query(
            "SELECT p.partition, m.\"offset\", m.message_key, m.payload, m.headers::text
               FROM unnest($2::int4[], $3::int8[]) AS p(partition, after)
              CROSS JOIN LATERAL (
                    SELECT \"offset\", message_key, payload, headers FROM transport_messages
                     WHERE topic = $1 AND partition = p.partition AND \"offset\" > p.after
                     ORDER BY \"offset\" LIMIT $4) m
              ORDER BY p.partition, m.\"offset\"",
        )
        .bind(topic)
        .bind(&partitions)
        .bind(&afters)
        .bind(share)
        .fetch_all(pool)
        .await?;
        for r in rows {
            out.push(Delivery {
                attempt: 0,
                topic: topic.to_string(),
                partition: r.get(0),
                offset: r.get(1),
                key: r.get(2),
                payload: r.get(3),
                headers: parse_headers(r.get::<&str, _>(4)),
            });
        }
    }
    Ok(out)
}

/// SQLite: one query per topic for all its partitions (a round trip per
/// partition on every fetch adds up, with one writer at a time anyway).
/// Offsets are one AUTOINCREMENT sequence over the whole table, so merging
/// by offset keeps each partition's order.
async fn fetch_sqlite(
    pool: &SqlitePool,
    after: &HashMap<(String, i32), i64>,
    max: usize,
) -> Result<Vec<Delivery>, sqlx::Error> {
    let mut by_topic: BTreeMap<String, Vec<(i32, i64)>> = BTreeMap::new();
    for ((topic, partition), after) in after {
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
        for r in q.fetch_all(pool).await? {
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
