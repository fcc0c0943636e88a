//! A consumer's effect the tests can read back in order: [`Ledger`] appends
//! each message's `(key, seq)` to the application table `applied`, and
//! refuses a poison message until the test fixes it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use outboxd::consumer::{Handler, HandlerError};
use outboxd::message::Delivery;
use outboxd::sql_values::SqlValue;
use outboxd::store::InboxTx;

use super::db::{TestDb, with_pool};

/// Appends `(key, seq)` to `applied`; fails permanently on a payload that
/// says `"poison": true` until the test sets `fixed`.
#[derive(Clone, Default)]
pub struct Ledger {
    pub fixed: Arc<AtomicBool>,
}

impl Handler for Ledger {
    async fn handle(&self, tx: &mut InboxTx, d: &Delivery) -> Result<(), HandlerError> {
        let v: serde_json::Value = serde_json::from_slice(&d.payload)
            .map_err(|e| HandlerError::Permanent(e.to_string()))?;
        if v["poison"] == true && !self.fixed.load(Ordering::SeqCst) {
            return Err(HandlerError::Permanent(format!(
                "seq {} is poison",
                v["seq"]
            )));
        }
        let key = String::from_utf8(d.key.clone().unwrap_or_default()).expect("utf-8 key");
        tx.execute(
            "INSERT INTO applied (k, seq) VALUES ($1, $2)",
            vec![
                SqlValue::Text(key),
                SqlValue::Int(v["seq"].as_i64().expect("seq")),
            ],
        )
        .await?;
        Ok(())
    }
}

/// The table [`Ledger`] writes, in the application's schema.
pub async fn create_applied(t: &TestDb) {
    t.exec_app(if t.is_postgres() {
        "CREATE TABLE applied (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, k text NOT NULL, seq bigint NOT NULL)"
    } else {
        "CREATE TABLE applied (id INTEGER PRIMARY KEY AUTOINCREMENT, k TEXT NOT NULL, seq INTEGER NOT NULL)"
    })
    .await;
}

/// The seqs applied for `key`, in the order their effects committed.
pub async fn applied(t: &TestDb, key: &str) -> Vec<i64> {
    let sql = format!("SELECT seq FROM applied WHERE k = '{key}' ORDER BY id");
    with_pool!(&t.db, |p| sqlx::query_scalar::<_, i64>(&sql)
        .fetch_all(p)
        .await
        .expect("applied"))
}
