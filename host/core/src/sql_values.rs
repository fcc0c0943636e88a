//! Typed SQL values across the plugin boundary: a guest's values bound as
//! parameters, and result cells read back into values, for Postgres and
//! SQLite. [`SqlValue`] mirrors the WIT `value` variant; the host converts
//! between the two at the boundary.

use sqlx::postgres::{PgArgumentBuffer, PgArguments, PgRow, PgTypeInfo};
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Postgres, Row, Sqlite, TypeInfo, ValueRef};

/// One SQL value as a plugin sends or receives it: the plain mirror of the
/// WIT `value` variant, with the same cases.
#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue {
    Null,
    Boolean(bool),
    Int(i64),
    Float(f64),
    Text(String),
    Bytes(Vec<u8>),
    /// JSON text.
    Json(String),
    /// RFC 3339, UTC.
    Timestamp(String),
    /// Hyphenated text form.
    Uuid(String),
}

/// Why a value or a cell could not cross; the host hands it to the guest
/// as a `db-error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SqlValueError {
    /// A parameter that is not what its case says, or a column type plugin
    /// rows do not carry: the guest's `db-error.refused`.
    #[error("{0}")]
    Refused(String),
    /// A cell the driver could not read: the guest's `db-error.database`,
    /// without a SQLSTATE.
    #[error("{0}")]
    Cell(String),
}

type PgQuery<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;
type SqliteQuery<'q> = sqlx::query::Query<'q, Sqlite, SqliteArguments<'q>>;

/// A Postgres NULL of unspecified type, so the server infers the type from
/// the context (`INSERT INTO t (n) VALUES ($1)` works for any column type).
struct UntypedNull;

impl sqlx::Type<Postgres> for UntypedNull {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(sqlx::postgres::types::Oid(0))
    }
}

impl sqlx::Encode<'_, Postgres> for UntypedNull {
    fn encode_by_ref(
        &self,
        _buf: &mut PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        Ok(sqlx::encode::IsNull::Yes)
    }
}

/// JSON text bound as a Postgres `jsonb` parameter as it is: parsing it
/// into `serde_json::Value` would round big numbers to f64 (and refuse
/// ones out of f64's range) before Postgres ever saw them.
struct JsonText(String);

impl sqlx::Type<Postgres> for JsonText {
    fn type_info() -> PgTypeInfo {
        <sqlx::types::Json<()> as sqlx::Type<Postgres>>::type_info()
    }
}

impl sqlx::Encode<'_, Postgres> for JsonText {
    fn encode_by_ref(
        &self,
        buf: &mut PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        // jsonb's binary format: a version byte, then the text.
        buf.push(1);
        buf.extend_from_slice(self.0.as_bytes());
        Ok(sqlx::encode::IsNull::No)
    }
}

/// Checks that `text` is one JSON document, without converting numbers.
fn json(i: usize, text: &str) -> Result<(), SqlValueError> {
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .map(|_| ())
        .map_err(|e| bad_param(i, "invalid JSON", e))
}

fn bad_param(i: usize, what: &str, e: impl std::fmt::Display) -> SqlValueError {
    SqlValueError::Refused(format!("parameter ${}: {what} ({e})", i + 1))
}

fn timestamp(i: usize, text: &str) -> Result<chrono::DateTime<chrono::Utc>, SqlValueError> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|e| bad_param(i, "timestamp is not RFC 3339", e))
}

fn uuid(i: usize, text: &str) -> Result<uuid::Uuid, SqlValueError> {
    uuid::Uuid::parse_str(text).map_err(|e| bad_param(i, "not a uuid", e))
}

/// Binds guest values as Postgres parameters, in order; a JSON, timestamp or
/// uuid value that does not parse is refused with its parameter number.
pub fn bind_pg<'q>(
    mut q: PgQuery<'q>,
    params: Vec<SqlValue>,
) -> Result<PgQuery<'q>, SqlValueError> {
    for (i, p) in params.into_iter().enumerate() {
        q = match p {
            SqlValue::Null => q.bind(UntypedNull),
            SqlValue::Boolean(b) => q.bind(b),
            SqlValue::Int(n) => q.bind(n),
            SqlValue::Float(f) => q.bind(f),
            SqlValue::Text(s) => q.bind(s),
            SqlValue::Bytes(b) => q.bind(b),
            SqlValue::Json(s) => {
                json(i, &s)?;
                q.bind(JsonText(s))
            }
            SqlValue::Timestamp(s) => q.bind(timestamp(i, &s)?),
            SqlValue::Uuid(s) => q.bind(uuid(i, &s)?),
        };
    }
    Ok(q)
}

