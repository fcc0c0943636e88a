//! The `outbox:plugin/transaction` import, which only the consumer world
//! has: the resource a consumer plugin borrows during `handle`. Shaped
//! after wasmtime's `wasi-config`: the state ([`TxnState`]), a borrowed
//! view ([`TransactionView`]) implementing the generated `Host` traits, and
//! an [`add_to_linker`].
//!
//! The plugin never holds the database transaction: its calls travel
//! through a [`Mailbox`] to [`TxnServer`], which owns the borrow of the
//! host's [`InboxTx`] for the length of one call and checks, budgets and
//! runs each statement.

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};

use crate::plugin::bindings::consumer::outbox::plugin::transaction::{
    self as wit, DbError, Rows, Value,
};
use crate::plugin::error::PluginError;
use crate::plugin::sql_values::{to_core, to_guest};
use crate::store::InboxTx;
use crate::store::plugin_sql::{Budget, PluginSqlError};
use outboxd_core::db_url::DbKind;
use outboxd_core::sql_gate::{self, Checked};
use outboxd_core::sql_guard::check_statement;

/// The resource table's entry behind the handle the guest borrows. It
/// carries nothing: the live link to the transaction is [`TxnState`], set
/// only during a call.
#[derive(Debug)]
pub struct ActiveTransaction;

/// Set from `[[consumers]]`, so it is config data, in `outboxd-core`.
pub use outboxd_core::config::TxnPolicy;

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

/// The one statement in flight between the guest and [`TxnServer`], and
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

    fn put_reply(&self, reply: Result<Reply, DbError>) {
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

/// Runs one message's plugin statements against the host's transaction.
///
/// Each statement passes three layers before it runs: the lexical guard
/// (one statement, text both databases read alike), the capability gate
/// (a parse checked against `consumers[].tables` and the function
/// allowlist), then the database's own wall: on Postgres the consumer's
/// role (`SET LOCAL ROLE`, grants only on its tables, no TEMP), on SQLite
/// the authorizer (store/sqlite_plugin_guard.rs). `emit` runs as the host.
pub(crate) struct TxnServer<'a> {
    tx: &'a mut InboxTx,
    policy: &'a TxnPolicy,
    statements: u32,
    rows: u64,
    bytes: u64,
    /// Any plugin statement reached the database.
    pub(crate) touched: bool,
    /// The first error the guest was given. A message whose plugin saw an
    /// error fails even if the plugin returns `ok`: on Postgres the
    /// transaction is aborted, and a refused statement is a broken plugin.
    pub(crate) failure: Option<String>,
}

impl<'a> TxnServer<'a> {
    pub(crate) fn new(tx: &'a mut InboxTx, policy: &'a TxnPolicy) -> Self {
        Self {
            tx,
            policy,
            statements: 0,
            rows: 0,
            bytes: 0,
            touched: false,
            failure: None,
        }
    }

    /// Runs one request and leaves its answer in `link`.
    pub(crate) async fn serve(&mut self, link: &TxnLink, op: Op) {
        let result = self.run(op).await;
        if let Err(e) = &result
            && self.failure.is_none()
        {
            self.failure = Some(describe(e));
        }
        link.put_reply(result);
    }

    async fn run(&mut self, op: Op) -> Result<Reply, DbError> {
        self.statements += 1;
        if self.statements > self.policy.max_statements {
            return Err(DbError::BudgetExceeded(format!(
                "more than {} statements for one message (consumers[].max_statements)",
                self.policy.max_statements
            )));
        }
        match op {
            Op::Execute(sql, params) => {
                let checked = self.admit(&sql)?;
                self.run_as_plugin().await?;
                self.execute(&sql, checked, params)
                    .await
                    .map(Reply::Affected)
            }
            Op::Query(sql, params) => {
                let checked = self.admit(&sql)?;
                self.run_as_plugin().await?;
                self.query(&sql, checked, params).await.map(Reply::Rows)
            }
            Op::Emit(event) => self.emit(event).await.map(Reply::Emitted),
        }
    }

    /// The lexical guard, then the capability gate; a statement text this
    /// policy already accepted on this database is not parsed again.
    fn admit(&self, sql: &str) -> Result<Checked, DbError> {
        let kind = self.tx.kind();
        let key = admitted_key(kind, self.policy, sql);
        if let Some(checked) = ADMITTED.lock().ok().and_then(|m| m.get(&key).copied()) {
            return Ok(checked);
        }
        check_statement(sql).map_err(|e| DbError::Refused(e.to_string()))?;
        let checked = sql_gate::check(sql, kind, &self.policy.tables, &self.policy.consumer)
            .map_err(|e| DbError::Refused(e.to_string()))?;
        if let Ok(mut m) = ADMITTED.lock() {
            if m.len() >= ADMITTED_MAX {
                m.clear();
            }
            m.insert(key, checked);
        }
        Ok(checked)
    }

