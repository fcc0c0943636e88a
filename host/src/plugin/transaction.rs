//! The host side of the `transaction` resource a consumer plugin borrows
//! during `handle`. The plugin never holds the database transaction: its
//! calls travel through a [`Mailbox`] to [`TxnServer`], which owns the borrow of
//! the host's [`InboxTx`] for the length of one call and checks, budgets
//! and runs each statement.

use wasmtime::component::Resource;

use super::bindings::consumer::outbox::plugin::transaction::{self as wit, DbError, Rows, Value};
use super::host::HostState;
use super::sql_values::{bind_pg, bind_sqlite, pg_row, sqlite_row};
use crate::consumer::InboxTx;
use crate::consumer::sql_guard::check_statement;

/// The resource the guest borrows. It carries nothing: the live link to
/// the transaction is [`HostState::txn`], set only during a call.
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

impl HostState {
    async fn request(&mut self, op: Op) -> Result<Reply, DbError> {
        let link = self.txn.clone().ok_or_else(inactive)?;
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

impl wit::Host for HostState {}

impl wit::HostTransaction for HostState {
    async fn execute(
        &mut self,
        _tx: Resource<ActiveTransaction>,
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
        _tx: Resource<ActiveTransaction>,
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
        _tx: Resource<ActiveTransaction>,
        event: wit::NewEvent,
    ) -> wasmtime::Result<Result<String, DbError>> {
        Ok(match self.request(Op::Emit(event)).await {
            Ok(Reply::Emitted(id)) => Ok(id),
            Ok(_) => Err(inactive()),
            Err(e) => Err(e),
        })
    }

    async fn drop(&mut self, rep: Resource<ActiveTransaction>) -> wasmtime::Result<()> {
        // The guest only ever borrows the resource; the host deletes it.
        let _ = self.table.delete(rep);
        Ok(())
    }
}

/// Sets the consumer's `statement_timeout` for the rest of the transaction
/// (Postgres only), once per transaction rather than once per message: it is
/// set before any message's savepoint, so rolling a message back keeps it.
/// The host's own inbox and outbox statements run under it too, which only
/// bounds them.
pub(crate) async fn begin_session(tx: &mut InboxTx, policy: &TxnPolicy) -> Result<(), sqlx::Error> {
    if let InboxTx::Postgres(t) = tx {
        let sql = format!(
            "SET LOCAL statement_timeout = {}",
            policy.statement_timeout_ms
        );
        sqlx::Executor::execute(&mut **t, sql.as_str()).await?;
    }
    Ok(())
}

/// Runs one message's plugin statements against the host's transaction.
pub(crate) struct TxnServer<'a> {
    tx: &'a mut InboxTx,
    policy: &'a TxnPolicy,
    statements: u32,
    rows: u64,
    session_set: bool,
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
            session_set: false,
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
                check_statement(&sql).map_err(|e| DbError::Refused(e.to_string()))?;
                self.prepare_session().await?;
                self.execute(&sql, params).await.map(Reply::Affected)
            }
            Op::Query(sql, params) => {
                check_statement(&sql).map_err(|e| DbError::Refused(e.to_string()))?;
                self.prepare_session().await?;
                self.query(&sql, params).await.map(Reply::Rows)
            }
            Op::Emit(event) => self.emit(event).await.map(Reply::Emitted),
        }
    }

    /// On Postgres, the plugin's statements run under its role:
    /// `SET LOCAL ROLE` before its first statement of each message (undone
    /// by [`TxnServer::finish`] or by the message's savepoint rollback). The
    /// statement timeout is already set for the transaction by
    /// [`begin_session`].
    async fn prepare_session(&mut self) -> Result<(), DbError> {
        let InboxTx::Postgres(t) = &mut *self.tx else {
            return Ok(());
        };
        if self.session_set {
            return Ok(());
        }
        if let Some(role) = &self.policy.db_role {
            // The role name is checked at startup to be a plain identifier.
            let sql = format!("SET LOCAL ROLE \"{role}\"");
            sqlx::Executor::execute(&mut **t, sql.as_str())
                .await
                .map_err(database)?;
        }
        self.session_set = true;
        Ok(())
    }

    /// Gives the host its own role back before it writes the next inbox
    /// mark of a batch. Only called when the plugin succeeded.
    pub(crate) async fn finish(self) -> Result<(), String> {
        if let (InboxTx::Postgres(t), true, Some(_)) =
            (&mut *self.tx, self.session_set, &self.policy.db_role)
        {
            sqlx::Executor::execute(&mut **t, "RESET ROLE")
                .await
                .map_err(|e| format!("cannot reset the plugin's role: {e}"))?;
        }
        Ok(())
    }

    async fn execute(&mut self, sql: &str, params: Vec<Value>) -> Result<u64, DbError> {
        match &mut *self.tx {
            InboxTx::Postgres(t) => {
                let q = bind_pg(sqlx::query(sql), params)?;
                q.execute(&mut **t)
                    .await
                    .map(|r| r.rows_affected())
                    .map_err(database)
            }
            InboxTx::Sqlite(t) => {
                let q = bind_sqlite(sqlx::query(sql), params)?;
                q.execute(&mut **t)
                    .await
                    .map(|r| r.rows_affected())
                    .map_err(database)
            }
        }
    }

    async fn query(&mut self, sql: &str, params: Vec<Value>) -> Result<Rows, DbError> {
        use futures_util::TryStreamExt;
        use sqlx::{Column, Row};
        let left = self.policy.max_rows.saturating_sub(self.rows);
        let over = || {
            DbError::BudgetExceeded(format!(
                "more than {} rows returned for one message (consumers[].max_rows)",
                self.policy.max_rows
            ))
        };
        let mut out = Rows {
            columns: Vec::new(),
            rows: Vec::new(),
        };
        match &mut *self.tx {
            InboxTx::Postgres(t) => {
                let q = bind_pg(sqlx::query(sql), params)?;
                let mut stream = q.fetch(&mut **t);
                while let Some(row) = stream.try_next().await.map_err(database)? {
                    if out.rows.len() as u64 >= left {
                        return Err(over());
                    }
                    if out.columns.is_empty() {
                        out.columns = row.columns().iter().map(|c| c.name().into()).collect();
                    }
                    out.rows.push(pg_row(&row)?);
                }
            }
            InboxTx::Sqlite(t) => {
                let q = bind_sqlite(sqlx::query(sql), params)?;
                let mut stream = q.fetch(&mut **t);
                while let Some(row) = stream.try_next().await.map_err(database)? {
                    if out.rows.len() as u64 >= left {
                        return Err(over());
                    }
                    if out.columns.is_empty() {
                        out.columns = row.columns().iter().map(|c| c.name().into()).collect();
                    }
                    out.rows.push(sqlite_row(&row)?);
                }
            }
        }
        self.rows += out.rows.len() as u64;
        Ok(out)
    }

    async fn emit(&mut self, event: wit::NewEvent) -> Result<String, DbError> {
        let payload: serde_json::Value = serde_json::from_slice(&event.payload)
            .map_err(|e| DbError::Refused(format!("emit: the payload is not valid JSON ({e})")))?;
        let mut new = crate::event::NewEvent::new(event.aggregate_id, event.event_type, payload);
        new.headers = event.headers.into_iter().collect();
        let enqueued = match &mut *self.tx {
            InboxTx::Postgres(t) => crate::store::enqueue(t, new).await,
            InboxTx::Sqlite(t) => crate::store::enqueue(t, new).await,
        };
        match enqueued {
            Ok(e) => Ok(e.id().to_string()),
            Err(crate::store::EnqueueError::Database(e)) => Err(database(e)),
            Err(e) => Err(DbError::Refused(format!("emit: {e}"))),
        }
    }
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
