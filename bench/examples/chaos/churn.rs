//! `--churn MIN-MAXs`: a consumer process SIGKILLed and started again (with
//! the same instance id, so a static member takes its partitions back)
//! every MIN to MAX seconds, uniformly at random (alone, or with the other
//! faults under `--with-faults`); and
//! how much of the work the consumers kept doing meanwhile, read from the
//! database: messages handled (inbox rows of `ledger`) against events that
//! arrived (outbox rows), both within the churn's window.

use std::str::FromStr;
use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::cluster::Proc;
use crate::rng::Rng;

/// The interval between restarts: `1-4s` (seconds, whole or decimal).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChurnEvery {
    pub min: Duration,
    pub max: Duration,
}

impl FromStr for ChurnEvery {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("`{s}`: give the interval between restarts as MIN-MAXs, e.g. 1-4s");
        let (lo, hi) = s
            .trim()
            .trim_end_matches('s')
            .split_once('-')
            .ok_or_else(bad)?;
        let secs = |v: &str| {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(Duration::from_secs_f64)
        };
        match (secs(lo), secs(hi)) {
            (Some(min), Some(max)) if min <= max => Ok(Self { min, max }),
            _ => Err(bad()),
        }
    }
}

/// Restarts consumer processes on their own schedule, from a generator of
/// their own, so a seed replays the same faults with churn on or off.
pub struct Churn {
    every: ChurnEvery,
    rng: Rng,
    next: Instant,
    /// Indices of the consumer processes in the soak's process list.
    consumers: Vec<usize>,
    pub restarts: u32,
}

impl Churn {
    pub fn new(every: ChurnEvery, seed: u64, consumers: Vec<usize>) -> Self {
        let mut rng = Rng::new(seed ^ 0x00c4_u64.rotate_left(48));
        let next = Instant::now() + Self::pause(every, &mut rng);
        Self {
            every,
            rng,
            next,
            consumers,
            restarts: 0,
        }
    }

    fn pause(every: ChurnEvery, rng: &mut Rng) -> Duration {
        let (lo, hi) = (every.min.as_millis() as u64, every.max.as_millis() as u64);
        rng.millis(lo, hi.max(lo + 1))
    }

    /// Restarts one consumer process when its time has come.
    pub async fn tick(&mut self, procs: &mut [Proc]) -> anyhow::Result<()> {
        if Instant::now() < self.next || self.consumers.is_empty() {
            return Ok(());
        }
        let i = self.consumers[self.rng.below(self.consumers.len() as u64) as usize];
        procs[i].kill().await;
        procs[i].start()?;
        self.restarts += 1;
        self.next = Instant::now() + Self::pause(self.every, &mut self.rng);
        Ok(())
    }
}

/// The churn's window on the database's clock.
pub async fn db_now(pool: &PgPool) -> Result<chrono::DateTime<chrono::Utc>, sqlx::Error> {
    sqlx::query_scalar("SELECT now()").fetch_one(pool).await
}

/// `(handled, arrivals)` between `from` and `to`: the consumer's inbox rows
/// (each written with its effect) and the events producers committed.
pub async fn throughput(
    pool: &PgPool,
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> Result<(i64, i64), sqlx::Error> {
    let handled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM inbox WHERE consumer = 'ledger'
            AND processed_at >= $1 AND processed_at < $2",
    )
    .bind(from)
    .bind(to)
    .fetch_one(pool)
    .await?;
    let arrivals: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE created_at >= $1 AND created_at < $2",
    )
    .bind(from)
    .bind(to)
    .fetch_one(pool)
    .await?;
    Ok((handled, arrivals))
}
