//! `outboxd-bench`: a thin shim over [`outboxd_bench::cli`].

use std::process::ExitCode;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "outboxd-bench",
    about = "outboxd's benchmarks: each prints numbers and fails only on a correctness check (see BENCHMARKS.md)"
)]
struct Cli {
    #[command(subcommand)]
    command: outboxd_bench::cli::BenchCommand,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OUTBOXD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn,lapin=off")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    outboxd::cli::run_main(outboxd_bench::cli::bench_command(&cli.command))
}
