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
    // Postgres reports a SQLSTATE, SQLite its extended result code, whose
    // low byte is the primary code.
    let sqlite_primary = code.parse::<i32>().ok().map(|c| c & 0xff);
    match (code.as_ref(), sqlite_primary) {
        ("25006", _) | (_, Some(8)) => READ_ONLY,
        ("53100", _) | (_, Some(13)) => FULL,
        ("28000" | "28P01", _) => CREDENTIALS,
        _ => "",
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
