//! The checks a component passes before the registry stores it as a new
//! version (`outboxd plugin deploy`): the same as `outboxd plugin validate`,
//! plus the size cap, a compatible WIT version, and a transformer's sample
//! events or a consumer's link check. A refused version changes nothing.

use crate::config::PluginSpec;
use crate::plugin::harness::SampleEvent;
use crate::plugin::runtime::consumer::ConsumerPlugin;
use crate::plugin::runtime::engine::PluginEngine;
use crate::plugin::runtime::transformer::TransformerPlugin;
use crate::plugin::validate;

/// Components larger than this are refused.
pub const MAX_COMPONENT_BYTES: usize = 32 * 1024 * 1024;

/// The WIT versions this host links: `0.1.x`.
const COMPATIBLE_WIT: &str = "0.1.";

/// The deploy checks: size, `plugin validate`, world (`transformer` or
/// `consumer`), WIT version, then a transformer's samples or a consumer's
/// link check. Returns the world and WIT version to record.
pub(crate) async fn check(
    engine: &PluginEngine,
    spec: &PluginSpec,
    wasm: &[u8],
    samples: &[SampleEvent],
) -> Result<(&'static str, String), String> {
    if wasm.len() > MAX_COMPONENT_BYTES {
        return Err(format!(
            "{} bytes is over the {MAX_COMPONENT_BYTES}-byte component cap",
            wasm.len()
        ));
    }
    let v = validate::validate_with_hosts(engine, wasm, &spec.allowed_outbound_hosts)
        .map_err(|e| e.to_string())?;
    if !v.is_ok() {
        return Err(v.problems.join("; "));
    }
    let world = match v.world {
        Some(w @ ("transformer" | "consumer")) => w,
        other => {
            return Err(format!(
                "implements the {} world; the registry holds outbox:plugin/transformer and outbox:plugin/consumer components",
                other.unwrap_or("unknown")
            ));
        }
    };
    // A component that imports nothing of outbox:plugin still type-checked
    // against the host's transformer world, which is 0.1.0.
    let wit_version = v.wit_version.unwrap_or_else(|| "0.1.0".into());
    if !wit_version.starts_with(COMPATIBLE_WIT) {
        return Err(format!(
            "built against outbox:plugin@{wit_version}; this host links {}",
            validate::WIT_PACKAGE
        ));
    }
    if world == "consumer" {
        // A consumer's call needs a live inbox transaction, so samples are
        // not run; the component must still link and type-check as one.
        if !samples.is_empty() {
            return Err(
                "sample events are run for transformers only; deploy a consumer without --samples"
                    .into(),
            );
        }
        ConsumerPlugin::from_bytes(engine, spec, wasm).map_err(|e| e.to_string())?;
        return Ok((world, wit_version));
    }
    if !samples.is_empty() {
        let plugin =
            TransformerPlugin::from_bytes(engine, spec, wasm).map_err(|e| e.to_string())?;
        for (i, sample) in samples.iter().enumerate() {
            plugin
                .transform(&sample.to_guest())
                .await
                .map_err(|e| format!("sample {i} ({}): {e}", sample.event_type))?;
        }
    }
    Ok((world, wit_version))
}
