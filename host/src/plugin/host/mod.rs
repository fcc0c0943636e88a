//! The host side of a plugin's Store: one module per host capability, and
//! one Store data type per world, each with the Linker that provides what
//! that world may import and nothing else.
//!
//! # Layout
//!
//! - [`sandbox`]: what every Store has: locked-down WASI, the resource
//!   table, the memory cap, and the guest's output ([`log`]).
//! - [`config`]: `outbox:plugin/config`, for both worlds.
//! - [`transaction`]: `outbox:plugin/transaction`, for consumers only.
//! - [`http`]: `wasi:http/outgoing-handler`, for consumers only, sent by
//!   the host under the plugin's allow-list and limits.
//!
//! Each capability has the shape of wasmtime's `wasi-config`: a state
//! struct, a borrowed view that implements the generated `Host` trait, and
//! an `add_to_linker` that takes the way from a Store's data to the view.
//! [`TransformerState`] and [`ConsumerState`] compose them.

pub mod config;
pub mod http;
pub mod log;
pub mod sandbox;
pub mod transaction;

use std::collections::BTreeMap;
use std::sync::Arc;

use wasmtime::Engine;
use wasmtime::component::Linker;
use wasmtime_wasi::{WasiCtxView, WasiView};

use self::config::{ConfigVars, ConfigView};
use self::http::HttpState;
use self::sandbox::Sandbox;
use self::transaction::{TransactionView, TxnState};
use crate::plugin::error::PluginError;

/// The data of one world's Store: what the pool of Stores needs of it,
/// whichever world it serves.
pub(crate) trait StoreState: WasiView + Send + Sized + 'static {
    /// A fresh Store's data: a new sandbox capped at `memory_cap_bytes`,
    /// and the plugin's settings.
    fn new(memory_cap_bytes: u64, config: Arc<BTreeMap<String, String>>) -> Self;
    fn sandbox(&self) -> &Sandbox;
    fn sandbox_mut(&mut self) -> &mut Sandbox;
    /// A Linker with exactly the imports this world may use.
    fn linker(engine: &Engine) -> Result<Linker<Self>, PluginError>;
}

/// A transformer's Store: the sandbox and `config`. It has no transaction,
/// and its Linker has no `outbox:plugin/transaction`, so a transformer
/// that imports it does not link.
pub struct TransformerState {
    sandbox: Sandbox,
    config: ConfigVars,
}

impl StoreState for TransformerState {
    fn new(memory_cap_bytes: u64, config: Arc<BTreeMap<String, String>>) -> Self {
        Self {
            sandbox: Sandbox::new(memory_cap_bytes),
            config: ConfigVars::new(config),
        }
    }

    fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    fn sandbox_mut(&mut self) -> &mut Sandbox {
        &mut self.sandbox
    }

    fn linker(engine: &Engine) -> Result<Linker<Self>, PluginError> {
        let mut linker = Linker::new(engine);
        sandbox::add_to_linker(&mut linker)?;
        config::add_to_linker(&mut linker, |s: &mut Self| ConfigView::new(&s.config))?;
        Ok(linker)
    }
}

impl WasiView for TransformerState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        self.sandbox.wasi()
    }
}

/// A consumer's Store: the sandbox, `config`, and the transaction the
/// guest borrows during `handle`.
pub struct ConsumerState {
    sandbox: Sandbox,
    config: ConfigVars,
    txn: TxnState,
    http: HttpState,
}

impl ConsumerState {
    /// The transaction capability of this Store.
    pub(crate) fn transaction(&mut self) -> TransactionView<'_> {
        TransactionView::new(&mut self.txn, &mut self.sandbox.table)
    }

    /// The HTTP capability of this Store.
    pub(crate) fn http(&mut self) -> &mut HttpState {
        &mut self.http
    }
}

impl wasmtime_wasi_http::WasiHttpView for ConsumerState {
    fn http(&mut self) -> wasmtime_wasi_http::WasiHttpCtxView<'_> {
        self.http.view(&mut self.sandbox.table)
    }
}

impl StoreState for ConsumerState {
    fn new(memory_cap_bytes: u64, config: Arc<BTreeMap<String, String>>) -> Self {
        Self {
            sandbox: Sandbox::new(memory_cap_bytes),
            config: ConfigVars::new(config),
            txn: TxnState::default(),
            http: HttpState::default(),
        }
    }

    fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    fn sandbox_mut(&mut self) -> &mut Sandbox {
        &mut self.sandbox
    }

    fn linker(engine: &Engine) -> Result<Linker<Self>, PluginError> {
        let mut linker = Linker::new(engine);
        sandbox::add_to_linker(&mut linker)?;
        config::add_to_linker(&mut linker, |s: &mut Self| ConfigView::new(&s.config))?;
        transaction::add_to_linker(&mut linker, Self::transaction)?;
        http::add_to_linker(&mut linker)?;
        Ok(linker)
    }
}

impl WasiView for ConsumerState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        self.sandbox.wasi()
    }
}
