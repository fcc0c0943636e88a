//! `outboxd bench sqlite-wake`: how soon a SQLite relay or consumer hears
//! of a commit, and what an idle watcher costs.
//!
//! - in-process: a commit on a pool of [`Db::connect`] (the commit hook);
//! - other process: a commit on a plain connection with no hooks, which
//!   only the watcher's `stat` of the files can notice (what a producer in
//!   another process looks like to the watcher);
//! - idle: this process's CPU time over a quiet interval with a watcher
//!   subscribed, as a share of one core.

use std::time::{Duration, Instant};

use sqlx::Connection;
use sqlx::sqlite::SqliteConnection;

use outboxd::store::backend::sqlite_watch;
use outboxd::store::{Db, migrate};

#[derive(Debug, Clone, clap::Args)]
pub struct SqliteWakeArgs {
    /// Commits timed per source.
    #[arg(long, default_value_t = 200)]
    pub commits: usize,
    /// Seconds of idle CPU measured.
    #[arg(long, default_value_t = 10)]
    pub idle_seconds: u64,
    /// The SQLite file (created; replaced if it exists).
    #[arg(long, default_value = "outboxd-bench-wake.db")]
    pub db: std::path::PathBuf,
}

pub async fn sqlite_wake(args: &SqliteWakeArgs) -> anyhow::Result<()> {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = args.db.clone().into_os_string();
        p.push(suffix);
        let _ = std::fs::remove_file(std::path::PathBuf::from(p));
    }
    let url = format!("sqlite://{}", args.db.display());
    let db = Db::connect(&url, 4).await?;
    migrate(&db).await?;
    let Db::Sqlite(pool) = &db else {
        anyhow::bail!("sqlite-wake needs a SQLite file")
    };
    let mut wake = sqlite_watch::subscribe(pool)
        .await
        .ok_or_else(|| anyhow::anyhow!("no watcher for {}", args.db.display()))?;
    let insert =
        "INSERT INTO outbox (id, aggregate_id, event_type, payload) VALUES ($1, 'a', 't', '{}')";

    let mut hooked = Vec::with_capacity(args.commits);
    for _ in 0..args.commits {
        wake.borrow_and_update();
        sqlx::query(insert)
            .bind(uuid::Uuid::new_v4().to_string())
            .execute(pool)
            .await?;
        let committed = Instant::now();
        tokio::time::timeout(Duration::from_secs(2), wake.changed()).await??;
        hooked.push(committed.elapsed());
        tokio::time::sleep(Duration::from_millis(3)).await;
    }

    let mut other = SqliteConnection::connect(&url).await?;
    let mut unhooked = Vec::with_capacity(args.commits);
    for _ in 0..args.commits {
        wake.borrow_and_update();
        sqlx::query(insert)
            .bind(uuid::Uuid::new_v4().to_string())
            .execute(&mut other)
            .await?;
        let committed = Instant::now();
        tokio::time::timeout(Duration::from_secs(2), wake.changed()).await??;
        unhooked.push(committed.elapsed());
        tokio::time::sleep(Duration::from_millis(7)).await;
    }
    other.close().await?;

    let cpu_before = process_cpu()?;
    let idle_start = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let idle_share =
        (process_cpu()? - cpu_before).as_secs_f64() / idle_start.elapsed().as_secs_f64();

    println!(
        "sqlite wake, commit in this process (commit hook): {}",
        summary(&mut hooked)
    );
    println!(
        "sqlite wake, commit by another connection without hooks (file watch): {}",
        summary(&mut unhooked)
    );
    println!(
        "sqlite wake, idle CPU with a watcher subscribed: {:.2} % of one core over {} s",
        idle_share * 100.0,
        args.idle_seconds
    );
    db.close().await;
    Ok(())
}

fn summary(v: &mut [Duration]) -> String {
    v.sort();
    let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)].as_secs_f64() * 1000.0;
    format!(
        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {} commits",
        at(0.5),
        at(0.99),
        at(1.0),
        v.len()
    )
}

/// User plus system CPU time of this process, from /proc/self/stat.
fn process_cpu() -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow::anyhow!("unexpected /proc/self/stat"))?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of the whole line (utime, stime), in clock ticks;
    // here they are the 12th and 13th after the name.
    let ticks: u64 = fields
        .get(11..13)
        .ok_or_else(|| anyhow::anyhow!("unexpected /proc/self/stat"))?
        .iter()
        .map(|f| f.parse::<u64>().unwrap_or(0))
        .sum();
    // The kernel's USER_HZ is 100 on every Linux the host supports.
    Ok(Duration::from_millis(ticks * 10))
}
