//! `outboxd-bench wal` idle: what a relay with nothing to do asks of the
//! outbox database, counted as transactions (`xact_commit +
//! xact_rollback` of `pg_stat_database`) over a quiet window.
//!
//! The relay is `outboxd run` with nothing else in it: no consumers, the
//! admin API (and with it the sampler) off, retention not due, no
//! registry plugins (so no registry polling). A window with no relay at
//! all comes first, as the floor (autovacuum and the like). The counters
//! are read over a connection to the `postgres` database, so reading them
//! adds nothing to the count. The replication stream is no transaction:
//! what the WAL relay adds over the floor is statements it runs besides the
//! stream.

use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use super::{Bench, Mode, RelaySetup};
use crate::BenchError;

#[derive(Debug, Clone, Serialize)]
pub struct IdleRow {
    /// `none` (no relay), `wal` or `poll`.
    pub relay: String,
    pub seconds: u64,
    pub transactions: i64,
    /// Over the no-relay window of the same run.
    pub over_floor: i64,
}

pub(crate) async fn run(bench: &Bench) -> Result<Vec<IdleRow>, BenchError> {
    let a = &bench.args;
    let options = PgConnectOptions::from_str(&a.url)
        .map_err(|e| BenchError::Refused(format!("--url: {e}")))?
        .database("postgres");
    let stats = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await?;
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&bench.pool)
        .await?;
    println!(
        "idle: transactions on database {database} over {} s with nothing to relay (pg_stat_database xact_commit + xact_rollback; `outboxd run` with no consumers, admin API off, retention not due, no registry plugins; {} s settle after start)",
        a.idle_seconds, a.idle_settle_seconds
    );
    println!("| relay | seconds | transactions | over the no-relay floor | per second |");
    println!("|---|---:|---:|---:|---:|");
    let count = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database WHERE datname = $1",
        )
        .bind(&database)
        .fetch_one(&stats)
        .await?;
        Ok::<i64, BenchError>(n)
    };
    let window = Duration::from_secs(a.idle_seconds);
    let settle = Duration::from_secs(a.idle_settle_seconds);
    let setup = RelaySetup {
        topic: "outboxd.walbench.idle".into(),
        plugin: None,
        kafka: a.brokers.is_some(),
    };
    let mut rows: Vec<IdleRow> = Vec::new();
    let mut floor = 0;
    let mut cells: Vec<Option<Mode>> = vec![None];
    cells.extend(bench.modes.iter().copied().map(Some));
    for cell in cells {
        bench.reset().await?;
        let relay = match cell {
            Some(mode) => Some(bench.start_relay(mode, &setup).await?),
            None => None,
        };
        tokio::time::sleep(settle).await;
        let measured = async {
            let before = count().await?;
            tokio::time::sleep(window).await;
            // Let the last statements of the window reach the counters
            // before the next cell starts; they are counted here.
            let after = count().await?;
            Ok::<i64, BenchError>(after - before)
        }
        .await;
        if let Some(r) = relay {
            r.stop().await;
        }
        let transactions = measured?;
        let name = cell.map(Mode::name).unwrap_or("none");
        if cell.is_none() {
            floor = transactions;
        }
        let row = IdleRow {
            relay: name.into(),
            seconds: a.idle_seconds,
            transactions,
            over_floor: transactions - floor,
        };
        println!(
            "| {} | {} | {} | {} | {:.2} |",
            row.relay,
            row.seconds,
            row.transactions,
            row.over_floor,
            row.over_floor as f64 / a.idle_seconds.max(1) as f64
        );
        rows.push(row);
    }
    stats.close().await;
    Ok(rows)
}
