//! What every plugin Store holds, whichever its world: a locked-down WASI
//! context, the resource table, the memory cap, and the guest's captured
//! stdout and stderr. Both worlds link WASI through [`add_to_linker`].

use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::log::GuestLog;
use crate::plugin::error::PluginError;
use crate::plugin::limits::MemoryCap;

/// The sandbox of one Store. One per Store, never shared.
pub struct Sandbox {
    wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) memory: MemoryCap,
    pub(crate) stdout: GuestLog,
    pub(crate) stderr: GuestLog,
}

impl Sandbox {
    /// A WASI context with no preopened directories, no environment, no
    /// arguments, no stdin and no network: a socket or a name lookup fails
    /// with an error the guest sees, a file open finds no directory.
    pub fn new(memory_cap_bytes: u64) -> Self {
        let stdout = GuestLog::default();
        let stderr = GuestLog::default();
        let wasi = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }))
            .build();
        Self {
            wasi,
            table: ResourceTable::new(),
            memory: MemoryCap::new(memory_cap_bytes),
            stdout,
            stderr,
        }
    }

    /// What `wasmtime_wasi` reaches through a Store's [`WasiView`].
    pub fn wasi(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Links every WASI p2 interface, so that any WASI-capable toolchain's
/// output instantiates; what they can reach is decided by the context in
/// [`Sandbox::new`] (no dirs, no network, no env).
pub fn add_to_linker<T: WasiView + 'static>(linker: &mut Linker<T>) -> Result<(), PluginError> {
    wasmtime_wasi::p2::add_to_linker_async(linker)
        .map_err(|e| PluginError::Invalid(format!("cannot link WASI: {e}")))
}
