//! Values across the WIT boundary: guest `value`s bound as SQL parameters
//! and read back as cells. Never panics; Postgres and SQLite binding accept
//! and refuse the same values; and through a real (in-memory) SQLite
//! `SELECT ?`, every accepted value comes back as documented: booleans as
//! integers, JSON/timestamp/uuid as text (timestamp normalised to RFC 3339
//! UTC, uuid lower-case hyphenated), NaN as NULL, the rest unchanged.
#![no_main]

use std::sync::OnceLock;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
// `SqlValue` mirrors the WIT `value` case for case; the host converts the
// guest's values into it before binding them.
use outboxd_core::sql_values::{SqlValue as Value, bind_pg, bind_sqlite, sqlite_row};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

/// A guest value; `Text`-like variants often carry a well-formed value so
/// the fuzzer reaches the accepting paths quickly.
#[derive(Debug, Clone, Arbitrary)]
enum V {
    Null,
    Boolean(bool),
    Int(i64),
    Float(f64),
    Text(String),
    Bytes(Vec<u8>),
    Json(String),
    JsonNumber(f64),
    Timestamp(String),
    TimestampFrom(i64, u32),
    Uuid(String),
    UuidFrom(u128),
}

impl V {
    fn value(&self) -> Value {
        match self.clone() {
            V::Null => Value::Null,
            V::Boolean(b) => Value::Boolean(b),
            V::Int(n) => Value::Int(n),
            V::Float(f) => Value::Float(f),
            V::Text(s) => Value::Text(s),
            V::Bytes(b) => Value::Bytes(b),
            V::Json(s) => Value::Json(s),
            V::JsonNumber(f) => Value::Json(serde_json::json!({ "n": f }).to_string()),
            V::Timestamp(s) => Value::Timestamp(s),
            V::TimestampFrom(secs, nanos) => Value::Timestamp(
                chrono::DateTime::from_timestamp(secs % 300_000_000_000, nanos % 1_000_000_000)
                    .unwrap_or_default()
                    .to_rfc3339(),
            ),
            V::Uuid(s) => Value::Uuid(s),
            V::UuidFrom(n) => Value::Uuid(uuid::Uuid::from_u128(n).to_string()),
        }
    }
}

/// What `SELECT ?` returns for a value SQLite accepted.
fn expected(v: &Value) -> Value {
    match v {
        Value::Null => Value::Null,
        Value::Boolean(b) => Value::Int(i64::from(*b)),
        Value::Int(n) => Value::Int(*n),
        Value::Float(f) if f.is_nan() => Value::Null,
        Value::Float(f) => Value::Float(*f),
        Value::Text(s) => Value::Text(s.clone()),
        Value::Bytes(b) => Value::Bytes(b.clone()),
        Value::Json(s) => Value::Text(s.clone()),
        Value::Timestamp(s) => Value::Text(
            chrono::DateTime::parse_from_rfc3339(s)
                .expect("accepted")
                .with_timezone(&chrono::Utc)
                .to_rfc3339(),
        ),
        Value::Uuid(s) => Value::Text(uuid::Uuid::parse_str(s).expect("accepted").to_string()),
    }
}

fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Float(x), Value::Float(y)) => x == y,
        _ => format!("{a:?}") == format!("{b:?}"),
    }
}

struct Sqlite {
    rt: tokio::runtime::Runtime,
    pool: SqlitePool,
}

fn sqlite() -> &'static Sqlite {
    static DB: OnceLock<Sqlite> = OnceLock::new();
    DB.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let pool = rt
            .block_on(
                SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect_with(SqliteConnectOptions::new().in_memory(true)),
            )
            .expect("in-memory sqlite");
        Sqlite { rt, pool }
    })
}

fuzz_target!(|values: Vec<V>| {
    let values: Vec<Value> = values.iter().take(8).map(V::value).collect();
    if values.is_empty() {
        return;
    }
    let sql = format!("SELECT {}", vec!["?"; values.len()].join(", "));
    let pg = bind_pg(sqlx::query(&sql), values.clone()).map(|_| ());
    let lite = bind_sqlite(sqlx::query(&sql), values.clone());
    assert_eq!(pg.is_ok(), lite.is_ok(), "{values:?}: pg {pg:?}");
    let Ok(query) = lite else {
        return;
    };
    let db = sqlite();
    let row = db
        .rt
        .block_on(query.fetch_one(&db.pool))
        .expect("SELECT of bound values");
    let cells = sqlite_row(&row).expect("cells");
    assert_eq!(cells.len(), values.len());
    for (v, cell) in values.iter().zip(&cells) {
        let want = expected(v);
        assert!(
            same(&want, cell),
            "{v:?} came back as {cell:?}, expected {want:?}"
        );
    }
});
