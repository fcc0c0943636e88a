//! One message through the inbox: begin, mark, handle, commit.
//!
//! Also the inbox's types ([`Handler`], [`Pinned`], [`Attempt`],
//! [`Processed`]; the transaction, [`InboxTx`], is the store's); several
//! messages in one transaction are in `consumer/batch.rs`.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::message::Delivery;
use crate::plugin::lifecycle::slot::ConsumerVersions;
use crate::store::Db;
use crate::store::InboxTx;
use crate::telemetry::FutureExt;

#[derive(Debug, Clone, thiserror::Error)]
pub enum HandlerError {
    /// Roll back and deliver again later.
    #[error("retryable: {0}")]
    Retryable(String),
    /// Roll back; another attempt cannot succeed.
    #[error("permanent: {0}")]
    Permanent(String),
    /// Roll back and wait: no handler version can run yet (a registry
    /// consumer plugin with no active version). Not counted as an attempt,
    /// so it never dead-letters a message.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

impl From<sqlx::Error> for HandlerError {
    fn from(e: sqlx::Error) -> Self {
        HandlerError::Retryable(format!(
            "database error in handler: {e}{}",
            crate::store::backend::problem::hint(&e)
        ))
    }
}

/// A handler's own statement ([`InboxTx::execute`], [`InboxTx::query`]): a
/// bad value cannot succeed on a retry, the database may.
impl From<crate::store::StatementError> for HandlerError {
    fn from(e: crate::store::StatementError) -> Self {
        match e {
            crate::store::StatementError::Value(e) => HandlerError::Permanent(e.to_string()),
            crate::store::StatementError::Database(e) => e.into(),
        }
    }
}

pub trait Handler: Send + Sync + 'static {
    /// Runs once at the start of each transaction, before the first inbox
    /// mark: session settings that hold for the whole transaction (a
    /// consumer plugin's statement timeout). Nothing by default.
    fn begin(&self, _tx: &mut InboxTx) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        async { Ok(()) }
    }

    /// Runs right before each commit: a consumer plugin's handler resets
    /// the session there, so the pooled connection goes back clean.
    fn before_commit(
        &self,
        _tx: &mut InboxTx,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        async { Ok(()) }
    }

    fn handle(
        &self,
        tx: &mut InboxTx,
        delivery: &Delivery,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// Picks the version that will handle the next message, before its
    /// inbox mark (which records the label). A handler whose version can be
    /// swapped reads it once here, so the whole message runs on it.
    fn pin(&self) -> Pinned {
        Pinned::unversioned()
    }

    /// Picks a named version (`NAME@VERSION`, a registry candidate
    /// included) for one redriven message, without activating it for live
    /// traffic: [`handle_pinned`](Self::handle_pinned) then runs the
    /// message on it, and [`pin`](Self::pin) still gives the live version
    /// (fix-forward). A handler without versions refuses.
    fn pin_version(
        &self,
        label: &str,
    ) -> impl Future<Output = Result<Pinned, HandlerError>> + Send {
        let refused = HandlerError::Permanent(format!(
            "cannot run `{label}`: this consumer's handler is not a plugin with versions; redrive without `--with`"
        ));
        async move { Err(refused) }
    }

    /// Handles one message on the version [`pin`](Self::pin) picked.
    fn handle_pinned(
        &self,
        pinned: &Pinned,
        tx: &mut InboxTx,
        delivery: &Delivery,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        let _ = pinned;
        self.handle(tx, delivery)
    }
}

/// The handler version picked for one message.
#[derive(Debug, Clone)]
pub struct Pinned {
    /// `name@version`, recorded in the inbox row's `handled_by` and in a
    /// dead letter; `None` for a built-in handler (or no active version).
    pub label: Option<String>,
    /// A swappable plugin's versions as they were when picked.
    pub versions: Option<Arc<ConsumerVersions>>,
    /// When it was picked: the version was current at this instant.
    pub picked_at: Instant,
}

impl Pinned {
    /// A handler without versions.
    pub fn unversioned() -> Self {
        Self {
            label: None,
            versions: None,
            picked_at: Instant::now(),
        }
    }
}

