//! The Postgres claim's plan when the statistics lag behind the table.
//!
//! After a burst of inserts autoanalyze has not seen yet (a broker outage,
//! a backlog written while every relay was down), the planner takes the
//! pending rows for a handful. The million-event soak found the claim then
//! rescanning every pending row for each row it claimed: 6.4 million index
//! rows and 12 s for a claim of 100 at 64,000 pending, so the relays fell
//! further behind the longer the burst lasted. The test writes such a
//! burst with autovacuum off and counts the rows the claim's plan reads:
//! rows, not time, so a busy machine cannot make it pass or fail.

use chrono::Utc;
use outboxd::store::{ClaimedBatch, Db, OutboxStore};
use serde_json::Value;

use crate::support::TestDb;

const AGGREGATES: i64 = 2_000;
const PUBLISHED: i64 = 20_000;
const PENDING: i64 = 20_000;
const LIMIT: i64 = 100;

/// Rows every node of an `EXPLAIN (ANALYZE, FORMAT JSON)` plan produced or
/// threw away, over all its loops.
fn rows_read(node: &Value) -> f64 {
    let n = |key: &str| node[key].as_f64().unwrap_or(0.0);
    let own = (n("Actual Rows") + n("Rows Removed by Filter") + n("Rows Removed by Join Filter"))
        * n("Actual Loops").max(1.0);
    let children = node["Plans"]
        .as_array()
        .map(|plans| plans.iter().map(rows_read).sum())
        .unwrap_or(0.0);
    own + children
}

#[tokio::test]
async fn the_claim_probes_by_aggregate_after_a_burst_autoanalyze_has_not_seen() {
    let t = TestDb::postgres().await;
    let Db::Postgres(pool) = &t.db else {
        unreachable!("TestDb::postgres")
    };
    t.exec("ALTER TABLE outboxd.outbox SET (autovacuum_enabled = false)")
        .await;
    t.exec(&format!(
        "INSERT INTO outbox (aggregate_id, event_type, payload, published_at, outcome)
         SELECT 'agg-' || (g % {AGGREGATES}), 'burst', '{{}}'::jsonb, now(), 'published'
           FROM generate_series(1, {PUBLISHED}) g"
    ))
    .await;
    // The statistics now say: nothing is pending.
    t.exec("ANALYZE outboxd.outbox").await;
    t.exec(&format!(
        "INSERT INTO outbox (aggregate_id, event_type, payload)
         SELECT 'agg-' || (g % {AGGREGATES}), 'burst', '{{}}'::jsonb
           FROM generate_series(1, {PENDING}) g"
    ))
    .await;

    let mut tx = pool.begin().await.expect("begin");
    let plan: Value = sqlx::query_scalar(&format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) {}",
        outboxd::store::outbox::pg_claim::CLAIM
    ))
    .bind(LIMIT)
    .bind(Utc::now())
    .fetch_one(&mut *tx)
    .await
    .expect("EXPLAIN ANALYZE the claim");
    tx.rollback().await.expect("rollback the explained claim");
    let read = rows_read(&plan[0]["Plan"]);
    // A probe per claimed row reads a few hundred rows in all; rescanning
    // the pending rows for each one reads LIMIT * PENDING (2,000,000).
    assert!(
        read < (20 * LIMIT) as f64,
        "a claim of {LIMIT} read {read} rows with {PENDING} pending the statistics have not seen; plan:\n{plan:#}"
    );

    // And it claims what it must: the oldest pending event of each of
    // LIMIT aggregates.
    let batch = t
        .store()
        .claim(LIMIT as usize, Utc::now())
        .await
        .expect("claim");
    let claimed: Vec<i64> = batch.events().iter().map(|e| e.seq).collect();
    assert_eq!(claimed.len(), LIMIT as usize, "claimed {claimed:?}");
    let oldest = t
        .count(&format!(
            "SELECT count(*) FROM (SELECT aggregate_id, min(seq) AS seq FROM outbox
              WHERE published_at IS NULL GROUP BY aggregate_id) heads
              WHERE heads.seq = ANY('{{{}}}'::bigint[])",
            claimed
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ))
        .await;
    assert_eq!(
        oldest, LIMIT,
        "every claimed event is its aggregate's oldest pending one"
    );
}
