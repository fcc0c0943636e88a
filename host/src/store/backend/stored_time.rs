//! A time bound as each database stores it: a `timestamptz` on Postgres,
//! microseconds since the epoch on SQLite. With it one statement text and
//! one chain of binds serve both databases where only the time's encoding
//! differs.

use chrono::{DateTime, Utc};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::{Postgres, Sqlite};

/// `DateTime<Utc>` as a bind parameter in the stored form of the database
/// it is bound for.
#[derive(Debug, Clone, Copy)]
pub struct StoredTime(pub DateTime<Utc>);

impl sqlx::Type<Postgres> for StoredTime {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <DateTime<Utc> as sqlx::Type<Postgres>>::type_info()
    }
}

impl<'q> sqlx::Encode<'q, Postgres> for StoredTime {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<IsNull, BoxDynError> {
        <DateTime<Utc> as sqlx::Encode<'q, Postgres>>::encode_by_ref(&self.0, buf)
    }
}

impl sqlx::Type<Sqlite> for StoredTime {
    fn type_info() -> sqlx::sqlite::SqliteTypeInfo {
        <i64 as sqlx::Type<Sqlite>>::type_info()
    }
}

impl<'q> sqlx::Encode<'q, Sqlite> for StoredTime {
    fn encode_by_ref(
        &self,
        buf: &mut Vec<sqlx::sqlite::SqliteArgumentValue<'q>>,
    ) -> Result<IsNull, BoxDynError> {
        <i64 as sqlx::Encode<'q, Sqlite>>::encode_by_ref(&self.0.timestamp_micros(), buf)
    }
}
