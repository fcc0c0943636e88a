//! What a `[[consumers]]` entry's `handler` resolves to: a native handler
//! that the binary registered by name ([`NativeHandlers`]), or a consumer
//! plugin. [`ConsumerHandler`] is either, as one [`Handler`]; every trait
//! method is forwarded, `begin` included: a plugin's transaction settings
//! must not be lost behind the wrapper.
//!
//! The `outboxd` binary registers no native handler. A library user who
//! wants Rust handlers next to plugins builds a binary of their own with
//! `Daemon::builder().handler("billing", BillingHandler)`.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::inbox::Handler;
use super::inbox::HandlerError;
use super::inbox::Pinned;
use super::plugin_handler::{DryRun, PluginHandler};
use crate::config::HandlerRef;
use crate::message::Delivery;
use crate::store::InboxTx;

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`Handler`] behind a pointer: the registry holds handlers of different
/// types. Implemented for every `Handler`; only this module names it.
trait DynHandler: Send + Sync + 'static {
    fn dyn_begin<'a>(&'a self, tx: &'a mut InboxTx) -> BoxFuture<'a, Result<(), sqlx::Error>>;
    fn dyn_before_commit<'a>(
        &'a self,
        tx: &'a mut InboxTx,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>>;
    fn dyn_handle<'a>(
        &'a self,
        tx: &'a mut InboxTx,
        d: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
    fn dyn_pin(&self) -> Pinned;
    fn dyn_pin_version<'a>(&'a self, label: &'a str)
    -> BoxFuture<'a, Result<Pinned, HandlerError>>;
    fn dyn_handle_pinned<'a>(
        &'a self,
        pinned: &'a Pinned,
        tx: &'a mut InboxTx,
        d: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

impl<H: Handler> DynHandler for H {
    fn dyn_begin<'a>(&'a self, tx: &'a mut InboxTx) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(Handler::begin(self, tx))
    }
    fn dyn_before_commit<'a>(
        &'a self,
        tx: &'a mut InboxTx,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(Handler::before_commit(self, tx))
    }
    fn dyn_handle<'a>(
        &'a self,
        tx: &'a mut InboxTx,
        d: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(Handler::handle(self, tx, d))
    }
    fn dyn_pin(&self) -> Pinned {
        Handler::pin(self)
    }
    fn dyn_pin_version<'a>(
        &'a self,
        label: &'a str,
    ) -> BoxFuture<'a, Result<Pinned, HandlerError>> {
        Box::pin(Handler::pin_version(self, label))
    }
    fn dyn_handle_pinned<'a>(
        &'a self,
        pinned: &'a Pinned,
        tx: &'a mut InboxTx,
        d: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(Handler::handle_pinned(self, pinned, tx, d))
    }
}

/// A native handler registered under a name.
#[derive(Clone)]
pub struct NativeHandler {
    name: String,
    handler: Arc<dyn DynHandler>,
}

impl std::fmt::Debug for NativeHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeHandler")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The native handlers a binary offers to `handler = "builtin:NAME"`.
#[derive(Clone, Default, Debug)]
pub struct NativeHandlers {
    by_name: BTreeMap<String, NativeHandler>,
}

impl NativeHandlers {
    /// Registers `handler` as `builtin:NAME`; a second registration of a
    /// name replaces the first.
    pub fn register(&mut self, name: impl Into<String>, handler: impl Handler) {
        let name = name.into();
        self.by_name.insert(
            name.clone(),
            NativeHandler {
                name,
                handler: Arc::new(handler),
            },
        );
    }

    /// The handler registered as `name`, or an error that names the key,
    /// what this binary has and the fix.
    pub fn get(&self, key: &str, name: &str) -> Result<NativeHandler, String> {
        self.by_name.get(name).cloned().ok_or_else(|| {
            let have = if self.by_name.is_empty() {
                "this binary registers none".to_string()
            } else {
                let names: Vec<_> = self.by_name.keys().map(|n| format!("builtin:{n}")).collect();
                format!("this binary has {}", names.join(", "))
            };
            format!(
                "{key}: no native handler is registered as `builtin:{name}` ({have}); use plugin:NAME for a consumer plugin, or register the handler in your own binary with Daemon::builder().handler(\"{name}\", …)"
            )
        })
    }
}

/// A consumer's configured handler: native, or a consumer plugin.
pub enum ConsumerHandler {
    Native(NativeHandler),
    Plugin(PluginHandler),
}

impl ConsumerHandler {
    /// What dead letters record as the handler.
    pub fn id(&self) -> String {
        match self {
            ConsumerHandler::Native(h) => HandlerRef::Builtin(h.name.clone()).to_string(),
            ConsumerHandler::Plugin(p) => p.handler_id(),
        }
    }
}

impl ConsumerHandler {
    /// What `d` would do on `pinned`'s version, in a transaction that is
    /// rolled back ([`PluginHandler::dry_run`]). A native handler is not
    /// dry-run: it may act outside the transaction (a call to another
    /// service, say), which no rollback would undo.
    pub async fn dry_run(
        &self,
        db: &crate::store::Db,
        consumer: &str,
        pinned: &Pinned,
        d: &Delivery,
    ) -> DryRun {
        match self {
            ConsumerHandler::Plugin(h) => h.dry_run(db, consumer, pinned, d).await,
            ConsumerHandler::Native(h) => DryRun {
                handled_by: None,
                outcome: Err(HandlerError::Permanent(format!(
                    "consumer `{consumer}` runs the native handler `builtin:{}`, which may act outside its transaction, so it is not dry-run; only plugin handlers are",
                    h.name
                ))),
                statements: Vec::new(),
            },
        }
    }
}

impl Handler for ConsumerHandler {
    async fn begin(&self, tx: &mut InboxTx) -> Result<(), sqlx::Error> {
        match self {
            ConsumerHandler::Native(h) => h.handler.dyn_begin(tx).await,
            ConsumerHandler::Plugin(h) => h.begin(tx).await,
        }
    }

    async fn before_commit(&self, tx: &mut InboxTx) -> Result<(), sqlx::Error> {
        match self {
            ConsumerHandler::Native(h) => h.handler.dyn_before_commit(tx).await,
            ConsumerHandler::Plugin(h) => h.before_commit(tx).await,
        }
    }

    async fn handle(&self, tx: &mut InboxTx, d: &Delivery) -> Result<(), HandlerError> {
        match self {
            ConsumerHandler::Native(h) => h.handler.dyn_handle(tx, d).await,
            ConsumerHandler::Plugin(h) => h.handle(tx, d).await,
        }
    }

    fn pin(&self) -> Pinned {
        match self {
            ConsumerHandler::Native(h) => h.handler.dyn_pin(),
            ConsumerHandler::Plugin(h) => h.pin(),
        }
    }

    async fn pin_version(&self, label: &str) -> Result<Pinned, HandlerError> {
        match self {
            ConsumerHandler::Native(h) => h.handler.dyn_pin_version(label).await,
            ConsumerHandler::Plugin(h) => h.pin_version(label).await,
        }
    }

    async fn handle_pinned(
        &self,
        pinned: &Pinned,
        tx: &mut InboxTx,
        d: &Delivery,
    ) -> Result<(), HandlerError> {
        match self {
            ConsumerHandler::Native(h) => h.handler.dyn_handle_pinned(pinned, tx, d).await,
            ConsumerHandler::Plugin(h) => h.handle_pinned(pinned, tx, d).await,
        }
    }
}
