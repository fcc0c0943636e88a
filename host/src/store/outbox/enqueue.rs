//! The write API: events enter the outbox inside the caller's transaction.

use std::future::Future;

use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use sqlx::{Postgres, Row, Sqlite, Transaction};
use uuid::Uuid;

use crate::event::{Enqueued, EventId, NewEvent};
use crate::store::EnqueueError;
use crate::store::outbox::fingerprint::fingerprint;

/// A database the outbox can be written to inside a caller's transaction.
pub trait OutboxDatabase: sqlx::Database {
    fn enqueue_in(
        conn: &mut Self::Connection,
        event: NewEvent,
    ) -> impl Future<Output = Result<Enqueued, EnqueueError>> + Send;

    fn lookup_operation_in(
        conn: &mut Self::Connection,
        tenant: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<(EventId, String)>, EnqueueError>> + Send;
}

/// Writes `event` to the outbox in the caller's transaction. The event exists
/// if and only if the caller commits.
///
/// With an operation key, repeating the key with the same aggregate, type
/// and payload returns [`Enqueued::Repeat`] with the first event's id, and a
/// different payload is [`EnqueueError::IdempotencyConflict`]. Two racing
/// transactions with one key produce exactly one row: the second waits on
/// the unique index and then sees the first.
pub async fn enqueue<DB: OutboxDatabase>(
    tx: &mut Transaction<'_, DB>,
    event: NewEvent,
) -> Result<Enqueued, EnqueueError> {
    validate(&event)?;
    let mut event = event;
    // With telemetry on, an event whose producer passed a trace context gets
    // an `enqueue` span under it, and the row carries that span onward.
    let span = crate::telemetry::Span::child(
        crate::telemetry::remote(
            event
                .headers
                .get(crate::telemetry::TRACEPARENT)
                .map(String::as_str),
        )
        .as_ref(),
        "enqueue",
        opentelemetry::trace::SpanKind::Producer,
    );
    if let Some(traceparent) = span.traceparent() {
        span.attr("outboxd.aggregate_id", || event.aggregate_id.clone());
        span.attr("outboxd.event_type", || event.event_type.clone());
        event
            .headers
            .insert(crate::telemetry::TRACEPARENT.to_string(), traceparent);
    }
    let result = DB::enqueue_in(&mut *tx, event).await;
    span.record(&result);
    result
}

/// Finds the event written for an operation key, with its fingerprint.
pub async fn lookup_operation<DB: OutboxDatabase>(
    tx: &mut Transaction<'_, DB>,
    tenant: &str,
    key: &str,
) -> Result<Option<(EventId, String)>, EnqueueError> {
    DB::lookup_operation_in(&mut *tx, tenant, key).await
}

fn validate(event: &NewEvent) -> Result<(), EnqueueError> {
    if event.aggregate_id.is_empty() {
        return Err(EnqueueError::Invalid(
            "aggregate_id is empty; every event needs the id of the entity it is about".into(),
        ));
    }
    if event.event_type.is_empty() {
        return Err(EnqueueError::Invalid(
            "event_type is empty; name the fact, for example order.confirmed".into(),
        ));
    }
    if let Some(op) = &event.operation_key
        && op.key.is_empty()
    {
        return Err(EnqueueError::Invalid(
            "operation key is empty; omit it or send a non-empty key".into(),
        ));
    }
    Ok(())
}

fn resolve_repeat(
    event: &NewEvent,
    existing: Option<(EventId, String)>,
    fp: &str,
) -> Result<Enqueued, EnqueueError> {
    let op = event
        .operation_key
        .clone()
        .unwrap_or_else(|| crate::event::OperationKey {
            tenant: String::new(),
            key: String::new(),
        });
    match existing {
        Some((id, stored)) if stored == fp => Ok(Enqueued::Repeat(id)),
        Some((id, _)) => Err(EnqueueError::IdempotencyConflict {
            tenant: op.tenant,
            key: op.key,
            existing: id.0,
        }),
        // The conflicting row was deleted between our insert and our read
        // (retention), or the caller's isolation level hides it.
        None => Err(EnqueueError::Database(sqlx::Error::Protocol(format!(
            "operation key `{}` conflicted but its row is not visible; retry the transaction (use READ COMMITTED)",
            op.key
        )))),
    }
}

/// What an insert binds for the operation key: its fingerprint, tenant and
/// key (an event without one has an empty tenant and no key).
fn keys(event: &NewEvent) -> (Option<String>, &str, Option<&str>) {
    let fp = event.operation_key.as_ref().map(|_| fingerprint(event));
    match &event.operation_key {
        Some(op) => (fp, op.tenant.as_str(), Some(op.key.as_str())),
        None => (fp, "", None),
    }
}

/// After the insert: the new event, or, when the operation key was taken,
/// the first event's id if it is the same operation.
async fn created_or_repeat<DB: OutboxDatabase>(
    conn: &mut DB::Connection,
    event: &NewEvent,
    inserted: bool,
    id: Uuid,
    fp: Option<&str>,
    tenant: &str,
    key: Option<&str>,
) -> Result<Enqueued, EnqueueError> {
    if inserted {
        return Ok(Enqueued::Created(EventId(id)));
    }
    let existing = DB::lookup_operation_in(conn, tenant, key.unwrap_or_default()).await?;
    resolve_repeat(event, existing, fp.unwrap_or_default())
}

fn headers_json(event: &NewEvent) -> serde_json::Value {
    serde_json::Value::Object(
        event
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect(),
    )
}

// On the application's own connection, whose search path need not name
// outboxd's schema (migration 0011): qualified.
const PG_INSERT: &str = "INSERT INTO outboxd.outbox
    (id, aggregate_id, event_type, payload, headers, idempotency_tenant, idempotency_key, payload_fingerprint)
    VALUES (CAST($1 AS uuid), $2, $3, CAST($4 AS jsonb), CAST($5 AS jsonb), $6, $7, $8)
    ON CONFLICT (idempotency_tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id";

/// Inserts `event` under a new id unless its operation key is taken, and
/// settles which it was: one bind chain for both databases, every value as
/// text (Postgres casts the id and the JSON in [`PG_INSERT`]).
macro_rules! insert_event {
    ($conn:expr, $sql:expr, $event:expr) => {{
        let (fp, tenant, key) = keys(&$event);
        let id = Uuid::new_v4();
        let row = sqlx::query($sql)
            .bind(id.to_string())
            .bind(&$event.aggregate_id)
            .bind(&$event.event_type)
            .bind($event.payload.to_string())
            .bind(headers_json(&$event).to_string())
            .bind(tenant)
            .bind(key)
            .bind(fp.as_deref())
            .fetch_optional(&mut *$conn)
            .await?;
        created_or_repeat::<Self>(
            $conn,
            &$event,
            row.is_some(),
            id,
            fp.as_deref(),
            tenant,
            key,
        )
        .await
    }};
}

/// The event an operation key already names, with its payload's
/// fingerprint: one statement for both databases but for the table's name
/// (Postgres names outboxd's schema); `$id` reads the id from the row.
macro_rules! lookup_operation {
    ($conn:expr, $table:literal, $tenant:expr, $key:expr, $id:expr) => {{
        let row = sqlx::query(concat!(
            "SELECT id, coalesce(payload_fingerprint, '') FROM ",
            $table,
            " WHERE idempotency_tenant = $1 AND idempotency_key = $2"
        ))
        .bind($tenant)
        .bind($key)
        .fetch_optional(&mut *$conn)
        .await?;
        match row {
            None => Ok(None),
            Some(r) => Ok(Some((EventId($id(&r)?), r.get(1)))),
        }
    }};
}

impl OutboxDatabase for Postgres {
    async fn enqueue_in(
        conn: &mut sqlx::PgConnection,
        event: NewEvent,
    ) -> Result<Enqueued, EnqueueError> {
        // The per-aggregate lock is taken before the identity value is drawn,
        // so within one aggregate seq order is commit order.
        sqlx::query(crate::store::backend::locks::AGGREGATE_LOCK)
            .bind(&event.aggregate_id)
            .execute(&mut *conn)
            .await?;
        insert_event!(conn, PG_INSERT, event)
    }

    async fn lookup_operation_in(
        conn: &mut sqlx::PgConnection,
        tenant: &str,
        key: &str,
    ) -> Result<Option<(EventId, String)>, EnqueueError> {
        lookup_operation!(conn, "outboxd.outbox", tenant, key, |r: &PgRow| {
            Ok::<_, EnqueueError>(r.get(0))
        })
    }
}

const SQLITE_INSERT: &str = "INSERT INTO outbox
    (id, aggregate_id, event_type, payload, headers, idempotency_tenant, idempotency_key, payload_fingerprint)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
    ON CONFLICT (idempotency_tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id";

impl OutboxDatabase for Sqlite {
    async fn enqueue_in(
        conn: &mut sqlx::SqliteConnection,
        event: NewEvent,
    ) -> Result<Enqueued, EnqueueError> {
        // SQLite serialises writers for the whole transaction, so seq order
        // is commit order without a lock of our own.
        insert_event!(conn, SQLITE_INSERT, event)
    }

    async fn lookup_operation_in(
        conn: &mut sqlx::SqliteConnection,
        tenant: &str,
        key: &str,
    ) -> Result<Option<(EventId, String)>, EnqueueError> {
        lookup_operation!(conn, "outbox", tenant, key, |r: &SqliteRow| {
            let text: String = r.get(0);
            Uuid::parse_str(&text).map_err(|e| {
                EnqueueError::Invalid(format!("stored outbox id `{text}` is not a uuid: {e}"))
            })
        })
    }
}