/// SQLite has no JSON, timestamp or uuid storage classes: they are bound as
/// text (a uuid in its lower-case hyphenated form, as the inbox stores it).
pub fn bind_sqlite<'q>(
    mut q: SqliteQuery<'q>,
    params: Vec<SqlValue>,
) -> Result<SqliteQuery<'q>, SqlValueError> {
    for (i, p) in params.into_iter().enumerate() {
        q = match p {
            SqlValue::Null => q.bind(None::<String>),
            SqlValue::Boolean(b) => q.bind(b),
            SqlValue::Int(n) => q.bind(n),
            SqlValue::Float(f) => q.bind(f),
            SqlValue::Text(s) => q.bind(s),
            SqlValue::Bytes(b) => q.bind(b),
            SqlValue::Json(s) => {
                json(i, &s)?;
                q.bind(s)
            }
            SqlValue::Timestamp(s) => q.bind(timestamp(i, &s)?.to_rfc3339()),
            SqlValue::Uuid(s) => q.bind(uuid(i, &s)?.to_string()),
        };
    }
    Ok(q)
}

fn cell_error(i: usize, e: impl std::fmt::Display) -> SqlValueError {
    SqlValueError::Cell(format!("column {i}: {e}"))
}

/// A Postgres result row as guest values; a column type plugins do not
/// carry is refused with a hint to cast it.
pub fn pg_row(row: &PgRow) -> Result<Vec<SqlValue>, SqlValueError> {
    use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
    let mut out = Vec::with_capacity(row.len());
    for i in 0..row.len() {
        let raw = row.try_get_raw(i).map_err(|e| cell_error(i, e))?;
        if raw.is_null() {
            out.push(SqlValue::Null);
            continue;
        }
        let type_name = raw.type_info().name().to_string();
        let e = |e| cell_error(i, e);
        let v = match type_name.as_str() {
            "BOOL" => SqlValue::Boolean(row.try_get(i).map_err(e)?),
            "INT2" => SqlValue::Int(row.try_get::<i16, _>(i).map_err(e)?.into()),
            "INT4" => SqlValue::Int(row.try_get::<i32, _>(i).map_err(e)?.into()),
            "INT8" => SqlValue::Int(row.try_get(i).map_err(e)?),
            "FLOAT4" => SqlValue::Float(row.try_get::<f32, _>(i).map_err(e)?.into()),
            "FLOAT8" => SqlValue::Float(row.try_get(i).map_err(e)?),
            "TEXT" | "VARCHAR" | "BPCHAR" | "NAME" | "CHAR" => {
                SqlValue::Text(row.try_get(i).map_err(e)?)
            }
            "BYTEA" => SqlValue::Bytes(row.try_get(i).map_err(e)?),
            "JSON" | "JSONB" => {
                SqlValue::Json(json_cell(&raw, type_name == "JSONB").map_err(|x| cell_error(i, x))?)
            }
            "TIMESTAMPTZ" => SqlValue::Timestamp(
                row.try_get::<DateTime<Utc>, _>(i)
                    .map_err(e)?
                    .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
            ),
            "TIMESTAMP" => SqlValue::Timestamp(
                row.try_get::<NaiveDateTime, _>(i)
                    .map_err(e)?
                    .and_utc()
                    .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
            ),
            "DATE" => SqlValue::Text(row.try_get::<NaiveDate, _>(i).map_err(e)?.to_string()),
            "UUID" => SqlValue::Uuid(row.try_get::<uuid::Uuid, _>(i).map_err(e)?.to_string()),
            other => {
                return Err(SqlValueError::Refused(format!(
                    "column {i} has type {other}, which plugin rows do not carry; cast it in the query (for example `::text` or `::float8`)"
                )));
            }
        };
        out.push(v);
    }
    Ok(out)
}

/// A `json`/`jsonb` cell's text as Postgres wrote it (no f64 detour).
fn json_cell(
    raw: &sqlx::postgres::PgValueRef<'_>,
    jsonb: bool,
) -> Result<String, sqlx::error::BoxDynError> {
    let bytes = raw.as_bytes()?;
    let text = match raw.format() {
        // jsonb's binary format starts with a version byte.
        sqlx::postgres::PgValueFormat::Binary if jsonb => bytes.get(1..).unwrap_or_default(),
        _ => bytes,
    };
    Ok(std::str::from_utf8(text)?.to_string())
}

/// SQLite cells are typed by their storage class.
pub fn sqlite_row(row: &SqliteRow) -> Result<Vec<SqlValue>, SqlValueError> {
    let mut out = Vec::with_capacity(row.len());
    for i in 0..row.len() {
        let raw = row.try_get_raw(i).map_err(|e| cell_error(i, e))?;
        if raw.is_null() {
            out.push(SqlValue::Null);
            continue;
        }
        let type_name = raw.type_info().name().to_string();
        let e = |e| cell_error(i, e);
        let v = match type_name.as_str() {
            "INTEGER" | "BOOLEAN" => SqlValue::Int(row.try_get_unchecked(i).map_err(e)?),
            "REAL" => SqlValue::Float(row.try_get_unchecked(i).map_err(e)?),
            "BLOB" => SqlValue::Bytes(row.try_get_unchecked(i).map_err(e)?),
            _ => SqlValue::Text(row.try_get_unchecked(i).map_err(e)?),
        };
        out.push(v);
    }
    Ok(out)
}
