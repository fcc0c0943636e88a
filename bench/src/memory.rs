//! `outboxd bench memory`: peak RSS of a real `outboxd run` process while it
//! drains backlogs of different sizes. The relay holds one batch per worker
//! (two with `relay.pipeline`), so the peak must not grow with the backlog.

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::PgPool;

use super::BenchError;
use outboxd::store::{Db, migrate};

#[derive(Debug, Clone, clap::Args)]
pub struct MemoryBenchArgs {
    /// A Postgres database the benchmark may empty and fill.
    #[arg(long)]
    pub url: String,
    /// Backlog sizes, events, each drained by a fresh process.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    pub backlogs: Vec<i64>,
    /// Extra `OUTBOXD__…` settings for the child, as KEY=VALUE.
    #[arg(long = "env", value_parser = parse_kv)]
    pub env: Vec<(String, String)>,
    /// The `outboxd` binary to measure; by default the one next to this
    /// benchmark's executable (`cargo build -p outboxd` puts it there).
    #[arg(long, value_name = "PATH")]
    pub outboxd: Option<std::path::PathBuf>,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{s}`: expected KEY=VALUE"))
}

#[derive(Debug, Clone, Serialize)]
pub struct MemoryRow {
    pub backlog: i64,
    pub drain_seconds: f64,
    /// Highest resident set size seen (`VmHWM`), MiB.
    pub peak_rss_mib: f64,
}

async fn fill(pool: &PgPool, events: i64) -> Result<(), BenchError> {
    sqlx::query("TRUNCATE outbox, transport_messages, transport_cursors")
        .execute(pool)
        .await?;
    sqlx::query(
        "INSERT INTO outbox (aggregate_id, event_type, payload)
         SELECT 'agg-' || (g % 2000), 'bench.event', jsonb_build_object('n', g, 'pad', repeat('x', 200))
           FROM generate_series(1, $1) g ORDER BY g",
    )
    .bind(events)
    .execute(pool)
    .await?;
    sqlx::query("ANALYZE outbox").execute(pool).await?;
    Ok(())
}

/// `VmHWM` (peak RSS) of `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    super::proc_status_kib(Some(pid), "VmHWM")
}

pub async fn memory(args: &MemoryBenchArgs) -> Result<Vec<MemoryRow>, BenchError> {
    let db = Db::connect(&args.url, 4).await?;
    let Db::Postgres(pool) = &db else {
        return Err(BenchError::Refused(
            "the memory benchmark needs a postgres:// URL".into(),
        ));
    };
    migrate(&db).await?;
    let exe = match &args.outboxd {
        Some(path) => path.clone(),
        None => std::env::current_exe()
            .map_err(|e| BenchError::Refused(format!("cannot find the outboxd binary: {e}")))?
            .with_file_name("outboxd"),
    };
    if !exe.is_file() {
        return Err(BenchError::Refused(format!(
            "{} is not a file: build outboxd first (cargo build [--release] -p outboxd) or pass --outboxd PATH",
            exe.display()
        )));
    }
    println!("peak RSS of `outboxd run` draining a backlog (Postgres, embedded transport)");
    println!("| backlog | drain s | peak RSS MiB |");
    let mut rows = Vec::new();
    for &backlog in &args.backlogs {
        fill(pool, backlog).await?;
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.arg("run")
            .env("OUTBOXD__DATABASE__URL", &args.url)
            .env("OUTBOXD__RELAY__POLL_INTERVAL_MS", "50")
            .env("OUTBOXD_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        for (k, v) in &args.env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| BenchError::Refused(format!("cannot start {}: {e}", exe.display())))?;
        let pid = child.id().unwrap_or(0);
        let started = Instant::now();
        let mut peak = 0;
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            peak = peak.max(peak_rss_kib(pid).unwrap_or(0));
            if let Ok(Some(status)) = child.try_wait() {
                return Err(BenchError::Refused(format!(
                    "`outboxd run` exited early ({status}); run it by hand with the same URL to see why"
                )));
            }
            let pending: i64 =
                sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
                    .fetch_one(pool)
                    .await?;
            if pending == 0 || started.elapsed() > Duration::from_secs(600) {
                break;
            }
        }
        let drain_seconds = started.elapsed().as_secs_f64();
        peak = peak.max(peak_rss_kib(pid).unwrap_or(0));
        let _ = child.start_kill();
        let _ = child.wait().await;
        let row = MemoryRow {
            backlog,
            drain_seconds,
            peak_rss_mib: peak as f64 / 1024.0,
        };
        println!(
            "| {:>7} | {:>7.1} | {:>12.1} |",
            row.backlog, row.drain_seconds, row.peak_rss_mib
        );
        rows.push(row);
    }
    Ok(rows)
}
