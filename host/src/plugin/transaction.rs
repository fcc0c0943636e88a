//! The host side of the `transaction` resource a consumer plugin borrows
//! during `handle`. The plugin never holds the database transaction: its
//! calls travel through a [`Mailbox`] to [`TxnServer`], which owns the borrow of
//! the host's [`InboxTx`] for the length of one call and checks, budgets
//! and runs each statement.

use wasmtime::component::Resource;

use super::bindings::consumer::outbox::plugin::transaction::{self as wit, DbError, Rows, Value};
use super::host::HostState;
use super::sql_values::{bind_pg, bind_sqlite, pg_row, sqlite_row};
use crate::store::InboxTx;
use crate::store::sqlite_plugin_guard as guard;
use outboxd_core::db_url::DbKind;
use outboxd_core::sql_gate::{self, Checked};
use outboxd_core::sql_guard::check_statement;

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
/// bounds them. Plugin SQL cannot change it: settings writes are refused by
/// the gate, and [`end_session`] resets the session before commit anyway.
pub(crate) async fn begin_session(tx: &mut InboxTx, policy: &TxnPolicy) -> Result<(), sqlx::Error> {
    if let InboxTx::Postgres(t) = tx {
        let sql = format!(
            "SET LOCAL statement_timeout = {}",
            policy.statement_timeout.as_millis()
        );
        sqlx::Executor::execute(&mut **t, sql.as_str()).await?;
    }
    Ok(())
}

/// Runs before a transaction in which plugin SQL ran commits: whatever the
/// plugin managed to leave on the session (a temporary object, a setting)
/// goes, so the pooled connection the relay or another consumer gets next
/// is the host's: temporary objects, settings, and session advisory locks
/// (the one session state a rollback would not undo either). `DISCARD
/// TEMP` and `RESET ALL` keep the driver's prepared statements (`DISCARD
/// ALL` would drop them behind sqlx's back).
pub(crate) async fn end_session(tx: &mut InboxTx) -> Result<(), sqlx::Error> {
    match tx {
        InboxTx::Postgres(t) => {
            // RESET ALL leaves the role alone: it is reset first, and the
            // rest runs as the host.
            t.plugin_role = None;
            sqlx::Executor::execute(
                &mut **t,
                sqlx::raw_sql(
                    "RESET ROLE; DISCARD TEMP; RESET ALL; SELECT pg_advisory_unlock_all()",
                ),
            )
            .await?;
        }
        InboxTx::Sqlite(t) => crate::store::sqlite_plugin_guard::reset(t).await?,
    }
    Ok(())
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

/// The Postgres wrapper around a statement that returns rows: the server
/// checks each row's size before sending it, so the host never buffers a
/// value larger than `max_result_bytes` (the driver reads a whole row at a
/// time, and one value may be 1 GB). `outboxd_row_fits` raises with a
/// clear message (migration 0009). The LIMIT bounds the rows the server
/// sends to one more than the budget left.
/// A statement that returns no rows is sent as it is.
fn pg_text(
    sql: &str,
    checked: Checked,
    max_bytes: u64,
    rows_left: u64,
) -> std::borrow::Cow<'_, str> {
    if !checked.returns_rows {
        return sql.into();
    }
    let sql = sql.trim_end().trim_end_matches(';');
    format!(
        "WITH outboxd_rows AS ({sql}\n) SELECT outboxd_rows.* FROM outboxd_rows \
         WHERE outboxd_row_fits(octet_length(outboxd_rows::text), {max_bytes}) \
         LIMIT {}",
        rows_left.saturating_add(1)
    )
    .into()
}

