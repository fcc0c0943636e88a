//! What a recording [`TxnServer`](super::server::TxnServer) keeps of each
//! statement a consumer plugin sent. Two modes, on purpose apart:
//! [`Recording::TextOnly`] for a dry run of a real message (its values may
//! be personal data, so only the kind, the text and the outcome are kept),
//! and [`Recording::WithValues`] for `outboxd plugin test` on a sample
//! message, which also keeps the parameters, the rows affected or
//! returned, and each emitted event.

use super::{Op, Reply};
use crate::plugin::bindings::consumer::outbox::plugin::transaction::{DbError, Value};

/// How much of each statement a recording keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recording {
    /// Kind, text and outcome; never a parameter value (a dry run).
    TextOnly,
    /// Also the parameters, the rows and the emitted events (plugin test).
    WithValues,
}

/// One statement a consumer plugin sent during a call: its kind, its text
/// and how it ended, and with [`Recording::WithValues`] its values.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PluginStatement {
    pub kind: StatementKind,
    /// The SQL text as the plugin sent it; for an `emit`, the event type.
    pub text: String,
    /// `ok: 1 row affected`, `refused: …`, `database error 23505`, … A
    /// database error is named by its code only: its message may quote a
    /// value.
    pub outcome: String,
    /// Only with [`Recording::WithValues`]; `None` in a dry run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub values: Option<StatementValues>,
}

/// What [`Recording::WithValues`] adds to a statement.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StatementValues {
    /// The parameters in order ($1, $2, …), as [`value_json`] shows them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<serde_json::Value>,
    /// `execute`: the rows the statement changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rows_affected: Option<u64>,
    /// `query`: the rows it returned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rows: Option<Vec<Vec<serde_json::Value>>>,
    /// `emit`: the event as written to the outbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<EmittedEvent>,
    /// A failure in full (a database error's message included).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An event a plugin emitted, as the outbox received it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EmittedEvent {
    /// The outbox id it was given; empty when the emit failed.
    pub id: String,
    pub aggregate_id: String,
    pub event_type: String,
    /// JSON when the payload parses, else the text.
    pub payload: serde_json::Value,
    pub headers: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StatementKind {
    Execute,
    Query,
    Emit,
}

/// A SQL value as a report shows it: null, booleans, numbers and text as
/// JSON's own; the others tagged with their kind, so that a uuid and the
/// same text stay apart.
pub fn value_json(v: &Value) -> serde_json::Value {
    use serde_json::json;
    match v {
        Value::Null => serde_json::Value::Null,
        Value::Boolean(b) => json!(b),
        Value::Int(n) => json!(n),
        Value::Float(f) => json!(f),
        Value::Text(s) => json!(s),
        Value::Bytes(b) => {
            json!({ "bytes_hex": b.iter().map(|x| format!("{x:02x}")).collect::<String>() })
        }
        Value::Json(s) => json!({
            "json": serde_json::from_str::<serde_json::Value>(s).unwrap_or_else(|_| json!(s))
        }),
        Value::Timestamp(s) => json!({ "timestamp": s }),
        Value::Uuid(s) => json!({ "uuid": s }),
    }
}

impl Op {
    /// The statement this request is, its outcome still unknown.
    pub(crate) fn statement(&self, mode: Recording) -> PluginStatement {
        let (kind, text) = match self {
            Op::Execute(sql, _) => (StatementKind::Execute, sql.clone()),
            Op::Query(sql, _) => (StatementKind::Query, sql.clone()),
            Op::Emit(event) => (StatementKind::Emit, event.event_type.clone()),
        };
        let values = (mode == Recording::WithValues).then(|| match self {
            Op::Execute(_, params) | Op::Query(_, params) => StatementValues {
                params: params.iter().map(value_json).collect(),
                ..StatementValues::default()
            },
            Op::Emit(e) => StatementValues {
                event: Some(EmittedEvent {
                    id: String::new(),
                    aggregate_id: e.aggregate_id.clone(),
                    event_type: e.event_type.clone(),
                    payload: serde_json::from_slice(&e.payload).unwrap_or_else(|_| {
                        String::from_utf8_lossy(&e.payload).into_owned().into()
                    }),
                    headers: e.headers.iter().cloned().collect(),
                }),
                ..StatementValues::default()
            },
        });
        PluginStatement {
            kind,
            text,
            outcome: String::new(),
            values,
        }
    }
}

