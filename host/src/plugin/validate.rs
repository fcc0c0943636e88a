//! `outboxd plugin validate`: is the file a component, which world does it
//! implement, against which WIT version, and are its imports allowed.

use serde::Serialize;
use wasmtime::component::Component;

use super::error::PluginError;
use super::runtime::engine::PluginEngine;
use super::runtime::loaded::check_is_component;
use super::runtime::transformer::TransformerPlugin;
use crate::config::PluginSpec;

/// The WIT package the host implements.
pub const WIT_PACKAGE: &str = "outbox:plugin@0.1.0";

/// The interface only a consumer's Linker provides.
const TRANSACTION: &str = "outbox:plugin/transaction@0.1.0";

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

/// Whether a component of `world` may import `import`; `http`: the
/// consumer has an allow-list (`allowed_outbound_hosts`).
fn verdict(import: &str, world: Option<&str>, http: bool) -> Verdict {
    let (name, _version) = import.split_once('@').unwrap_or((import, ""));
    if !import.contains(':') {
        // A component-level type import (a consumer imports the
        // `transaction` resource type its `handle` borrows); the
        // type-checked link below is what decides whether it fits.
        return Verdict::Allowed;
    }
    if import.starts_with("outbox:plugin/") {
        // `transaction` is in the consumer's Linker only: a transformer's
        // Store has no transaction to lend.
        let allowed = import == "outbox:plugin/config@0.1.0"
            || import == "outbox:plugin/types@0.1.0"
            || (import == TRANSACTION && world != Some("transformer"));
        return if allowed {
            Verdict::Allowed
        } else {
            Verdict::Missing
        };
    }
    match name.split_once('/').map(|(pkg, _)| pkg) {
        Some("wasi:io" | "wasi:clocks" | "wasi:random" | "wasi:cli") => Verdict::Allowed,
        Some("wasi:filesystem") => Verdict::Denied("no directories are preopened"),
        Some("wasi:sockets") => Verdict::Denied("every network use is refused"),
        // Linked for consumers only, and then only with an allow-list.
        Some("wasi:http") if world == Some("consumer") && http => Verdict::Allowed,
        _ => Verdict::Missing,
    }
}

/// Checks `wasm` as `plugin validate` does, for a plugin with no
/// `allowed_outbound_hosts`. `Err` only when the file is not a component
/// at all or does not compile.
pub fn validate(engine: &PluginEngine, wasm: &[u8]) -> Result<Validation, PluginError> {
    validate_with_hosts(engine, wasm, &[])
}

/// [`validate`] for a plugin whose `allowed_outbound_hosts` is
/// `allowed_hosts`: a consumer may import `wasi:http` only with a
/// non-empty list, a transformer never.
pub fn validate_with_hosts(
    engine: &PluginEngine,
    wasm: &[u8],
    allowed_hosts: &[String],
) -> Result<Validation, PluginError> {
    check_is_component(wasm).map_err(PluginError::Invalid)?;
    let component = Component::new(engine.engine(), wasm)
        .map_err(|e| PluginError::Invalid(format!("does not compile: {e:#}")))?;
    let ty = component.component_type();
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
    let imports: Vec<(String, Verdict)> = ty
        .imports(engine.engine())
        .map(|(name, _)| {
            let v = verdict(name, world, !allowed_hosts.is_empty());
            (name.to_string(), v)
        })
        .collect();
    let wit_version = imports
        .iter()
        .find_map(|(name, _)| name.strip_prefix("outbox:plugin/"))
        .and_then(|rest| rest.split_once('@'))
        .map(|(_, v)| v.to_string());
    let mut problems: Vec<String> = imports
        .iter()
        .filter(|(_, v)| *v == Verdict::Missing)
        .map(|(name, _)| match (name.as_str(), world) {
            (TRANSACTION, Some("transformer")) => format!(
                "import `{TRANSACTION}` is for consumers only: a transformer's Store has no \
                 transaction (build it with a guest SDK that keeps the consumer world out of \
                 transformers, or export `handle` to be a consumer)"
            ),
            (http, Some("consumer")) if http.starts_with("wasi:http/") => format!(
                "import `{http}`: this consumer calls out over HTTP but has no allow-list; set \
                 plugins[NAME].allowed_outbound_hosts = [\"https://HOST[:PORT]\", ...] in the \
                 config (`plugin validate --allow-host URL` here), or build it for the \
                 `consumer` world without HTTP"
            ),
            (http, _) if http.starts_with("wasi:http/") => format!(
                "import `{http}`: transformers never get network; only a consumer plugin \
                 (world consumer-http) with allowed_outbound_hosts may call out"
            ),
            _ => format!("import `{name}` is not provided by outboxd ({WIT_PACKAGE}, WASI p2)"),
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
                .consumers
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
