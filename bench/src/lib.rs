//! outboxd's benchmarks, kept out of the product: scenarios that print
//! numbers (never timed tests), run as `outboxd-bench SCENARIO …` (and
//! through `outboxd bench …` when both binaries are installed together).
//!
//! - `claim`: the claim query on a table with millions of published rows.
//! - `consumer`: inbox throughput, per-message against savepoint batches,
//!   native billing against the billing plugin.
//! - `drain`: the outage arithmetic, measured: capacity, arrivals at
//!   a fraction of it, a broker outage, and the drain afterwards, against
//!   backlog = rate × T and drain = backlog / (capacity − rate).
//! - `latency`: commit-to-effect latency at fixed arrival rates, with
//!   LISTEN/NOTIFY and with polling only.
//! - `memory`: peak RSS of `outboxd run` draining backlogs of several sizes.
//! - `relay`: relay throughput over a grid of batch sizes and workers, next
//!   to a sequential poll-and-mark relay in the same harness, with a check that
//!   every event was published exactly once and in per-aggregate order.
//! - `sqlite-wake`: how soon a SQLite commit wakes the relay and consumers
//!   (in this process and from another), and the idle watcher's CPU.
//! - `transport-consumer`: a consumer draining a backlog from each broker
//!   (embedded, Kafka, NATS, RabbitMQ) in one run.
//! - `wal`: the WAL relay against the polling relay in one run: latency
//!   through Kafka, throughput at a backlog (with and without a
//!   transformer), and the statements an idle relay runs.

mod brokers;
mod claim;
pub mod cli;
mod consumer;
mod drain;
mod drain_report;
mod latency;
mod memory;
mod outage;
mod pipeline;
mod relay;
mod relay_report;
mod relay_sink;
mod sql_gate;
mod sqlite_wake;
mod transport_consumer;
mod wal;

pub use claim::{ClaimBenchArgs, ClaimBenchReport, claim};
pub use consumer::{ConsumerBenchArgs, consumer};
pub use drain::{DrainBenchArgs, drain};
pub use drain_report::DrainReport;
pub use latency::{LatencyBenchArgs, LatencyRow, latency};
pub use memory::{MemoryBenchArgs, MemoryRow, memory};
pub use relay::{RelayBenchArgs, relay};
pub use sql_gate::{SqlGateBenchArgs, sql_gate};
pub use sqlite_wake::{SqliteWakeArgs, sqlite_wake};
pub use transport_consumer::{TransportConsumerArgs, TransportConsumerRow, transport_consumer};
pub use wal::{WalBenchArgs, WalReport, wal};

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Store(#[from] outboxd::store::StoreError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("{0}")]
    Refused(String),
    #[error("correctness check failed: {0}")]
    Incorrect(String),
}

/// Writes a benchmark's rows as pretty JSON to `path` (`--json`).
pub(crate) fn write_json<T: serde::Serialize>(
    path: &std::path::Path,
    rows: &T,
) -> Result<(), BenchError> {
    let text = serde_json::to_string_pretty(rows)
        .map_err(|e| BenchError::Refused(format!("cannot encode the results: {e}")))?;
    std::fs::write(path, text)
        .map_err(|e| BenchError::Refused(format!("cannot write {}: {e}", path.display())))
}

/// A `kB` field of `/proc/PID/status` (`VmRSS`, `VmHWM`), in KiB; `pid`
/// `None` reads this process. `None` off Linux or for a gone process.
pub(crate) fn proc_status_kib(pid: Option<u32>, field: &str) -> Option<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_string(),
    };
    let status = std::fs::read_to_string(path).ok()?;
    status
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}
