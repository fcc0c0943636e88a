//! The host's side of a lent transaction: runs one message's plugin
//! statements against the host's [`InboxTx`], each through the lexical
//! guard, the capability gate and the statement and result budgets, and
//! answers the guest through the [`Mailbox`](super::Mailbox).

use super::{Op, PluginStatement, Recording, Reply, TxnLink};
use crate::plugin::bindings::consumer::outbox::plugin::transaction::{
    self as wit, DbError, Rows, Value,
};
use crate::plugin::sql_values::{to_core, to_guest};
use crate::store::InboxTx;
use crate::store::plugin_sql::{Budget, PluginSqlError};
use outboxd_core::config::TxnPolicy;
use outboxd_core::db_url::DbKind;
use outboxd_core::sql_gate::{self, Admitted};

/// Runs one message's plugin statements against the host's transaction.
///
/// Each statement is admitted by [`sql_gate::admit`] before it runs (the
/// lexical rules: one statement, text both databases read alike; then the
/// capability gate: a parse checked against `consumers[].tables` and the
/// function allowlist), then meets the database's own wall: on Postgres the consumer's
/// role (`SET LOCAL ROLE`, grants only on its tables, no TEMP), on SQLite
/// the authorizer (store/backend/sqlite_plugin_guard.rs). `emit` runs as the host.
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
    /// Every statement served, when recording, and how much of each.
    pub(crate) recorded: Option<(Recording, Vec<PluginStatement>)>,
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
            recorded: None,
        }
    }

    /// Also records each statement: its kind, text and outcome, and with
    /// [`Recording::WithValues`] its parameters, rows and emitted event.
    pub(crate) fn recording(mut self, mode: Recording) -> Self {
        self.recorded = Some((mode, Vec::new()));
        self
    }

    /// Runs one request and leaves its answer in `link`.
    pub(crate) async fn serve(&mut self, link: &TxnLink, op: Op) {
        let span = statement_span(&op, self.tx.kind());
        let seen = self.recorded.as_ref().map(|(mode, _)| op.statement(*mode));
        let result = self.run(op, &span).await;
        if let Err(e) = &result {
            span.fail(|| describe(e));
        }
        drop(span);
        if let (Some((_, log)), Some(mut statement)) = (self.recorded.as_mut(), seen) {
            statement.finish(&result, || match &result {
                Err(e) => describe(e),
                Ok(_) => String::new(),
            });
            log.push(statement);
        }
        if let Err(e) = &result
            && self.failure.is_none()
        {
            self.failure = Some(describe(e));
        }
        link.put_reply(result);
    }

    async fn run(&mut self, op: Op, span: &crate::telemetry::Span) -> Result<Reply, DbError> {
        self.statements += 1;
        if self.statements > self.policy.max_statements {
            return Err(DbError::BudgetExceeded(format!(
                "more than {} statements for one message (consumers[].max_statements)",
                self.policy.max_statements
            )));
        }
        match op {
            Op::Execute(sql, params) => {
                let admitted = self.admit(&sql)?;
                describe_statement(span, &admitted);
                self.run_as_plugin().await?;
                self.execute(&sql, &admitted, params)
                    .await
                    .map(Reply::Affected)
            }
            Op::Query(sql, params) => {
                let admitted = self.admit(&sql)?;
                describe_statement(span, &admitted);
                self.run_as_plugin().await?;
                self.query(&sql, &admitted, params).await.map(Reply::Rows)
            }
            Op::Emit(event) => self.emit(event).await.map(Reply::Emitted),
        }
    }

    /// [`sql_gate::admit`]; a statement text this policy already admitted
    /// on this database is not admitted again.
    fn admit(&self, sql: &str) -> Result<std::sync::Arc<Admitted>, DbError> {
        let kind = self.tx.kind();
        let key = admitted_key(kind, self.policy, sql);
        if let Some(admitted) = ADMITTED.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(admitted);
        }
        let admitted = sql_gate::admit(sql, kind, &self.policy.tables, &self.policy.consumer)
            .map(std::sync::Arc::new)
            .map_err(|e| DbError::Refused(e.to_string()))?;
        if let Ok(mut m) = ADMITTED.lock() {
            if m.len() >= ADMITTED_MAX {
                m.clear();
            }
            m.insert(key, admitted.clone());
        }
        Ok(admitted)
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
        admitted: &Admitted,
        params: Vec<Value>,
    ) -> Result<u64, DbError> {
        let budget = self.budget();
        let params = params.into_iter().map(to_core).collect();
        self.tx
            .plugin_execute(sql, admitted, params, self.policy, budget)
            .await
            .map_err(|e| self.refusal(e))
    }

    async fn query(
        &mut self,
        sql: &str,
        admitted: &Admitted,
        params: Vec<Value>,
    ) -> Result<Rows, DbError> {
        let budget = self.budget();
        let params = params.into_iter().map(to_core).collect();
        let out = self
            .tx
            .plugin_query(sql, admitted, params, self.policy, budget)
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

/// Statements [`sql_gate::admit`] accepted, by (database, policy, text):
/// plugins send the same few texts with different parameters, and parsing
/// one costs tens of microseconds. Only acceptances are kept (a refusal is
/// checked again each time), the policy's consumer and grants are part of
/// the key exactly, and the map is emptied when full, so a plugin sending
/// endless distinct texts only makes itself slower.
type AdmittedKey = (DbKind, String, String);
static ADMITTED: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<AdmittedKey, std::sync::Arc<Admitted>>>,
> = std::sync::LazyLock::new(Default::default);
const ADMITTED_MAX: usize = 4096;

/// A `plugin.statement` span under the plugin's `handle` span; the
/// statement's kind and first table are added once it is admitted
/// ([`describe_statement`]), never its text's values or its parameters.
/// Nothing while telemetry is off, or for `emit`.
fn statement_span(op: &Op, db: DbKind) -> crate::telemetry::Span {
    if let Op::Emit(_) = op {
        return crate::telemetry::Span::default();
    }
    let span = crate::telemetry::Span::in_current(
        "plugin.statement",
        opentelemetry::trace::SpanKind::Client,
    );
    span.attr("db.system.name", || db.system_name());
    span
}

/// The admitted statement's kind and first table, on its span.
fn describe_statement(span: &crate::telemetry::Span, admitted: &Admitted) {
    if span.is_recording() {
        span.attr("db.operation.name", || admitted.kind);
        if let Some(table) = &admitted.table {
            span.attr("db.collection.name", || table.clone());
        }
    }
}

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