    /// On Postgres, the plugin's statements run under its role, set once
    /// and kept on the transaction until the host's next statement of its
    /// own (`InboxTx::run_as_plugin`).
    async fn run_as_plugin(&mut self) -> Result<(), DbError> {
        self.touched = true;
        self.tx
            .run_as_plugin(self.policy.db_role.as_deref())
            .await
            .map_err(database)
    }

    /// What the next statement may return of the message's budgets.
    fn budget(&self) -> Budget {
        Budget {
            rows_left: self.policy.max_rows.saturating_sub(self.rows),
            bytes_left: self.policy.max_result_bytes.saturating_sub(self.bytes),
        }
    }

    async fn execute(
        &mut self,
        sql: &str,
        checked: Checked,
        params: Vec<Value>,
    ) -> Result<u64, DbError> {
        let budget = self.budget();
        let params = params.into_iter().map(to_core).collect();
        self.tx
            .plugin_execute(sql, checked, params, self.policy, budget)
            .await
            .map_err(|e| self.refusal(e))
    }

    async fn query(
        &mut self,
        sql: &str,
        checked: Checked,
        params: Vec<Value>,
    ) -> Result<Rows, DbError> {
        let budget = self.budget();
        let params = params.into_iter().map(to_core).collect();
        let out = self
            .tx
            .plugin_query(sql, checked, params, self.policy, budget)
            .await
            .map_err(|e| self.refusal(e))?;
        self.rows += out.rows.len() as u64;
        self.bytes += out.bytes;
        Ok(Rows {
            columns: out.columns,
            rows: out
                .rows
                .into_iter()
                .map(|r| r.into_iter().map(to_guest).collect())
                .collect(),
        })
    }

    /// What the guest is told when a statement did not run to its end.
    fn refusal(&self, e: PluginSqlError) -> DbError {
        match e {
            PluginSqlError::Database(e) => database(e),
            PluginSqlError::Refused(why) => DbError::Refused(why),
            PluginSqlError::Value(e) => e.into(),
            PluginSqlError::OverRows => DbError::BudgetExceeded(format!(
                "more than {} rows returned for one message (consumers[].max_rows)",
                self.policy.max_rows
            )),
            PluginSqlError::OverBytes => DbError::BudgetExceeded(format!(
                "more than {} bytes returned for one message (consumers[].max_result_bytes)",
                self.policy.max_result_bytes
            )),
        }
    }

    /// Writes the plugin's event to the outbox, as the host.
    async fn emit(&mut self, event: wit::NewEvent) -> Result<String, DbError> {
        let payload: serde_json::Value = serde_json::from_slice(&event.payload)
            .map_err(|e| DbError::Refused(format!("emit: the payload is not valid JSON ({e})")))?;
        let mut new = crate::event::NewEvent::new(event.aggregate_id, event.event_type, payload);
        new.headers = event.headers.into_iter().collect();
        match self.tx.enqueue(new).await {
            Ok(e) => Ok(e.id().to_string()),
            Err(crate::store::EnqueueError::Database(e)) => Err(database(e)),
            Err(e) => Err(DbError::Refused(format!("emit: {e}"))),
        }
    }
}

/// Statements the guard and the gate accepted, by (database, policy, text):
/// plugins send the same few texts with different parameters, and parsing
/// one costs tens of microseconds. Only acceptances are kept (a refusal is
/// checked again each time), the policy's consumer and grants are part of
/// the key exactly, and the map is emptied when full, so a plugin sending
/// endless distinct texts only makes itself slower.
type AdmittedKey = (DbKind, String, String);
static ADMITTED: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<AdmittedKey, Checked>>,
> = std::sync::LazyLock::new(Default::default);
const ADMITTED_MAX: usize = 4096;

fn admitted_key(kind: DbKind, policy: &TxnPolicy, sql: &str) -> AdmittedKey {
    let t = &policy.tables;
    (
        kind,
        format!("{}\0{:?}\0{:?}", policy.consumer, t.read, t.write),
        sql.to_string(),
    )
}

fn database(e: sqlx::Error) -> DbError {
    match &e {
        sqlx::Error::Database(d) => {
            DbError::Database((d.code().map(|c| c.into_owned()), d.message().to_string()))
        }
        _ => DbError::Database((None, e.to_string())),
    }
}

fn describe(e: &DbError) -> String {
    match e {
        DbError::Refused(m) => format!("statement refused: {m}"),
        DbError::BudgetExceeded(m) => format!("budget exceeded: {m}"),
        DbError::Database((Some(code), m)) => format!("database error {code}: {m}"),
        DbError::Database((None, m)) => format!("database error: {m}"),
    }
}
