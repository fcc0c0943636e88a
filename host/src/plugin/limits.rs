//! Per-plugin sandbox limits (config data, from `outboxd-core`) and the
//! memory cap that enforces them.

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
