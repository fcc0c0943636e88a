//! Builds the demo's two plugins, `cloudevents` (a transformer) and
//! `billing` (a consumer), from `plugins/` for wasm32-wasip2, so that the
//! demo binary carries them and needs no source tree when it runs.
//!
//! The nested cargo build has a target directory of its own under
//! `OUT_DIR` (the outer build holds the workspace's). A machine that has
//! the pinned toolchain but not the wasm32-wasip2 target gets it from
//! `plugins/wasm-target.sh`, as the project's other scripts do.

use std::path::{Path, PathBuf};
use std::process::Command;

const PLUGINS: [&str; 2] = ["cloudevents", "billing"];

fn main() {
    let manifest = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let root = manifest.join("../..");
    let plugins = root.join("plugins");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for watched in [
        plugins.join("Cargo.toml"),
        plugins.join("Cargo.lock"),
        plugins.join("wasm-target.sh"),
        root.join("guest-sdk"),
        root.join("wit"),
    ]
    .into_iter()
    .chain(PLUGINS.iter().map(|p| plugins.join(p)))
    {
        println!("cargo:rerun-if-changed={}", watched.display());
    }

    let target = Command::new("bash")
        .arg(plugins.join("wasm-target.sh"))
        .status();
    match target {
        Ok(s) if s.success() => {}
        Ok(_) => fail(
            "the wasm32-wasip2 target is missing and could not be added (see the message above)",
        ),
        Err(e) => fail(&format!(
            "cannot run bash {}: {e}",
            plugins.join("wasm-target.sh").display()
        )),
    }

    let target_dir = out.join("wasm-target");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args([
            "build",
            "--release",
            "--locked",
            "--quiet",
            "--target",
            "wasm32-wasip2",
        ])
        .args(PLUGINS.iter().flat_map(|p| ["-p", p]))
        .current_dir(&plugins);
    // The outer build's settings (its target, flags, clippy as the
    // compiler, features, profile) are for the host crates, not the guests.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let outer = (key.starts_with("CARGO_") && key != "CARGO_HOME")
            || key.starts_with("RUSTC")
            || key.starts_with("CLIPPY")
            || key == "RUSTFLAGS"
            || key == "RUSTDOCFLAGS";
        if outer {
            build.env_remove(key.as_ref());
        }
    }
    // After the loop: an outer CARGO_TARGET_DIR (a developer's own target
    // directory) would otherwise remove this one too, and the guests would
    // land in plugins/target instead of here.
    build.env("CARGO_TARGET_DIR", &target_dir);
    match build.status() {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!(
            "building the demo's plugins in {} failed ({s})",
            plugins.display()
        )),
        Err(e) => fail(&format!(
            "cannot run cargo to build the demo's plugins: {e}"
        )),
    }
    for name in PLUGINS {
        copy(
            &target_dir.join(format!("wasm32-wasip2/release/{name}.wasm")),
            &out.join(format!("{name}.wasm")),
        );
    }
}

fn copy(from: &Path, to: &Path) {
    if let Err(e) = std::fs::copy(from, to) {
        fail(&format!(
            "cannot copy {} to {}: {e}",
            from.display(),
            to.display()
        ));
    }
}

fn fail(message: &str) -> ! {
    eprintln!("outboxd-demo build: {message}");
    std::process::exit(1);
}
