//! What the soak proves at the end, read from the database alone: the
//! outbox (what was committed and published), `ledger` (the consumer's
//! effects) and `account_moves`/`orders` (the business changes).

use sqlx::PgPool;

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Verdict {
    /// Events committed (outbox rows).
    pub events: i64,
    /// Business rows without their event, or events without their row.
    pub atomicity_violations: i64,
    /// Events never published and not dead (after the drain).
    pub unpublished: i64,
    /// Events the relay gave up on (reported with a reason, not lost).
    pub dead: i64,
    /// Messages a consumer dead-lettered (reported with a reason).
    pub consumer_dead_letters: i64,
    /// Events with no effect that were neither dead nor dead-lettered.
    pub lost: i64,
    /// Effects beyond the first for one message.
    pub duplicate_effects: i64,
    /// Pairs of one aggregate's effects that ran against commit order.
    pub order_violations: i64,
    /// Published order events the file plugin did not transform.
    pub file_plugin_missing: i64,
    /// Effects per consumer version and per payload shape (the swaps).
    pub by_writer: Vec<(String, i64)>,
    pub by_shape: Vec<(String, i64)>,
    pub by_transformer: Vec<(String, i64)>,
}

impl Verdict {
    pub fn ok(&self) -> bool {
        self.atomicity_violations == 0
            && self.unpublished == 0
            && self.lost == 0
            && self.duplicate_effects == 0
            && self.order_violations == 0
            && self.file_plugin_missing == 0
    }
}

async fn one(pool: &PgPool, sql: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar::<_, Option<i64>>(sql)
        .fetch_one(pool)
        .await
        .map(|v| v.unwrap_or(0))
}

async fn groups(pool: &PgPool, sql: &str) -> Result<Vec<(String, i64)>, sqlx::Error> {
    sqlx::query_as::<_, (Option<String>, i64)>(sql)
        .fetch_all(pool)
        .await
        .map(|rows| {
            rows.into_iter()
                .map(|(k, n)| (k.unwrap_or_else(|| "(none)".into()), n))
                .collect()
        })
}

/// Events whose effect is still missing and that nobody has given up on:
/// zero means the pipeline has drained.
pub async fn outstanding(pool: &PgPool) -> Result<i64, sqlx::Error> {
    one(
        pool,
        "SELECT count(*) FROM outbox o
          WHERE o.dead_at IS NULL AND o.outcome IS DISTINCT FROM 'filtered'
            AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.message_id = o.id::text)
            AND NOT EXISTS (SELECT 1 FROM consumer_dead_letters d
                             WHERE d.message_id = o.id)",
    )
    .await
}

/// Age of the oldest unpublished, live event, in milliseconds.
pub async fn backlog_age_ms(pool: &PgPool) -> Result<i64, sqlx::Error> {
    one(
        pool,
        "SELECT (EXTRACT(EPOCH FROM now() - min(created_at)) * 1000)::bigint
           FROM outbox WHERE published_at IS NULL AND dead_at IS NULL",
    )
    .await
}

/// Every query is a join the planner can hash: at a million events an
/// `EXISTS` in the select list ran once per order over the whole outbox
/// and had not finished after 18 minutes.
pub async fn verdict(pool: &PgPool) -> Result<Verdict, sqlx::Error> {
    let events = one(pool, "SELECT count(*) FROM outbox").await?;
    let atomicity_violations = one(
        pool,
        "SELECT (SELECT count(*) FROM account_moves m WHERE NOT EXISTS
                  (SELECT 1 FROM outbox o WHERE o.aggregate_id = m.aggregate_id
                      AND o.event_type = 'account.moved'
                      AND (o.payload->>'seq')::bigint = m.seq))
              + (SELECT count(*) FROM outbox o WHERE o.event_type = 'account.moved'
                  AND NOT EXISTS (SELECT 1 FROM account_moves m
                    WHERE m.aggregate_id = o.aggregate_id
                      AND m.seq = (o.payload->>'seq')::bigint))
              + (SELECT count(*) FROM orders r WHERE r.status = 'confirmed'
                  AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.aggregate_id = r.id))
              + (SELECT count(*) FROM orders r WHERE r.status <> 'confirmed'
                  AND EXISTS (SELECT 1 FROM outbox o WHERE o.aggregate_id = r.id))",
    )
    .await?;
    let unpublished = one(
        pool,
        "SELECT count(*) FROM outbox WHERE published_at IS NULL AND dead_at IS NULL",
    )
    .await?;
    let dead = one(
        pool,
        "SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL",
    )
    .await?;
    let consumer_dead_letters = one(pool, "SELECT count(*) FROM consumer_dead_letters").await?;
    let lost = outstanding(pool).await?;
    let duplicate_effects = one(
        pool,
        "SELECT sum(n - 1)::bigint FROM
           (SELECT count(*) AS n FROM ledger GROUP BY message_id) x WHERE n > 1",
    )
    .await?;
    // seq rises with commit order per aggregate; ledger.id rises with the
    // order effects committed in. Orders have one event each (seq 0).
    let order_violations = one(
        pool,
        "SELECT count(*) FROM
           (SELECT seq, lag(seq) OVER (PARTITION BY aggregate_id ORDER BY id) AS prev
              FROM ledger WHERE aggregate_id LIKE 'acct-%') x
          WHERE prev IS NOT NULL AND seq <= prev",
    )
    .await?;
    let file_plugin_missing = one(
        pool,
        &format!(
            "SELECT count(*) FROM outbox WHERE event_type LIKE 'order.%'
                AND published_at IS NOT NULL AND outcome IS DISTINCT FROM 'filtered'
                AND coalesce(transformed_by, '') NOT LIKE '%{}@%'",
            crate::cluster::FILE_PLUGIN
        ),
    )
    .await?;
    Ok(Verdict {
        file_plugin_missing,
        events,
        atomicity_violations,
        unpublished,
        dead,
        consumer_dead_letters,
        lost,
        duplicate_effects,
        order_violations,
        by_writer: groups(
            pool,
            "SELECT writer, count(*) FROM ledger GROUP BY 1 ORDER BY 1",
        )
        .await?,
        by_shape: groups(
            pool,
            "SELECT shape, count(*) FROM ledger GROUP BY 1 ORDER BY 1",
        )
        .await?,
        by_transformer: groups(
            pool,
            "SELECT transformed_by, count(*) FROM outbox GROUP BY 1 ORDER BY 1",
        )
        .await?,
    })
}

/// The outbox's rows and its size on disk with indexes and TOAST, in bytes.
pub async fn outbox_size(pool: &PgPool) -> Result<(i64, i64), sqlx::Error> {
    Ok((
        one(pool, "SELECT count(*) FROM outbox").await?,
        one(pool, "SELECT pg_total_relation_size('outbox')").await?,
    ))
}
