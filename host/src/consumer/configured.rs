//! [`ConsumerHandler`]: the handler a `[[consumers]]` entry names, built in
//! or a consumer plugin, as one [`Handler`]. Every trait method is
//! forwarded, `begin` included: a plugin's transaction settings must not be
//! lost behind the wrapper.

use super::inbox::{Handler, HandlerError, InboxTx, Pinned};
use super::plugin_handler::PluginHandler;
use crate::broker::Delivery;
use crate::domain::billing::BillingHandler;

/// A consumer's configured handler: built in, or a consumer plugin.
pub enum ConsumerHandler {
    Billing(BillingHandler),
    Plugin(PluginHandler),
}

impl ConsumerHandler {
    /// What dead letters record as the handler.
    pub fn id(&self) -> String {
        match self {
            ConsumerHandler::Billing(_) => {
                crate::config::HandlerRef::Builtin("billing".into()).to_string()
            }
            ConsumerHandler::Plugin(p) => p.handler_id(),
        }
    }
}

impl Handler for ConsumerHandler {
    async fn begin(&self, tx: &mut InboxTx) -> Result<(), sqlx::Error> {
        match self {
            ConsumerHandler::Billing(h) => h.begin(tx).await,
            ConsumerHandler::Plugin(h) => h.begin(tx).await,
        }
    }

    async fn before_commit(&self, tx: &mut InboxTx) -> Result<(), sqlx::Error> {
        match self {
            ConsumerHandler::Billing(h) => h.before_commit(tx).await,
            ConsumerHandler::Plugin(h) => h.before_commit(tx).await,
        }
    }

    async fn handle(&self, tx: &mut InboxTx, d: &Delivery) -> Result<(), HandlerError> {
        match self {
            ConsumerHandler::Billing(h) => h.handle(tx, d).await,
            ConsumerHandler::Plugin(h) => h.handle(tx, d).await,
        }
    }

    fn pin(&self) -> Pinned {
        match self {
            ConsumerHandler::Billing(h) => h.pin(),
            ConsumerHandler::Plugin(h) => h.pin(),
        }
    }

    async fn handle_pinned(
        &self,
        pinned: &Pinned,
        tx: &mut InboxTx,
        d: &Delivery,
    ) -> Result<(), HandlerError> {
        match self {
            ConsumerHandler::Billing(h) => h.handle_pinned(pinned, tx, d).await,
            ConsumerHandler::Plugin(h) => h.handle_pinned(pinned, tx, d).await,
        }
    }
}
