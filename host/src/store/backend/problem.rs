//! What a database error means for the operator: a read-only database, a
//! full one and refused credentials get a sentence naming the fix, appended
//! to the error wherever the store reports one.

/// A sentence (with a leading `; `) for the database errors an operator has
/// to act on, or an empty string.
pub fn hint(e: &sqlx::Error) -> &'static str {
    let Some(db) = e.as_database_error() else {
        return "";
    };
    let Some(code) = db.code() else {
        return "";
    };
    // SQLite reports its extended result code, whose low byte is the
    // primary code; Postgres a SQLSTATE (some are digits only, so the two
    // must not be mixed up).
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        return match code.parse::<i32>().map(|c| c & 0xff) {
            Ok(8) => READ_ONLY,
            Ok(13) => FULL,
            _ => "",
        };
    }
    match code.as_ref() {
        "25006" => READ_ONLY,
        "53100" => FULL,
        "28000" | "28P01" => CREDENTIALS,
        _ => "",
    }
}

/// Whether `e` says the database was briefly unavailable (a dropped or
/// terminated connection, a pool that timed out, a server starting up or
/// out of connections, a busy SQLite file) rather than that the request
/// is wrong: trying again later may succeed.
pub fn transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => {
            let Some(code) = db.code() else {
                return false;
            };
            if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                // SQLITE_BUSY and SQLITE_LOCKED.
                return matches!(code.parse::<i32>().map(|c| c & 0xff), Ok(5 | 6));
            }
            // Connection exceptions (08), operator intervention (57P01
            // admin shutdown, 57P02 crash shutdown, 57P03 cannot connect
            // now), too many connections, serialization and deadlock.
            code.starts_with("08")
                || matches!(
                    code.as_ref(),
                    "57P01" | "57P02" | "57P03" | "53300" | "40001" | "40P01"
                )
        }
        _ => false,
    }
}

const READ_ONLY: &str = "; the database is read-only: outboxd writes the outbox, the inbox \
     and their marks, so point database.url at a writable primary (Postgres: \
     default_transaction_read_only off; SQLite: a writable file, not mode=ro). \
     Nothing was written; rows keep their state and are retried";

const FULL: &str = "; the database is full: free disk space (or raise the quota, or \
     SQLite's max_page_count). Nothing was written; rows keep their state and are retried";

const CREDENTIALS: &str = "; the database refused the user or password: fix them in \
     database.url (or OUTBOXD__DATABASE__URL)";

#[cfg(test)]
mod tests {
    use super::*;

    /// SQLite's extended codes are numbers like some SQLSTATEs; 275 (a
    /// CHECK violation) is neither read-only nor full, 8 is read-only.
    #[tokio::test]
    async fn sqlite_codes_are_read_as_sqlite_codes() {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .expect("open");
        sqlx::raw_sql("CREATE TABLE t (x TEXT CHECK (x <> 'bad'))")
            .execute(&pool)
            .await
            .expect("create");
        let e = sqlx::query("INSERT INTO t VALUES ('bad')")
            .execute(&pool)
            .await
            .expect_err("check");
        assert_eq!(hint(&e), "", "{e}");
        sqlx::raw_sql("PRAGMA query_only = 1")
            .execute(&pool)
            .await
            .expect("pragma");
        let e = sqlx::query("INSERT INTO t VALUES ('ok')")
            .execute(&pool)
            .await
            .expect_err("read-only");
        assert_eq!(hint(&e), READ_ONLY, "{e}");
        assert!(!transient(&e), "read-only is not transient: {e}");
    }

    /// What start-up retries: a lost connection and a pool timeout, not a
    /// wrong query.
    #[test]
    fn lost_connections_are_transient_and_bad_requests_are_not() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(transient(&io));
        assert!(transient(&sqlx::Error::PoolTimedOut));
        assert!(!transient(&sqlx::Error::RowNotFound));
        assert!(!transient(&sqlx::Error::ColumnNotFound("x".into())));
    }
}
