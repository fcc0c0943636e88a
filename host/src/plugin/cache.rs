//! Compiled components on disk, keyed by the sha256 of the component file,
//! so a large plugin (a Python component is ~18 MB) is compiled once per
//! host version instead of at every start.

use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

/// Compiles `wasm`, or loads the artifact a previous run stored under
/// `dir/<sha256>-<engine hash>.cwasm`. A stale or corrupt artifact is
/// rejected by wasmtime and recompiled.
pub fn load_or_compile(
    engine: &Engine,
    dir: Option<&Path>,
    sha256: &str,
    wasm: &[u8],
) -> wasmtime::Result<Component> {
    let Some(dir) = dir else {
        return Component::new(engine, wasm);
    };
    let path = artifact_path(engine, dir, sha256);
    if let Ok(bytes) = std::fs::read(&path) {
        match deserialize(engine, &bytes) {
            Ok(component) => return Ok(component),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "stale plugin artifact; recompiling")
            }
        }
    }
    let component = Component::new(engine, wasm)?;
    if let Err(e) = store(&path, &component) {
        tracing::warn!(path = %path.display(), error = %e, "cannot write the plugin artifact cache");
    }
    Ok(component)
}

fn artifact_path(engine: &Engine, dir: &Path, sha256: &str) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    dir.join(format!("{sha256}-{:016x}.cwasm", h.finish()))
}

fn store(path: &Path, component: &Component) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
    }
    let bytes = component.serialize().map_err(|e| e.to_string())?;
    // Write then rename, so a concurrent reader never sees half a file.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, path).map_err(|e| e.to_string())
}

#[allow(unsafe_code)] // See the SAFETY note; the only unsafe code in the host.
fn deserialize(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: `Component::deserialize` trusts its input to be an artifact
    // this wasmtime produced. The file lives in the host's own cache dir,
    // was written by `Component::serialize` above, is named by the sha256 of
    // its source and by the engine's compatibility hash, and wasmtime still
    // checks its header, version and engine settings before use.
    unsafe { Component::deserialize(engine, bytes) }
}
