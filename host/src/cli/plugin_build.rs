//! `outboxd plugin build [DIR]`: builds a project `plugin new` wrote. It
//! tells the language from the files (Cargo.toml, package.json, app.py),
//! installs the toolchain piece that is missing (the wasm32-wasip2 target,
//! componentize-py, componentize-js's node_modules), then runs the
//! project's own `build.sh`, which stays the one place the build is
//! written down.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use super::plugin_new::{COMPONENTIZE_PY, Lang};

#[derive(Debug, clap::Args)]
pub(super) struct BuildArgs {
    /// The project directory (default: here).
    #[arg(default_value = ".")]
    dir: PathBuf,
}

fn detect(dir: &Path) -> anyhow::Result<Lang> {
    if dir.join("Cargo.toml").is_file() {
        Ok(Lang::Rust)
    } else if dir.join("package.json").is_file() {
        Ok(Lang::Js)
    } else if dir.join("app.py").is_file() {
        Ok(Lang::Python)
    } else {
        bail!(
            "{}: not a plugin project (no Cargo.toml, package.json or app.py); create one with \
             `outboxd plugin new NAME --world transformer|consumer --lang rust|python|js`",
            dir.display()
        )
    }
}

/// Runs `program args` in `dir`; `None` when the program is not installed.
fn output(dir: &Path, program: &str, args: &[&str]) -> Option<std::process::Output> {
    Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .ok()
}

fn run(dir: &Path, program: &str, args: &[&str], fix: &str) -> anyhow::Result<()> {
    eprintln!("plugin build: {program} {}", args.join(" "));
    let status = Command::new(program)
        .args(args)
        .current_dir(dir)
        .status()
        .with_context(|| format!("cannot run `{program}`: {fix}"))?;
    if !status.success() {
        bail!("`{program} {}` failed ({status}): {fix}", args.join(" "));
    }
    Ok(())
}

fn ensure_rust(dir: &Path) -> anyhow::Result<()> {
    if output(dir, "cargo", &["--version"]).is_none() {
        bail!("cargo is not installed: install Rust from https://rustup.rs");
    }
    let Some(installed) = output(dir, "rustup", &["target", "list", "--installed"]) else {
        eprintln!(
            "plugin build: rustup not found; assuming the toolchain has the wasm32-wasip2 target"
        );
        return Ok(());
    };
    if !String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.trim() == "wasm32-wasip2")
    {
        run(
            dir,
            "rustup",
            &["target", "add", "wasm32-wasip2"],
            "add it yourself with `rustup target add wasm32-wasip2`",
        )?;
    }
    Ok(())
}

fn ensure_python(dir: &Path) -> anyhow::Result<()> {
    let wanted = format!("componentize-py=={COMPONENTIZE_PY}");
    match output(dir, "componentize-py", &["--version"]) {
        Some(o) if String::from_utf8_lossy(&o.stdout).contains(COMPONENTIZE_PY) => Ok(()),
        Some(o) => {
            eprintln!(
                "plugin build: warning: {} is installed; this outboxd is tested with {wanted}",
                String::from_utf8_lossy(&o.stdout).trim()
            );
            Ok(())
        }
        None => run(
            dir,
            "python3",
            &["-m", "pip", "install", "--quiet", &wanted],
            &format!("install it yourself with `pip install {wanted}` (Python 3.10+ is needed)"),
        ),
    }
}

fn ensure_js(dir: &Path) -> anyhow::Result<()> {
    if output(dir, "node", &["--version"]).is_none() || output(dir, "npm", &["--version"]).is_none()
    {
        bail!(
            "node and npm are needed to build a JavaScript plugin (Debian: apt-get install nodejs npm)"
        );
    }
    if !dir
        .join("node_modules/@bytecodealliance/componentize-js/package.json")
        .is_file()
    {
        run(
            dir,
            "npm",
            &["ci", "--no-audit", "--no-fund"],
            "npm could not install componentize-js from package-lock.json (is the registry reachable?)",
        )?;
    }
    Ok(())
}

pub(super) fn run_build(a: &BuildArgs) -> anyhow::Result<()> {
    let dir = std::fs::canonicalize(&a.dir)
        .with_context(|| format!("no such directory: {}", a.dir.display()))?;
    let lang = detect(&dir)?;
    match lang {
        Lang::Rust => ensure_rust(&dir)?,
        Lang::Python => ensure_python(&dir)?,
        Lang::Js => ensure_js(&dir)?,
    }
    if !dir.join("build.sh").is_file() {
        bail!(
            "{}: no build.sh (every project `plugin new` writes has one)",
            dir.display()
        );
    }
    run(
        &dir,
        "bash",
        &["build.sh"],
        "the compiler's messages above say what to fix",
    )
}