/// One message's outcome and the handler version that produced it (`None`
/// for a duplicate, a built-in handler, or a message with no usable id).
#[derive(Debug)]
pub struct Attempt {
    pub result: Result<Processed, HandlerError>,
    pub handled_by: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Processed {
    /// The effect committed together with the inbox mark.
    Handled,
    /// The inbox already had this message for this consumer: no effect.
    Duplicate,
}

/// Handles one delivery exactly once per consumer name: the inbox mark and
/// the handler's writes commit together or not at all.
pub async fn process<H: Handler>(
    db: &Db,
    consumer: &str,
    delivery: &Delivery,
    handler: &H,
) -> Result<Processed, HandlerError> {
    attempt(db, consumer, delivery, handler).await.result
}

/// [`process`], also naming the handler version that ran.
pub async fn attempt<H: Handler>(
    db: &Db,
    consumer: &str,
    delivery: &Delivery,
    handler: &H,
) -> Attempt {
    let failed = |e: HandlerError| Attempt {
        result: Err(e),
        handled_by: None,
    };
    let message_id = match delivery.message_id() {
        Ok(id) => id,
        Err(e) => return failed(HandlerError::Permanent(e)),
    };
    let mut tx = match InboxTx::begin(db).await {
        Ok(tx) => tx,
        Err(e) => return failed(e.into()),
    };
    if let Err(e) = handler.begin(&mut tx).await {
        let _ = tx.rollback().await;
        return failed(e.into());
    }
    match mark_and_handle(&mut tx, consumer, message_id, delivery, handler).await {
        (handled_by, Ok(Processed::Handled)) => {
            if let Err(e) = handler.before_commit(&mut tx).await {
                let _ = tx.rollback().await;
                return failed(e.into());
            }
            let span = crate::telemetry::for_delivery(delivery, "commit", consumer);
            let committed = tx.commit().await;
            span.record(&committed);
            drop(span);
            Attempt {
                result: committed
                    .map(|()| Processed::Handled)
                    .map_err(HandlerError::from),
                handled_by,
            }
        }
        (handled_by, result) => {
            if let Err(e) = tx.rollback().await {
                return failed(e.into());
            }
            Attempt { result, handled_by }
        }
    }
}

/// Inside `tx`: pick the version, write the inbox mark naming it, run the
/// handler on it. A duplicate is `Ok(Duplicate)`, and the caller rolls back
/// anything that is not `Ok(Handled)`.
pub(super) async fn mark_and_handle<H: Handler>(
    tx: &mut InboxTx,
    consumer: &str,
    message_id: uuid::Uuid,
    delivery: &Delivery,
    handler: &H,
) -> (Option<String>, Result<Processed, HandlerError>) {
    mark_and_handle_pinned(tx, consumer, message_id, delivery, handler, handler.pin()).await
}

/// [`mark_and_handle`] on a version already picked (a redrive's).
pub(super) async fn mark_and_handle_pinned<H: Handler>(
    tx: &mut InboxTx,
    consumer: &str,
    message_id: uuid::Uuid,
    delivery: &Delivery,
    handler: &H,
    pinned: Pinned,
) -> (Option<String>, Result<Processed, HandlerError>) {
    let mark = crate::telemetry::for_delivery(delivery, "inbox.mark", consumer);
    let marked = tx.mark(consumer, message_id, pinned.label.as_deref()).await;
    mark.record(&marked);
    drop(mark);
    match marked {
        Ok(false) => return (None, Ok(Processed::Duplicate)),
        Ok(true) => {}
        Err(e) => return (None, Err(e.into())),
    }
    let result = handle_traced(handler, &pinned, tx, delivery, consumer).await;
    (pinned.label, result.map(|()| Processed::Handled))
}

/// Runs the handler on `pinned` inside a `handle` span under the
/// delivery's trace, which a consumer plugin's statements nest under.
pub(super) async fn handle_traced<H: Handler>(
    handler: &H,
    pinned: &Pinned,
    tx: &mut InboxTx,
    delivery: &Delivery,
    consumer: &str,
) -> Result<(), HandlerError> {
    let span = crate::telemetry::for_delivery(delivery, "handle", consumer);
    let Some(cx) = span.context().cloned() else {
        return handler.handle_pinned(pinned, tx, delivery).await;
    };
    if let Some(label) = &pinned.label {
        crate::telemetry::plugin_attrs(&span, label);
    }
    let result = handler
        .handle_pinned(pinned, tx, delivery)
        .with_context(cx)
        .await;
    span.record(&result);
    result
}
