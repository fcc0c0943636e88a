//! `outboxd-bench …` (also `outboxd bench …`): the benchmark subcommands (see BENCHMARKS.md).

use std::process::ExitCode;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Claim-query latency with many published rows and a pending backlog.
    Claim(crate::ClaimBenchArgs),
    /// Relay throughput over batch sizes and workers, against a sequential
    /// poll-and-mark relay (each send awaited, one UPDATE per row).
    Relay(crate::RelayBenchArgs),
    /// Consumer throughput: per message against batched, native against plugin.
    Consumer(crate::ConsumerBenchArgs),
    /// End-to-end latency at fixed arrival rates, LISTEN/NOTIFY against polling.
    Latency(crate::LatencyBenchArgs),
    /// A consumer draining a backlog from each broker, in one run.
    TransportConsumer(crate::TransportConsumerArgs),
    /// Peak RSS of `outboxd run` draining backlogs of several sizes.
    Memory(crate::MemoryBenchArgs),
    /// The outage arithmetic, measured: backlog and drain time after a
    /// broker outage, against backlog = rate × T, drain = backlog / (capacity − rate).
    Drain(crate::DrainBenchArgs),
    /// How soon a SQLite commit wakes relays and consumers, in this process
    /// and from another, and what an idle watcher costs.
    SqliteWake(crate::SqliteWakeArgs),
    /// What the lexical guard and the capability gate cost per consumer
    /// plugin statement.
    SqlGate(crate::SqlGateBenchArgs),
    /// The WAL relay against the polling relay, interleaved in one run:
    /// latency through Kafka, throughput at a backlog (with and without a
    /// transformer), statements at idle.
    Wal(crate::WalBenchArgs),
}

pub async fn bench_command(cmd: &BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Claim(args) => {
            let r = crate::claim(args).await?;
            println!(
                "claim latency: {} published + {} pending rows, batch {}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {} claims (fill {:.1} s)",
                r.published_rows,
                r.pending_rows,
                r.batch,
                r.p50_ms,
                r.p99_ms,
                r.max_ms,
                r.claims,
                r.fill_seconds
            );
            println!("{}", serde_json::to_string(&r)?);
        }
        BenchCommand::Consumer(args) => crate::consumer(args).await?,
        BenchCommand::TransportConsumer(args) => {
            crate::transport_consumer(args).await?;
        }
        BenchCommand::Memory(args) => {
            crate::memory(args).await?;
        }
        BenchCommand::Latency(args) => {
            crate::latency(args).await?;
        }
        BenchCommand::Relay(args) => {
            crate::relay(args).await?;
        }
        BenchCommand::Drain(args) => {
            crate::drain(args).await?;
        }
        BenchCommand::SqliteWake(args) => crate::sqlite_wake(args).await?,
        BenchCommand::SqlGate(args) => crate::sql_gate(args).await?,
        BenchCommand::Wal(args) => {
            crate::wal(args).await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
