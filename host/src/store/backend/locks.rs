//! Every Postgres advisory lock outboxd takes, in one place: they all share
//! the server's lock table, so which key each one uses is what keeps an
//! aggregate, a partition and a migration from waiting for each other.
//!
//! Postgres has two advisory keyspaces that never overlap: locks on one
//! bigint key, and locks on two int4 keys. outboxd uses them so:
//!
//! - **Aggregates** own the two-int4 keyspace: the 64-bit
//!   `hashtextextended(aggregate_id, 0)`, split into its high and low
//!   halves. Nothing else takes a two-int4 lock, so an aggregate can only
//!   wait for another aggregate (whose hash is equal: a harmless wait).
//! - **Partitions** of the embedded transport take bigint keys
//!   `hashtextextended(topic, PARTITION_SEED + partition)`. The seed is
//!   above any partition number (at most 1024) and any seed used before, so
//!   a partition's key is never the key another lock form computes from the
//!   same text.
//! - **Fixed locks** (the migration runner, application DDL) are bigint
//!   constants; a hashed key equal to one is a 2^-64 chance, and would only
//!   make a migration wait for one publish.
//!
//! Before this layout, aggregates and partitions both used
//! `hashtextextended(text, n)` bigint keys, so aggregate `orders` and
//! partition 0 of topic `orders` were one lock: a long producer transaction
//! stalled the topic's writer (and the relay's publishes) and the other way
//! round. For one release, producers and writers also take their old key,
//! in SHARED mode: an old producer or writer takes it EXCLUSIVE, so old and
//! new still exclude each other on one aggregate (or partition) during a
//! rolling upgrade, while two new ones share it and never collide through
//! it. The shared old keys can go once no host older than migration 0010 is
//! running (see ARCHITECTURE.md).

/// Partition keys' seed offset: above every partition number (seeds 0 to
/// 1023 were the old partition keys, 0 the old aggregate key).
pub const PARTITION_SEED: i64 = 1 << 32;

/// Serialises one aggregate's producers: taken by `enqueue`
/// (`store/outbox/enqueue.rs`, and in the same form by the `outbox_enqueue` SQL
/// function) before the `seq`
/// is drawn, so within one aggregate seq order is commit order. `$1` is the
/// aggregate id. The first lock is the previous release's key, shared (see
/// the module comment).
pub const AGGREGATE_LOCK: &str = "
SELECT pg_advisory_xact_lock_shared(k.h),
       pg_advisory_xact_lock((k.h >> 32)::int4, k.h::bit(32)::int4)
  FROM (SELECT hashtextextended($1, 0) AS h) AS k";

/// Serialises the embedded transport's writers of one partition, so offset
/// order is commit order within it. `$1` is the topic, `$2` the partition
/// (a bigint). The first lock is the previous release's key, shared.
pub const PARTITION_LOCK: &str = "
SELECT pg_advisory_xact_lock_shared(hashtextextended($1, $2)),
       pg_advisory_xact_lock(hashtextextended($1, $2 + 4294967296))";

/// One migration runner at a time across every host sharing the database
/// (a session lock, released by the runner).
pub const MIGRATION_LOCK_KEY: i64 = 7_262_817_391;

/// One creator at a time of application tables made through
/// [`crate::store::execute_in_app_schema`] (the same key the example's billing
/// schema used before it moved out of the product).
pub const APP_SCHEMA_LOCK_KEY: i64 = 7_262_817_392;

#[cfg(test)]
mod tests {
    #[test]
    fn the_partition_statement_uses_the_partition_seed() {
        assert!(super::PARTITION_LOCK.contains(&format!("$2 + {}", super::PARTITION_SEED)));
    }
}
