//! The data of one plugin Store and the host side of the imports the
//! plugin may use: WASI (locked down) and `outbox:plugin/config`.

use std::collections::BTreeMap;
use std::sync::Arc;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::bindings::transformer::outbox::plugin::config;
use super::limits::MemoryCap;
use super::log::GuestLog;

/// Everything a plugin's Store owns. One per Store, never shared.
pub struct HostState {
    wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) memory: MemoryCap,
    config: Arc<BTreeMap<String, String>>,
    pub(crate) stdout: GuestLog,
    pub(crate) stderr: GuestLog,
    /// The link to the host's transaction, set only while a consumer's
    /// `handle` call runs.
    pub(crate) txn: Option<super::transaction::TxnLink>,
}

impl HostState {
    /// A WASI context with no preopened directories, no environment, no
    /// arguments, no stdin and no network: a socket or a name lookup fails
    /// with an error the guest sees, a file open finds no directory.
    pub fn new(memory_cap_bytes: u64, config: Arc<BTreeMap<String, String>>) -> Self {
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
            config,
            stdout,
            stderr,
            txn: None,
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl config::Host for HostState {
    fn get(&mut self, key: String) -> Option<String> {
        self.config.get(&key).cloned()
    }

    fn get_all(&mut self) -> Vec<(String, String)> {
        self.config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// The shared types interface has no functions; the world imports it for
/// its types only.
impl super::bindings::transformer::outbox::plugin::types::Host for HostState {}
