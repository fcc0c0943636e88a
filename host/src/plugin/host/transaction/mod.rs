//! The `outbox:plugin/transaction` import, which only the consumer world
//! has: the resource a consumer plugin borrows during `handle`. Shaped
//! after wasmtime's `wasi-config`: the state ([`TxnState`]), a borrowed
//! view ([`TransactionView`]) implementing the generated `Host` traits, and
//! an [`add_to_linker`].
//!
//! The plugin never holds the database transaction: its calls travel
//! through a [`Mailbox`] to [`server::TxnServer`], which owns the borrow
//! of the host's `InboxTx` for the length of one call and checks, budgets
//! and runs each statement.

pub mod record;
pub mod server;

pub use record::{EmittedEvent, PluginStatement, Recording, StatementKind, StatementValues};

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};

use crate::plugin::bindings::consumer::outbox::plugin::transaction::{
    self as wit, DbError, Rows, Value,
};
use crate::plugin::error::PluginError;

/// The resource table's entry behind the handle the guest borrows. It
/// carries nothing: the live link to the transaction is [`TxnState`], set
/// only during a call.
#[derive(Debug)]
pub struct ActiveTransaction;

pub(crate) enum Op {
    Execute(String, Vec<Value>),
    Query(String, Vec<Value>),
    Emit(wit::NewEvent),
}

pub(crate) enum Reply {
    Affected(u64),
    Rows(Rows),
    Emitted(String),
}

/// The one statement in flight between the guest and [`server::TxnServer`], and
/// its answer.
///
/// No waker is involved: the guest's call and the server run in the same
/// task, and the loop in `ConsumerPlugin::call` polls them in turn. A host
/// call leaves its request here and returns `Pending` with the wasm call
/// suspended; the loop finds the request as soon as the call returns,
/// serves it and polls the call again, which then finds the reply. A
/// channel would wake the task on every send, and on tokio's multi-thread
/// runtime each wake can hand the task to another worker thread: that cost
/// more than the statement itself.
#[derive(Default)]
pub(crate) struct Mailbox {
    request: std::sync::Mutex<Option<Op>>,
    reply: std::sync::Mutex<Option<Result<Reply, DbError>>>,
}

impl Mailbox {
    /// The request the guest left, if any.
    pub(crate) fn take_request(&self) -> Option<Op> {
        self.request.lock().ok()?.take()
    }

    pub(crate) fn put_reply(&self, reply: Result<Reply, DbError>) {
        if let Ok(mut slot) = self.reply.lock() {
            *slot = Some(reply);
        }
    }
}

/// The guest's way to the transaction while a `handle` call runs.
pub(crate) type TxnLink = std::sync::Arc<Mailbox>;

pub(crate) fn link() -> TxnLink {
    TxnLink::default()
}

/// Resolves once the loop has left a request in `link`, without
/// registering a waker (see [`Mailbox`]): it is polled right after the
/// guest's call returned `Pending`, which is when a request appears.
pub(crate) fn next_request(link: &TxnLink) -> impl std::future::Future<Output = Op> + '_ {
    std::future::poll_fn(move |_| match link.take_request() {
        Some(op) => std::task::Poll::Ready(op),
        None => std::task::Poll::Pending,
    })
}

fn inactive() -> DbError {
    DbError::Refused(
        "no transaction is active: the transaction is valid only during `handle`".into(),
    )
}

/// The transaction part of a consumer's Store: while a `handle` call runs,
/// the link to the host's transaction and the table entry behind the
/// guest's handle; `None` between calls.
#[derive(Default)]
pub struct TxnState {
    link: Option<TxnLink>,
    entry: Option<Resource<ActiveTransaction>>,
}

/// What a `transaction` call sees of the Store: the link, and the table
/// that holds the guest's handle.
pub struct TransactionView<'a> {
    state: &'a mut TxnState,
    table: &'a mut ResourceTable,
}

impl<'a> TransactionView<'a> {
    pub fn new(state: &'a mut TxnState, table: &'a mut ResourceTable) -> Self {
        Self { state, table }
    }

    /// Lends the guest the transaction behind `link` for one `handle`
    /// call: the handle it borrows. [`end_loan`](Self::end_loan) takes it
    /// back.
    pub(crate) fn lend(
        &mut self,
        link: TxnLink,
    ) -> Result<Resource<wit::Transaction>, PluginError> {
        self.state.link = Some(link);
        let entry = self
            .table
            .push(ActiveTransaction)
            .map_err(|e| PluginError::Trap(format!("cannot create the transaction handle: {e}")))?;
        let handle = Resource::new_borrow(entry.rep());
        self.state.entry = Some(entry);
        Ok(handle)
    }

    /// Ends the loan: later calls through a kept handle find no
    /// transaction.
    pub(crate) fn end_loan(&mut self) {
        self.state.link = None;
        if let Some(entry) = self.state.entry.take() {
            let _ = self.table.delete(entry);
        }
    }

    async fn request(&mut self, op: Op) -> Result<Reply, DbError> {
        let link = self.state.link.clone().ok_or_else(inactive)?;
        match link.request.lock() {
            Ok(mut slot) => *slot = Some(op),
            Err(_) => return Err(inactive()),
        }
        std::future::poll_fn(
            |_| match link.reply.lock().ok().and_then(|mut r| r.take()) {
                Some(reply) => std::task::Poll::Ready(reply),
                None => std::task::Poll::Pending,
            },
        )
        .await
    }
}

impl wit::Host for TransactionView<'_> {}

impl wit::HostTransaction for TransactionView<'_> {
    async fn execute(
        &mut self,
        _tx: Resource<wit::Transaction>,
        sql: String,
        params: Vec<Value>,
    ) -> wasmtime::Result<Result<u64, DbError>> {
        Ok(match self.request(Op::Execute(sql, params)).await {
            Ok(Reply::Affected(n)) => Ok(n),
            Ok(_) => Err(inactive()),
            Err(e) => Err(e),
        })
    }

    async fn query(
        &mut self,
        _tx: Resource<wit::Transaction>,
        sql: String,
        params: Vec<Value>,
    ) -> wasmtime::Result<Result<Rows, DbError>> {
        Ok(match self.request(Op::Query(sql, params)).await {
            Ok(Reply::Rows(r)) => Ok(r),
            Ok(_) => Err(inactive()),
            Err(e) => Err(e),
        })
    }

    async fn emit(
        &mut self,
        _tx: Resource<wit::Transaction>,
        event: wit::NewEvent,
    ) -> wasmtime::Result<Result<String, DbError>> {
        Ok(match self.request(Op::Emit(event)).await {
            Ok(Reply::Emitted(id)) => Ok(id),
            Ok(_) => Err(inactive()),
            Err(e) => Err(e),
        })
    }

    async fn drop(&mut self, rep: Resource<wit::Transaction>) -> wasmtime::Result<()> {
        // The guest only ever borrows the resource; the host deletes it.
        let _ = self
            .table
            .delete(Resource::<ActiveTransaction>::new_own(rep.rep()));
        Ok(())
    }
}

/// Links `outbox:plugin/transaction`; `view` finds the transaction state
/// in a Store's data. Only the consumer world's Linker calls this.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> TransactionView<'_>,
) -> Result<(), PluginError> {
    wit::add_to_linker::<T, HasTransaction>(linker, view)
        .map_err(|e| PluginError::Invalid(format!("cannot link outbox:plugin/transaction: {e}")))
}

struct HasTransaction;

impl HasData for HasTransaction {
    type Data<'a> = TransactionView<'a>;
}
