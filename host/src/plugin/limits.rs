//! Per-plugin sandbox limits and the memory cap that enforces them.

use serde::Deserialize;

/// The sandbox of one plugin; every field has a safe default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Wall-clock deadline of one call, enforced by epoch interruption.
    pub timeout_ms: u64,
    /// Linear memory the plugin may grow to, across all its memories.
    pub memory_mib: u64,
    /// Total bytes (payloads, keys, headers) one call may return.
    pub max_output_bytes: usize,
    /// Messages one call may return.
    pub max_outputs: usize,
    /// Reuse a Store and instance across calls until a failure (faster);
    /// `false` instantiates for every call (no state survives an event).
    pub reuse_instances: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            timeout_ms: 50,
            memory_mib: 64,
            max_output_bytes: 1 << 20,
            max_outputs: 100,
            reuse_instances: true,
        }
    }
}

impl Limits {
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib.saturating_mul(1 << 20)
    }
}

/// Refuses memory and table growth past the caps and remembers that it did,
/// so the trap that follows is reported as out-of-memory.
#[derive(Debug)]
pub struct MemoryCap {
    cap_bytes: u64,
    /// Bytes held by every memory of the instance.
    used: u64,
    pub(crate) hit: bool,
}

/// No plugin needs more table entries than this.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

impl MemoryCap {
    /// Bytes the instance's memories hold now.
    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn new(cap_bytes: u64) -> Self {
        Self {
            cap_bytes,
            used: 0,
            hit: false,
        }
    }
}

impl wasmtime::ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let grow = desired.saturating_sub(current) as u64;
        if self.used.saturating_add(grow) > self.cap_bytes {
            self.hit = true;
            return Ok(false);
        }
        self.used += grow;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }
}
