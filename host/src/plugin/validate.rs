//! `outboxd plugin validate`: is the file a component, which world does it
//! implement, against which WIT version, and are its imports allowed.

use serde::Serialize;
use wasmtime::component::Component;

use super::PluginError;
use super::engine::PluginEngine;
use super::transformer::{PluginSpec, TransformerPlugin};

/// The WIT package the host implements.
pub const WIT_PACKAGE: &str = "outbox:plugin@0.1.0";

/// A core Wasm module starts with this version/layer word; a component
/// with `0d 00 01 00`.
const COMPONENT_LAYER: [u8; 4] = [0x0d, 0x00, 0x01, 0x00];

pub fn check_is_component(wasm: &[u8]) -> Result<(), String> {
    if wasm.len() < 8 || &wasm[..4] != b"\0asm" {
        return Err("not a WebAssembly file (no \\0asm header)".into());
    }
    if wasm[4..8] != COMPONENT_LAYER {
        return Err(
            "a core Wasm module, not a component; build for wasm32-wasip2 (or run `wasm-tools component new`)"
                .into(),
        );
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Verdict {
    /// Linked and usable.
    Allowed,
    /// Linked, but the sandbox refuses every use (sockets, files).
    Denied(&'static str),
    /// Not provided by outboxd: the component cannot be instantiated.
    Missing,
}

#[derive(Debug, Clone, Serialize)]
pub struct Validation {
    /// `transformer`, `consumer`, or `None` when no known export is found.
    pub world: Option<&'static str>,
    /// The outbox:plugin version the component imports, when it imports one.
    pub wit_version: Option<String>,
    pub imports: Vec<(String, Verdict)>,
    pub exports: Vec<String>,
    /// Empty when the plugin can run in this host.
    pub problems: Vec<String>,
}

impl Validation {
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

fn verdict(import: &str) -> Verdict {
    let (name, _version) = import.split_once('@').unwrap_or((import, ""));
    if !import.contains(':') {
        // A component-level type import (the guest SDK imports the
        // `transaction` resource type); the type-checked link below is what
        // decides whether it fits.
        return Verdict::Allowed;
    }
    if import.starts_with("outbox:plugin/") {
        // `transaction` is linked for every plugin; outside a consumer's
        // `handle` call every use of it returns a db-error.
        return if import == "outbox:plugin/config@0.1.0"
            || import == "outbox:plugin/types@0.1.0"
            || import == "outbox:plugin/transaction@0.1.0"
        {
            Verdict::Allowed
        } else {
            Verdict::Missing
        };
    }
    match name.split_once('/').map(|(pkg, _)| pkg) {
        Some("wasi:io" | "wasi:clocks" | "wasi:random" | "wasi:cli") => Verdict::Allowed,
        Some("wasi:filesystem") => Verdict::Denied("no directories are preopened"),
        Some("wasi:sockets") => Verdict::Denied("every network use is refused"),
        _ => Verdict::Missing,
    }
}

/// Checks `wasm` as `plugin validate` does. `Err` only when the file is not
/// a component at all or does not compile.
pub fn validate(engine: &PluginEngine, wasm: &[u8]) -> Result<Validation, PluginError> {
    check_is_component(wasm).map_err(PluginError::Invalid)?;
    let component = Component::new(engine.engine(), wasm)
        .map_err(|e| PluginError::Invalid(format!("does not compile: {e:#}")))?;
    let ty = component.component_type();
    let imports: Vec<(String, Verdict)> = ty
        .imports(engine.engine())
        .map(|(name, _)| (name.to_string(), verdict(name)))
        .collect();
    let exports: Vec<String> = ty
        .exports(engine.engine())
        .map(|(name, _)| name.to_string())
        .collect();
    let world = if exports.iter().any(|e| e == "transform") {
        Some("transformer")
    } else if exports.iter().any(|e| e == "handle") {
        Some("consumer")
    } else {
        None
    };
    let wit_version = imports
        .iter()
        .find_map(|(name, _)| name.strip_prefix("outbox:plugin/"))
        .and_then(|rest| rest.split_once('@'))
        .map(|(_, v)| v.to_string());
    let mut problems: Vec<String> = imports
        .iter()
        .filter(|(_, v)| *v == Verdict::Missing)
        .map(|(name, _)| {
            format!("import `{name}` is not provided by outboxd ({WIT_PACKAGE}, WASI p2)")
        })
        .collect();
    match world {
        Some("transformer") if problems.is_empty() => {
            // The authoritative check: the same type-checked link the relay does.
            if let Err(e) =
                TransformerPlugin::from_bytes(engine, &PluginSpec::new("validate", "-"), wasm)
            {
                problems.push(e.to_string());
            }
        }
        Some("consumer") if problems.is_empty() => {
            // The same type-checked link the consumer runner does.
            let linked = engine
                .linker
                .instantiate_pre(&component)
                .map_err(|e| e.to_string())
                .and_then(|pre| {
                    super::bindings::consumer::ConsumerPre::new(pre)
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                });
            if let Err(e) = linked {
                problems.push(format!("does not link as an outbox:plugin consumer: {e}"));
            }
        }
        None => problems.push(format!(
            "exports neither `transform` nor `handle`: not a {WIT_PACKAGE} transformer or consumer"
        )),
        _ => {}
    }
    Ok(Validation {
        world,
        wit_version,
        imports,
        exports,
        problems,
    })
}