/// The SQLite wall for one statement: the authorizer with the consumer's
/// grants, the deadline and the value-length limit.
fn sqlite_policy(policy: &TxnPolicy) -> crate::store::sqlite_plugin_guard::PluginPolicy {
    crate::store::sqlite_plugin_guard::PluginPolicy {
        consumer: policy.consumer.clone(),
        grants: policy.tables.clone(),
        deadline: std::time::Instant::now() + policy.statement_timeout,
        max_value_bytes: policy.max_result_bytes,
    }
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

    /// The Postgres backend running the plugin's statements, once one ran.
    pub(crate) fn backend_pid(&self) -> Option<i32> {
        match &*self.tx {
            InboxTx::Postgres(t) => t.plugin_role,
            InboxTx::Sqlite(_) => None,
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
            Op::Emit(event) => {
                self.run_as_host().await?;
                self.emit(event).await.map(Reply::Emitted)
            }
        }
    }

    /// The lexical guard, then the capability gate; a statement text this
    /// policy already accepted on this database is not parsed again.
    fn admit(&self, sql: &str) -> Result<Checked, DbError> {
        let kind = match self.tx {
            InboxTx::Postgres(_) => DbKind::Postgres,
            InboxTx::Sqlite(_) => DbKind::Sqlite,
        };
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

    /// On Postgres, the plugin's statements run under its role:
    /// `set_config('role', …, true)` (`SET LOCAL ROLE`) before its first
    /// statement, in the same round trip as reading the backend's pid. It
    /// stays set on the transaction (`PgInboxTx::plugin_role`) until the
    /// host's next statement of its own (`emit`, an inbox mark, a
    /// savepoint, the commit), each of which gives the host its role back
    /// first: so the messages of a batch switch roles once, not per
    /// message.
    async fn run_as_plugin(&mut self) -> Result<(), DbError> {
        self.touched = true;
        let InboxTx::Postgres(t) = &mut *self.tx else {
            return Ok(());
        };
        if t.plugin_role.is_some() {
            return Ok(());
        }
        // Without a role (a library caller's policy; `outboxd run` refuses
        // a consumer plugin on Postgres without one) there is nothing to
        // set, and no pid is read: the wall deadline then abandons the
        // statement without cancelling it on the server.
        let Some(role) = &self.policy.db_role else {
            return Ok(());
        };
        let pid: i32 =
            sqlx::query_scalar("SELECT pg_backend_pid() FROM set_config('role', $1, true)")
                .bind(role)
                .fetch_one(&mut **t)
                .await
                .map_err(database)?;
        t.plugin_role = Some(pid);
        Ok(())
    }

    /// Gives the host its own role back (before `emit`).
    async fn run_as_host(&mut self) -> Result<(), DbError> {
        self.tx.as_host().await.map_err(database)
    }

    fn rows_left(&self) -> u64 {
        self.policy.max_rows.saturating_sub(self.rows)
    }

    async fn execute(
        &mut self,
        sql: &str,
        checked: Checked,
        params: Vec<Value>,
    ) -> Result<u64, DbError> {
        let policy = self.policy;
        let (max_bytes, rows_left) = (self.policy.max_result_bytes, self.rows_left());
        match &mut *self.tx {
            InboxTx::Postgres(t) => {
                let text = pg_text(sql, checked, max_bytes, rows_left);
                let q = bind_pg(sqlx::query(&text), params)?;
                q.execute(&mut **t)
                    .await
                    .map(|r| r.rows_affected())
                    .map_err(database)
            }
            InboxTx::Sqlite(t) => {
                let q = bind_sqlite(sqlx::query(sql).persistent(false), params)?;
                let active = guard::begin(t, sqlite_policy(policy))
                    .await
                    .map_err(database)?;
                let result = q.execute(&mut **t).await.map(|r| r.rows_affected());
                let refused = active.end(t).await.map_err(database)?;
                result.map_err(|e| sqlite_error(e, refused))
            }
        }
    }

    async fn query(
        &mut self,
        sql: &str,
        checked: Checked,
        params: Vec<Value>,
    ) -> Result<Rows, DbError> {
        use futures_util::TryStreamExt;
        use sqlx::{Column, Row};
        let left = self.rows_left();
        let max_rows = self.policy.max_rows;
        let max_bytes = self.policy.max_result_bytes;
        let bytes_left = max_bytes.saturating_sub(self.bytes);
        let over_rows = || {
            DbError::BudgetExceeded(format!(
                "more than {max_rows} rows returned for one message (consumers[].max_rows)"
            ))
        };
        let over_bytes = || {
            DbError::BudgetExceeded(format!(
                "more than {max_bytes} bytes returned for one message (consumers[].max_result_bytes)"
            ))
        };
        let mut out = Rows {
            columns: Vec::new(),
            rows: Vec::new(),
        };
        let mut bytes = 0u64;
        let policy = self.policy;
        match &mut *self.tx {
            InboxTx::Postgres(t) => {
                let text = pg_text(sql, checked, max_bytes, left);
                let q = bind_pg(sqlx::query(&text), params)?;
                let mut stream = q.fetch(&mut **t);
                while let Some(row) = stream.try_next().await.map_err(database)? {
                    if out.rows.len() as u64 >= left {
                        return Err(over_rows());
                    }
                    if out.columns.is_empty() {
                        out.columns = row.columns().iter().map(|c| c.name().into()).collect();
                    }
                    let values = pg_row(&row)?;
                    bytes += values_size(&values);
                    if bytes > bytes_left {
                        return Err(over_bytes());
                    }
                    out.rows.push(values);
                }
            }
            InboxTx::Sqlite(t) => {
                let q = bind_sqlite(sqlx::query(sql).persistent(false), params)?;
                let active = guard::begin(t, sqlite_policy(policy))
                    .await
                    .map_err(database)?;
                let result: Result<(), Result<DbError, sqlx::Error>> = async {
                    let mut stream = q.fetch(&mut **t);
                    while let Some(row) = stream.try_next().await.map_err(Err)? {
                        if out.rows.len() as u64 >= left {
                            return Err(Ok(over_rows()));
                        }
                        if out.columns.is_empty() {
                            out.columns = row.columns().iter().map(|c| c.name().into()).collect();
                        }
                        let values = sqlite_row(&row).map_err(Ok)?;
                        bytes += values_size(&values);
                        if bytes > bytes_left {
                            return Err(Ok(over_bytes()));
                        }
                        out.rows.push(values);
                    }
                    Ok(())
                }
                .await;
                let refused = active.end(t).await.map_err(database)?;
                match result {
                    Ok(()) => {}
                    Err(Ok(e)) => return Err(e),
                    Err(Err(e)) => return Err(sqlite_error(e, refused)),
                }
            }
        }
        self.rows += out.rows.len() as u64;
        self.bytes += bytes;
        Ok(out)
    }

    async fn emit(&mut self, event: wit::NewEvent) -> Result<String, DbError> {
        let payload: serde_json::Value = serde_json::from_slice(&event.payload)
            .map_err(|e| DbError::Refused(format!("emit: the payload is not valid JSON ({e})")))?;
        let mut new = crate::event::NewEvent::new(event.aggregate_id, event.event_type, payload);
        new.headers = event.headers.into_iter().collect();
        let enqueued = match &mut *self.tx {
            InboxTx::Postgres(t) => crate::store::enqueue(t.transaction(), new).await,
            InboxTx::Sqlite(t) => crate::store::enqueue(t, new).await,
        };
        match enqueued {
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

/// Roughly what a row's values weigh in the host's memory.
fn values_size(values: &[Value]) -> u64 {
    values
        .iter()
        .map(|v| match v {
            Value::Text(s) | Value::Json(s) | Value::Timestamp(s) | Value::Uuid(s) => {
                s.len() as u64
            }
            Value::Bytes(b) => b.len() as u64,
            _ => 8,
        })
        .sum::<u64>()
        + 16
}

/// A SQLite error, with the authorizer's or the deadline's reason when one
/// of them stopped the statement (SQLite itself only says `not authorized`
/// or `interrupted`).
fn sqlite_error(e: sqlx::Error, refused: Option<String>) -> DbError {
    match refused {
        Some(why) => DbError::Refused(why),
        None => database(e),
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
