//! The `outboxd` binary: a thin shim over [`outboxd::cli`].

fn main() -> std::process::ExitCode {
    outboxd::cli::main()
}
