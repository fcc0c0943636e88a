//! `outboxd bench claim` measures the relay's claim query on a Postgres table with many
//! published rows and a pending backlog: the case retention and the partial
//! indexes exist for.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::BenchError;
use outboxd::store::outbox::pg_claim::PgStore;
use outboxd::store::{ClaimedBatch, Db, OutboxStore, migrate};

#[derive(Debug, Clone, clap::Args)]
pub struct ClaimBenchArgs {
    /// A Postgres URL of a database the benchmark may fill (it must have an
    /// empty outbox, or pass --reuse).
    #[arg(long)]
    pub url: String,
    #[arg(long, default_value_t = 5_000_000)]
    pub published: i64,
    #[arg(long, default_value_t = 10_000)]
    pub pending: i64,
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    #[arg(long, default_value_t = 200)]
    pub claims: usize,
    /// Measure an outbox that is already filled.
    #[arg(long)]
    pub reuse: bool,
}

#[derive(Debug, Serialize)]
pub struct ClaimBenchReport {
    pub published_rows: i64,
    pub pending_rows: i64,
    pub batch: usize,
    pub claims: usize,
    pub fill_seconds: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

pub async fn claim(args: &ClaimBenchArgs) -> Result<ClaimBenchReport, BenchError> {
    let db = Db::connect(&args.url, 4).await?;
    let Db::Postgres(pool) = &db else {
        return Err(BenchError::Refused(
            "the claim benchmark needs a postgres:// URL".into(),
        ));
    };
    migrate(&db).await?;
    let existing: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(pool)
        .await?;
    let started = Instant::now();
    if existing > 0 && !args.reuse {
        return Err(BenchError::Refused(format!(
            "the outbox at this URL already has {existing} rows; use an empty database or pass --reuse"
        )));
    }
    if existing == 0 {
        // Published history over 100,000 aggregates, then the pending backlog
        // over 2,000 aggregates, as a relay under load sees it.
        sqlx::query(
            "INSERT INTO outbox (aggregate_id, event_type, payload, published_at, created_at)
             SELECT 'agg-' || (g % 100000), 'bench.published', '{\"n\":1}'::jsonb, now(), now()
               FROM generate_series(1, $1) g",
        )
        .bind(args.published)
        .execute(pool)
        .await?;
        sqlx::query(
            "INSERT INTO outbox (aggregate_id, event_type, payload)
             SELECT 'pend-' || (g % 2000), 'bench.pending', '{\"n\":1}'::jsonb FROM generate_series(1, $1) g",
        )
        .bind(args.pending)
        .execute(pool)
        .await?;
        sqlx::query("ANALYZE outbox").execute(pool).await?;
    }
    let fill_seconds = started.elapsed().as_secs_f64();
    let published_rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
            .fetch_one(pool)
            .await?;
    let pending_rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .fetch_one(pool)
            .await?;
    let store = PgStore::new(pool.clone());
    let mut samples = Vec::with_capacity(args.claims);
    for _ in 0..args.claims {
        let t = Instant::now();
        let batch = store.claim(args.batch, chrono::Utc::now()).await?;
        samples.push(t.elapsed());
        // Roll back: every claim sees the same backlog.
        std::hint::black_box(batch.events().len());
        drop(batch);
    }
    samples.sort();
    let pick = |p: f64| -> f64 {
        let idx = ((samples.len() as f64 - 1.0) * p).round() as usize;
        samples
            .get(idx)
            .copied()
            .unwrap_or(Duration::ZERO)
            .as_secs_f64()
            * 1000.0
    };
    Ok(ClaimBenchReport {
        published_rows,
        pending_rows,
        batch: args.batch,
        claims: args.claims,
        fill_seconds,
        p50_ms: pick(0.5),
        p99_ms: pick(0.99),
        max_ms: pick(1.0),
    })
}
