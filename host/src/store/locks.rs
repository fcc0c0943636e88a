//! Every Postgres advisory lock outboxd takes, in one place: they all share
//! the server's lock table, so which key each one uses is what keeps an
//! aggregate, a partition and a migration from waiting for each other.

/// Serialises one aggregate's producers: taken by [`super::enqueue`] (and by
/// the `outbox_enqueue` SQL function) before the `seq` is drawn, so within
/// one aggregate seq order is commit order. `$1` is the aggregate id.
pub const AGGREGATE_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))";

/// Serialises the embedded transport's writers of one partition, so offset
/// order is commit order within it. `$1` is the topic, `$2` the partition
/// (a bigint).
pub const PARTITION_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1, $2))";

/// One migration runner at a time across every host sharing the database
/// (a session lock, released by the runner).
pub const MIGRATION_LOCK_KEY: i64 = 7_262_817_391;

/// One creator at a time of the example billing handler's schema.
pub const BILLING_SCHEMA_LOCK_KEY: i64 = 7_262_817_392;