impl PluginStatement {
    /// Completes the record with how the statement ended.
    pub(crate) fn finish(
        &mut self,
        result: &Result<Reply, DbError>,
        described: impl Fn() -> String,
    ) {
        self.outcome = match result {
            Ok(reply) => reply.outcome(),
            Err(DbError::Database((Some(code), _))) => format!("database error {code}"),
            Err(DbError::Database((None, _))) => "database error".into(),
            Err(_) => described(),
        };
        let Some(values) = self.values.as_mut() else {
            return;
        };
        match result {
            Ok(Reply::Affected(n)) => values.rows_affected = Some(*n),
            Ok(Reply::Rows(r)) => {
                values.rows = Some(
                    r.rows
                        .iter()
                        .map(|row| row.iter().map(value_json).collect())
                        .collect(),
                )
            }
            Ok(Reply::Emitted(id)) => {
                if let Some(e) = values.event.as_mut() {
                    e.id = id.clone();
                }
            }
            Err(_) => values.error = Some(described()),
        }
    }
}

impl Reply {
    /// How a statement that succeeded ended, for [`PluginStatement`].
    pub(crate) fn outcome(&self) -> String {
        match self {
            Reply::Affected(1) => "ok: 1 row affected".into(),
            Reply::Affected(n) => format!("ok: {n} rows affected"),
            Reply::Rows(r) if r.rows.len() == 1 => "ok: 1 row".into(),
            Reply::Rows(r) => format!("ok: {} rows", r.rows.len()),
            Reply::Emitted(_) => "ok: event written to the outbox".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Op, Recording, Reply};
    use crate::plugin::bindings::consumer::outbox::plugin::transaction::{DbError, Value};

    fn insert() -> Op {
        Op::Execute(
            "INSERT INTO notes (body) VALUES ($1)".into(),
            vec![Value::Text("a secret".into())],
        )
    }

    #[test]
    fn a_dry_run_record_never_holds_a_value() {
        let mut s = insert().statement(Recording::TextOnly);
        s.finish(&Ok(Reply::Affected(1)), String::new);
        let shown = serde_json::to_string(&s).expect("json");
        assert!(
            !shown.contains("a secret") && !shown.contains("values"),
            "{shown}"
        );
        let mut failed = insert().statement(Recording::TextOnly);
        let error = Err(DbError::Database((
            Some("23505".into()),
            "key (body)=(a secret)".into(),
        )));
        failed.finish(&error, || {
            "database error 23505: key (body)=(a secret)".into()
        });
        let shown = serde_json::to_string(&failed).expect("json");
        assert!(!shown.contains("a secret"), "{shown}");
        assert_eq!(failed.outcome, "database error 23505");
    }

    #[test]
    fn a_test_record_holds_the_params_the_rows_and_the_error() {
        let mut s = insert().statement(Recording::WithValues);
        s.finish(&Ok(Reply::Affected(3)), String::new);
        let v = s.values.as_ref().expect("values");
        assert_eq!(v.params, vec![serde_json::json!("a secret")]);
        assert_eq!(v.rows_affected, Some(3));
        let mut failed = insert().statement(Recording::WithValues);
        failed.finish(&Err(DbError::Refused("no".into())), || {
            "statement refused: no".into()
        });
        assert_eq!(failed.outcome, "statement refused: no");
        assert_eq!(
            failed.values.expect("values").error.as_deref(),
            Some("statement refused: no")
        );
    }
}
