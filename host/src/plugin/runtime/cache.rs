//! Compiled components on disk, keyed by the sha256 of the component file,
//! so a large plugin (a Python component is ~18 MB) is compiled once per
//! host version instead of at every start.

use std::path::{Path, PathBuf};

use crate::plugin::error::PluginError;

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

/// Creates the cache directory private (0700) when it is missing, and
/// refuses one that this process's user does not own or that its group or
/// others may write: whoever can write there can plant an artifact, and
/// loading an artifact is native code execution (`Component::deserialize`).
pub fn prepare_dir(dir: &Path) -> Result<(), PluginError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let refuse = |why: String| {
        PluginError::Invalid(format!(
            "plugin_runtime.cache_dir {}: {why}; fix it, point plugin_runtime.cache_dir at a private directory, or set cache_dir = false",
            dir.display()
        ))
    };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| refuse(format!("cannot create it ({e})")))?;
    }
    let meta = std::fs::metadata(dir).map_err(|e| refuse(format!("cannot read it ({e})")))?;
    if !meta.is_dir() {
        return Err(refuse("it is not a directory".into()));
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(refuse(format!(
            "it is owned by uid {}, not by this process's uid {me}",
            meta.uid()
        )));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(refuse(format!(
            "its group or others may write to it (mode {mode:03o}), so they could plant a compiled artifact; run `chmod 700 {}`",
            dir.display()
        )));
    }
    Ok(())
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

#[allow(unsafe_code)] // See the SAFETY note; one of the host's three audited unsafe places (ARCHITECTURE.md).
fn deserialize(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: `Component::deserialize` trusts its input to be an artifact
    // this wasmtime produced. The file lives in the host's own cache dir,
    // was written by `Component::serialize` above, is named by the sha256 of
    // its source and by the engine's compatibility hash, and wasmtime still
    // checks its header, version and engine settings before use.
    unsafe { Component::deserialize(engine, bytes) }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::prepare_dir;
    use crate::plugin::PluginError;

    fn mode(p: &std::path::Path) -> u32 {
        std::fs::metadata(p).expect("stat").permissions().mode() & 0o777
    }

    #[test]
    fn a_missing_cache_dir_is_created_private() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("a/b/components");
        prepare_dir(&dir).expect("created");
        assert_eq!(mode(&dir), 0o700);
    }

    #[test]
    fn a_private_cache_dir_is_obeyed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        prepare_dir(tmp.path()).expect("a dir only its owner may write is accepted");
    }

    #[test]
    fn a_cache_dir_others_can_write_is_refused_with_the_fix() {
        for bad in [0o777, 0o770, 0o722] {
            let tmp = tempfile::tempdir().expect("tempdir");
            std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(bad))
                .expect("chmod");
            match prepare_dir(tmp.path()) {
                Err(PluginError::Invalid(msg)) => {
                    assert!(
                        msg.contains("plugin_runtime.cache_dir")
                            && msg.contains("chmod 700")
                            && msg.contains(&format!("{bad:03o}")),
                        "{msg}"
                    );
                }
                other => panic!("mode {bad:03o} accepted: {other:?}"),
            }
        }
    }

    #[test]
    fn a_file_is_not_a_cache_dir() {
        let tmp = tempfile::NamedTempFile::new().expect("tempfile");
        assert!(
            matches!(prepare_dir(tmp.path()), Err(PluginError::Invalid(m)) if m.contains("not a directory"))
        );
    }
}
