//! `confirm_order`, the producer side of the example: the order changes and
//! its event is written in one transaction, or neither happens, so no
//! confirmed order lacks its event and no event announces an order that was
//! rolled back.

use serde_json::json;
use sqlx::{Executor, Row, Transaction};

use outboxd::db_url::DbKind;
use outboxd::event::{EventId, NewEvent};
use outboxd::fault::{FaultPoint, Faults, InjectedFault};
use outboxd::store::Db;
use outboxd::store::EnqueueError;
use outboxd::store::OutboxDatabase;
use outboxd::store::enqueue;
use outboxd::store::fingerprint;
use outboxd::store::lookup_operation;

pub const ORDER_CONFIRMED: &str = "order.confirmed";

const PG_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS orders (
  id           text   PRIMARY KEY,
  customer_id  text   NOT NULL,
  total_cents  bigint NOT NULL,
  status       text   NOT NULL DEFAULT 'pending',
  confirmed_at bigint
)";

const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS orders (
  id           TEXT    PRIMARY KEY,
  customer_id  TEXT    NOT NULL,
  total_cents  INTEGER NOT NULL,
  status       TEXT    NOT NULL DEFAULT 'pending',
  confirmed_at INTEGER
)";

/// Creates the example `orders` table (it belongs to the example service,
/// not to outboxd's migrations).
pub async fn create_schema(db: &Db) -> Result<(), sqlx::Error> {
    let sql = match db.kind() {
        DbKind::Postgres => PG_SCHEMA,
        DbKind::Sqlite => SQLITE_SCHEMA,
    };
    outboxd::store::execute_in_app_schema(db, sql).await
}

/// Adds a pending order.
pub async fn create_order(
    db: &Db,
    id: &str,
    customer_id: &str,
    total_cents: i64,
) -> Result<(), sqlx::Error> {
    let sql = "INSERT INTO orders (id, customer_id, total_cents) VALUES ($1, $2, $3)";
    match db {
        Db::Postgres(p) => sqlx::query(sql)
            .bind(id)
            .bind(customer_id)
            .bind(total_cents)
            .execute(p)
            .await?
            .rows_affected(),
        Db::Sqlite(p) => sqlx::query(sql)
            .bind(id)
            .bind(customer_id)
            .bind(total_cents)
            .execute(p)
            .await?
            .rows_affected(),
    };
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmOrder {
    pub order_id: String,
    /// Optional operation key (tenant, key) for safe client retries.
    pub operation_key: Option<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfirmOutcome {
    /// The order moved to confirmed and its event was written.
    Confirmed(EventId),
    /// The same operation key was already applied: the first event's id.
    Repeat(EventId),
    /// The order does not exist or is not pending: no event.
    Unchanged,
}

#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    #[error(transparent)]
    Enqueue(#[from] EnqueueError),
    #[error("database error while confirming the order: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Fault(#[from] InjectedFault),
}

/// The order service of the demo and the crash-matrix tests.
#[derive(Debug, Clone)]
pub struct OrderService {
    db: Db,
    faults: Faults,
}

impl OrderService {
    pub fn new(db: Db) -> Self {
        Self {
            db,
            faults: Faults::none(),
        }
    }

    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    pub async fn confirm_order(&self, cmd: &ConfirmOrder) -> Result<ConfirmOutcome, OrderError> {
        self.faults.check(FaultPoint::BeforeTransaction).await?;
        let outcome = match &self.db {
            Db::Postgres(p) => self.confirm_in(p.begin().await?, cmd).await?,
            Db::Sqlite(p) => self.confirm_in(p.begin().await?, cmd).await?,
        };
        self.faults
            .check(FaultPoint::AfterCommitBeforeReply)
            .await?;
        Ok(outcome)
    }

    async fn confirm_in<DB>(
        &self,
        mut tx: Transaction<'static, DB>,
        cmd: &ConfirmOrder,
    ) -> Result<ConfirmOutcome, OrderError>
    where
        DB: OutboxDatabase,
        for<'e> &'e mut DB::Connection: Executor<'e, Database = DB>,
        for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
        for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Decode<'q, DB> + sqlx::Type<DB>,
        for<'q> String: sqlx::Decode<'q, DB> + sqlx::Type<DB>,
        usize: sqlx::ColumnIndex<DB::Row>,
    {
        let now = chrono::Utc::now().timestamp_micros();
        let updated = sqlx::query(
            "UPDATE orders SET status = 'confirmed', confirmed_at = $2
              WHERE id = $1 AND status = 'pending'
              RETURNING customer_id, total_cents",
        )
        .bind(cmd.order_id.as_str())
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;

        let Some(row) = updated else {
            // Already confirmed or missing: no event. With an operation key
            // this may be a client retry, which gets the first answer back.
            let outcome = self.repeat_of(&mut tx, cmd).await?;
            tx.rollback().await?;
            return Ok(outcome);
        };
        let event = order_confirmed(cmd, row.get(0), row.get(1));
        let id = enqueue(&mut tx, event).await?.id();
        self.faults
            .check(FaultPoint::AfterInsertBeforeCommit)
            .await?;
        tx.commit().await?;
        Ok(ConfirmOutcome::Confirmed(id))
    }

    async fn repeat_of<DB>(
        &self,
        tx: &mut Transaction<'static, DB>,
        cmd: &ConfirmOrder,
    ) -> Result<ConfirmOutcome, OrderError>
    where
        DB: OutboxDatabase,
        for<'e> &'e mut DB::Connection: Executor<'e, Database = DB>,
        for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
        for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Decode<'q, DB> + sqlx::Type<DB>,
        for<'q> String: sqlx::Decode<'q, DB> + sqlx::Type<DB>,
        usize: sqlx::ColumnIndex<DB::Row>,
    {
        let Some((tenant, key)) = &cmd.operation_key else {
            return Ok(ConfirmOutcome::Unchanged);
        };
        let Some((existing, stored_fp)) = lookup_operation(tx, tenant, key).await? else {
            return Ok(ConfirmOutcome::Unchanged);
        };
        let order = sqlx::query("SELECT customer_id, total_cents FROM orders WHERE id = $1")
            .bind(cmd.order_id.as_str())
            .fetch_optional(&mut **tx)
            .await?;
        let same = order.is_some_and(|row| {
            fingerprint(&order_confirmed(cmd, row.get(0), row.get(1))) == stored_fp
        });
        if same {
            Ok(ConfirmOutcome::Repeat(existing))
        } else {
            Err(EnqueueError::IdempotencyConflict {
                tenant: tenant.clone(),
                key: key.clone(),
                existing: existing.0,
            }
            .into())
        }
    }
}

/// The event: everything billing needs to act without calling back.
fn order_confirmed(cmd: &ConfirmOrder, customer_id: String, total_cents: i64) -> NewEvent {
    let mut ev = NewEvent::new(
        cmd.order_id.clone(),
        ORDER_CONFIRMED,
        json!({ "order_id": cmd.order_id, "customer_id": customer_id, "total_cents": total_cents }),
    );
    if let Some((tenant, key)) = &cmd.operation_key {
        ev = ev.with_operation_key(tenant.clone(), key.clone());
    }
    ev
}
