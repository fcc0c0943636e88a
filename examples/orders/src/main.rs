//! `outboxd-demo`: the example's binary. With no arguments, or `demo …`, it
//! runs the demo; any other subcommand is outboxd's own command line
//! (`run`, `migrate`, `stats`, …) with the example's billing handler
//! registered as `builtin:billing`.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use clap::Parser;

use outboxd_demo::demo::{DemoArgs, DemoLog};

#[derive(Debug, Parser)]
#[command(
    name = "outboxd-demo demo",
    about = "The whole outboxd pipeline on a fresh SQLite file, with nothing else installed"
)]
struct DemoCli {
    #[command(flatten)]
    args: DemoArgs,
}

fn main() -> ExitCode {
    let mut argv: Vec<String> = std::env::args().collect();
    match argv.get(1).map(String::as_str) {
        None => run_demo(DemoCli::parse_from(&argv[..1]).args),
        Some("demo") => {
            argv.remove(1);
            run_demo(DemoCli::parse_from(&argv).args)
        }
        Some(_) => outboxd::cli::main_with(outboxd_demo::daemon().build()),
    }
}

fn run_demo(args: DemoArgs) -> ExitCode {
    let log = if args.verbose {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(log_filter())
            .with_writer(std::io::stderr)
            .try_init();
        DemoLog::default()
    } else {
        match file_logging(&args.log_file()) {
            Ok(log) => log,
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::FAILURE;
            }
        }
    };
    outboxd::cli::run_main(outboxd_demo::demo::run(args, log))
}

fn log_filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_env("OUTBOXD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn,lapin=off"))
}

/// The demo's logs go to a file, so the terminal shows only the demo's own
/// lines; the summary names the file and counts its warnings.
fn file_logging(path: &std::path::Path) -> anyhow::Result<DemoLog> {
    use tracing_subscriber::layer::SubscriberExt;
    let file = std::fs::File::create(path).map_err(|e| {
        anyhow::anyhow!("cannot create the demo's log file {}: {e}", path.display())
    })?;
    let warnings = Arc::new(AtomicUsize::new(0));
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(log_filter())
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file))
        .finish()
        .with(CountWarnings(warnings.clone()));
    let _ = tracing::subscriber::set_global_default(subscriber);
    Ok(DemoLog {
        file: Some(path.to_path_buf()),
        warnings,
    })
}

/// Counts the WARN and ERROR events that reach the log.
struct CountWarnings(Arc<AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountWarnings {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if *event.metadata().level() <= tracing::Level::WARN {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}
