//! Typed SQL values across the plugin boundary: the WIT `value`s a guest
//! sends and receives, converted to and from [`SqlValue`], whose binding
//! and reading (`outboxd_core::sql_values`) the fuzz targets check without
//! the plugin host. The functions keep the WIT types in their signatures.

use outboxd_core::sql_values::{self as core, SqlValue, SqlValueError};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Postgres, Sqlite};

use crate::plugin::bindings::consumer::outbox::plugin::transaction::{DbError, Value};

type PgQuery<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;
type SqliteQuery<'q> = sqlx::query::Query<'q, Sqlite, SqliteArguments<'q>>;

/// Binds guest values as Postgres parameters, in order; a JSON, timestamp or
/// uuid value that does not parse is refused with its parameter number.
pub fn bind_pg<'q>(q: PgQuery<'q>, params: Vec<Value>) -> Result<PgQuery<'q>, DbError> {
    Ok(core::bind_pg(q, params.into_iter().map(to_core).collect())?)
}

/// SQLite has no JSON, timestamp or uuid storage classes: they are bound as
/// text (a uuid in its lower-case hyphenated form, as the inbox stores it).
pub fn bind_sqlite<'q>(q: SqliteQuery<'q>, params: Vec<Value>) -> Result<SqliteQuery<'q>, DbError> {
    Ok(core::bind_sqlite(
        q,
        params.into_iter().map(to_core).collect(),
    )?)
}

/// A Postgres result row as guest values; a column type plugins do not
/// carry is refused with a hint to cast it.
pub fn pg_row(row: &PgRow) -> Result<Vec<Value>, DbError> {
    Ok(core::pg_row(row)?.into_iter().map(to_guest).collect())
}

/// SQLite cells are typed by their storage class.
pub fn sqlite_row(row: &SqliteRow) -> Result<Vec<Value>, DbError> {
    Ok(core::sqlite_row(row)?.into_iter().map(to_guest).collect())
}

impl From<SqlValueError> for DbError {
    fn from(e: SqlValueError) -> Self {
        match e {
            SqlValueError::Refused(m) => DbError::Refused(m),
            SqlValueError::Cell(m) => DbError::Database((None, m)),
        }
    }
}

pub(crate) fn to_core(v: Value) -> SqlValue {
    match v {
        Value::Null => SqlValue::Null,
        Value::Boolean(b) => SqlValue::Boolean(b),
        Value::Int(n) => SqlValue::Int(n),
        Value::Float(f) => SqlValue::Float(f),
        Value::Text(s) => SqlValue::Text(s),
        Value::Bytes(b) => SqlValue::Bytes(b),
        Value::Json(s) => SqlValue::Json(s),
        Value::Timestamp(s) => SqlValue::Timestamp(s),
        Value::Uuid(s) => SqlValue::Uuid(s),
    }
}

pub(crate) fn to_guest(v: SqlValue) -> Value {
    match v {
        SqlValue::Null => Value::Null,
        SqlValue::Boolean(b) => Value::Boolean(b),
        SqlValue::Int(n) => Value::Int(n),
        SqlValue::Float(f) => Value::Float(f),
        SqlValue::Text(s) => Value::Text(s),
        SqlValue::Bytes(b) => Value::Bytes(b),
        SqlValue::Json(s) => Value::Json(s),
        SqlValue::Timestamp(s) => Value::Timestamp(s),
        SqlValue::Uuid(s) => Value::Uuid(s),
    }
}
