//! Postgres advisory locks: an aggregate's producers exclude each other,
//! and so do a partition's writers, but an aggregate never waits for a
//! partition (or the other way round) because its id happens to be a
//! topic's name; and during a rolling upgrade a producer or a writer of the
//! previous release, which takes the old lock form, still excludes a new
//! one.
//!
//! A blocked lock is observed with a short `lock_timeout`: the statement
//! fails with SQLSTATE 55P03 instead of waiting.

use outboxd::store::Db;
use outboxd::store::backend::locks::PARTITION_LOCK;
use outboxd::{EnqueueError, NewEvent, enqueue};
use serde_json::json;
use sqlx::{PgPool, Postgres, Transaction};

use crate::support::TestDb;

/// How long a statement may wait for a lock before it counts as blocked.
const BLOCKED_AFTER: &str = "SET LOCAL lock_timeout = '300ms'";

fn pool(t: &TestDb) -> &PgPool {
    match &t.db {
        Db::Postgres(p) => p,
        Db::Sqlite(_) => unreachable!("Postgres"),
    }
}

async fn impatient(pool: &PgPool) -> Transaction<'static, Postgres> {
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query(BLOCKED_AFTER)
        .execute(&mut *tx)
        .await
        .expect("lock_timeout");
    tx
}

fn is_lock_timeout(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("55P03"))
}

/// Whether an enqueue of `aggregate` through the Rust API had to wait.
async fn enqueue_blocked(pool: &PgPool, aggregate: &str) -> bool {
    let mut tx = impatient(pool).await;
    match enqueue(
        &mut tx,
        NewEvent::new(aggregate, "order.confirmed", json!({})),
    )
    .await
    {
        Ok(_) => false,
        Err(EnqueueError::Database(e)) if is_lock_timeout(&e) => true,
        Err(e) => panic!("enqueue of {aggregate} failed: {e}"),
    }
}

/// Whether an enqueue of `aggregate` through `outbox_enqueue` had to wait.
async fn sql_enqueue_blocked(pool: &PgPool, aggregate: &str) -> bool {
    let mut tx = impatient(pool).await;
    match sqlx::query("SELECT outbox_enqueue($1, 'order.confirmed', '{}'::jsonb)")
        .bind(aggregate)
        .execute(&mut *tx)
        .await
    {
        Ok(_) => false,
        Err(e) if is_lock_timeout(&e) => true,
        Err(e) => panic!("outbox_enqueue({aggregate}) failed: {e}"),
    }
}

/// Whether the embedded transport's writer had to wait for `topic`'s
/// `partition`.
async fn partition_blocked(pool: &PgPool, topic: &str, partition: i64) -> bool {
    let mut tx = impatient(pool).await;
    match sqlx::query(PARTITION_LOCK)
        .bind(topic)
        .bind(partition)
        .execute(&mut *tx)
        .await
    {
        Ok(_) => false,
        Err(e) if is_lock_timeout(&e) => true,
        Err(e) => panic!("partition lock of {topic}/{partition} failed: {e}"),
    }
}

/// A transaction that holds `topic`'s `partition` as a writer does.
async fn hold_partition(
    pool: &PgPool,
    topic: &str,
    partition: i64,
) -> Transaction<'static, Postgres> {
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query(PARTITION_LOCK)
        .bind(topic)
        .bind(partition)
        .execute(&mut *tx)
        .await
        .expect("partition lock");
    tx
}

/// A transaction that holds `sql` (an old release's lock statement) with
/// `key` bound.
async fn hold_old_lock(pool: &PgPool, sql: &str, key: &str) -> Transaction<'static, Postgres> {
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query(sql)
        .bind(key)
        .execute(&mut *tx)
        .await
        .expect("old lock");
    tx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregate_named_like_a_topic_does_not_wait_for_its_partition() {
    let t = TestDb::postgres().await;
    let pool = pool(&t);

    let writer = hold_partition(pool, "orders", 0).await;
    assert!(
        !enqueue_blocked(pool, "orders").await,
        "enqueue of aggregate `orders` waited for the writer of partition orders/0"
    );
    assert!(
        !sql_enqueue_blocked(pool, "orders").await,
        "outbox_enqueue('orders', ...) waited for the writer of partition orders/0"
    );
    writer.rollback().await.expect("rollback");

    let mut producer = pool.begin().await.expect("begin");
    enqueue(
        &mut producer,
        NewEvent::new("orders", "order.confirmed", json!({})),
    )
    .await
    .expect("enqueue");
    assert!(
        !partition_blocked(pool, "orders", 0).await,
        "the writer of partition orders/0 waited for a producer of aggregate `orders`"
    );
    producer.rollback().await.expect("rollback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_of_one_aggregate_exclude_each_other_across_releases() {
    let t = TestDb::postgres().await;
    let pool = pool(&t);

    // This release against this release.
    let mut first = pool.begin().await.expect("begin");
    enqueue(
        &mut first,
        NewEvent::new("order-9", "order.confirmed", json!({})),
    )
    .await
    .expect("enqueue");
    assert!(enqueue_blocked(pool, "order-9").await, "Rust API");
    assert!(sql_enqueue_blocked(pool, "order-9").await, "outbox_enqueue");
    first.rollback().await.expect("rollback");

    // A producer of the previous release holds the old lock form.
    let old = hold_old_lock(
        pool,
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        "order-9",
    )
    .await;
    assert!(
        enqueue_blocked(pool, "order-9").await,
        "a new producer did not wait for an old producer of the same aggregate"
    );
    assert!(
        sql_enqueue_blocked(pool, "order-9").await,
        "outbox_enqueue did not wait for an old producer of the same aggregate"
    );
    assert!(
        !enqueue_blocked(pool, "order-10").await,
        "another aggregate waited"
    );
    old.rollback().await.expect("rollback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_of_one_partition_exclude_each_other_across_releases() {
    let t = TestDb::postgres().await;
    let pool = pool(&t);

    let writer = hold_partition(pool, "orders", 3).await;
    assert!(partition_blocked(pool, "orders", 3).await, "same release");
    assert!(
        !partition_blocked(pool, "orders", 4).await,
        "another partition"
    );
    writer.rollback().await.expect("rollback");

    // A writer of the previous release holds the old lock form of orders/3.
    let mut old = pool.begin().await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, $2))")
        .bind("orders")
        .bind(3_i64)
        .execute(&mut *old)
        .await
        .expect("old partition lock");
    assert!(
        partition_blocked(pool, "orders", 3).await,
        "a new writer did not wait for an old writer of the same partition"
    );
    old.rollback().await.expect("rollback");
}
