//! Consumer dead letters as stored (`consumer_dead_letters`, migrations
//! 0004 and 0012): written by a consumer's runner when it gives up on a
//! message or parks one behind it, acted on by an operator (list, show,
//! redrive, discard), and applied back by the running consumer.
//!
//! A key is *parked* for a consumer while any unresolved row of that
//! consumer and key holds it (`holds_key`). Rows are applied in id order
//! per key: a row may run only when no unresolved row holding its key has
//! a smaller id, and only once it is not `dead`. Each row is resolved in
//! the transaction of its message's effect (or by a discard), so an
//! applied row is applied once, whatever is killed when.
//!
//! Every statement is one text for both databases, with the casts in the
//! SQL; times are bound as each database stores them ([`StoredTime`]).

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use outboxd_core::message::Delivery;
use serde::Serialize;
use sqlx::Row;

use crate::store::backend::stored_time::StoredTime;
use crate::store::{Db, InboxTx, on_pool};

/// What a row is waiting for.
pub const DEAD: &str = "dead";
/// A later message of a parked key.
pub const PARKED: &str = "parked";
/// Released by an operator; the running consumer applies it.
pub const REDRIVE: &str = "redrive";

/// One consumer dead letter (or parked message), as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConsumerDeadLetter {
    pub id: i64,
    pub consumer: String,
    pub message_id: Option<String>,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The key as text when it is UTF-8, else `{"hex": …}`; `null` without one.
    pub key: serde_json::Value,
    #[serde(skip)]
    pub key_bytes: Option<Vec<u8>>,
    /// `dead`, `parked` or `redrive`.
    pub state: String,
    /// Whether this row holds its key back (`on_dead = "park_key"`).
    pub holds_key: bool,
    pub error: String,
    /// The handler that gave up: `builtin:NAME` or `plugin NAME@VERSION`.
    pub handler: String,
    pub attempts: i32,
    pub dead_at: DateTime<Utc>,
    /// Fix-forward: the version a redrive runs the message through.
    pub redrive_with: Option<String>,
    pub resolved_at: Option<DateTime<Utc>>,
    /// `applied`, `duplicate` or `discarded` once resolved.
    pub resolution: Option<String>,
    pub resolve_reason: Option<String>,
    /// The message itself: shown by `dead show`, not in lists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<serde_json::Value>,
    #[serde(skip)]
    pub raw: Option<StoredMessage>,
}

/// A stored message's payload and headers, as bytes.
pub type StoredMessage = (Vec<u8>, Vec<(String, Vec<u8>)>);

impl ConsumerDeadLetter {
    /// The message again, as the consumer received it (for a redrive): the
    /// row must have been read with its payload.
    pub fn delivery(&self) -> Option<Delivery> {
        let (payload, headers) = self.raw.clone()?;
        Some(Delivery {
            topic: self.topic.clone(),
            partition: self.partition,
            offset: self.offset,
            key: self.key_bytes.clone(),
            payload,
            headers,
            attempt: 0,
        })
    }

    pub fn is_resolved(&self) -> bool {
        self.resolved_at.is_some()
    }
}

/// Bytes as JSON: text when UTF-8, else `{"hex": …}`.
fn bytes_json(bytes: &[u8]) -> serde_json::Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::Value::String(text.to_string()),
        Err(_) => serde_json::json!({ "hex": hex::encode(bytes) }),
    }
}

/// The stored form of a dead letter's headers: a JSON array of `[name,
/// value]`, the value as text when it is UTF-8 and as `{"hex": …}` when not.
pub(in crate::store) fn headers_json(headers: &[(String, Vec<u8>)]) -> String {
    let list: Vec<serde_json::Value> = headers
        .iter()
        .map(|(k, v)| serde_json::json!([k, bytes_json(v)]))
        .collect();
    serde_json::Value::Array(list).to_string()
}

/// The headers back from their stored form; a header that cannot be read
/// back is dropped with the reason in the error.
fn headers_from_json(text: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let list: Vec<serde_json::Value> =
        serde_json::from_str(text).map_err(|e| format!("stored headers are not JSON: {e}"))?;
    list.into_iter()
        .map(|h| {
            let pair = h.as_array().filter(|p| p.len() == 2);
            let (name, value) = match pair {
                Some(p) => (p[0].as_str(), &p[1]),
                None => return Err(format!("stored header {h} is not [name, value]")),
            };
            let name = name.ok_or_else(|| format!("stored header {h} has no name"))?;
            let value = match value {
                serde_json::Value::String(s) => s.as_bytes().to_vec(),
                other => other
                    .get("hex")
                    .and_then(|x| x.as_str())
                    .and_then(|x| hex::decode(x).ok())
                    .ok_or_else(|| format!("stored header `{name}` has an unreadable value"))?,
            };
            Ok((name.to_string(), value))
        })
        .collect()
}

/// The columns every read decodes, over table alias `d`.
fn columns(db: &Db, with_message: bool) -> String {
    format!(
        "d.id, d.consumer, CAST(d.message_id AS text), d.topic, CAST(d.partition AS bigint), d.\"offset\",
         d.message_key, d.state, CAST(CASE WHEN d.holds_key THEN 1 ELSE 0 END AS bigint), d.error, d.handler,
         CAST(d.attempts AS bigint), {dead}, d.redrive_with, {resolved}, d.resolution, d.resolve_reason,
         {payload}, {headers}",
        dead = db.epoch_micros("d.dead_at"),
        resolved = db.epoch_micros("d.resolved_at"),
        payload = if with_message { "d.payload" } else { "NULL" },
        headers = if with_message {
            "CAST(d.headers AS text)"
        } else {
            "NULL"
        },
    )
}

fn decode<R>(r: &R) -> Result<ConsumerDeadLetter, sqlx::Error>
where
    R: Row,
    usize: sqlx::ColumnIndex<R>,
    for<'a> i64: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> Vec<u8>: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    let key_bytes: Option<Vec<u8>> = r.try_get(6)?;
    let payload: Option<Vec<u8>> = r.try_get(17)?;
    let headers: Option<String> = r.try_get(18)?;
    let raw = match (&payload, &headers) {
        (Some(p), Some(h)) => {
            let list = headers_from_json(h).map_err(|e| sqlx::Error::ColumnDecode {
                index: "headers".into(),
                source: e.into(),
            })?;
            Some((p.clone(), list))
        }
        _ => None,
    };
    Ok(ConsumerDeadLetter {
        id: r.try_get(0)?,
        consumer: r.try_get(1)?,
        message_id: r.try_get(2)?,
        topic: r.try_get(3)?,
        partition: r.try_get::<i64, _>(4)? as i32,
        offset: r.try_get(5)?,
        key: key_bytes
            .as_deref()
            .map(bytes_json)
            .unwrap_or(serde_json::Value::Null),
        key_bytes,
        state: r.try_get(7)?,
        holds_key: r.try_get::<i64, _>(8)? != 0,
        error: r.try_get(9)?,
        handler: r.try_get(10)?,
        attempts: r.try_get::<i64, _>(11)? as i32,
        dead_at: crate::store::outbox::sqlite_claim::from_micros(r.try_get(12)?),
        redrive_with: r.try_get(13)?,
        resolved_at: r
            .try_get::<Option<i64>, _>(14)?
            .map(crate::store::outbox::sqlite_claim::from_micros),
        resolution: r.try_get(15)?,
        resolve_reason: r.try_get(16)?,
        payload: payload.as_deref().map(bytes_json),
        headers: headers.and_then(|h| serde_json::from_str(&h).ok()),
        raw,
    })
}

/// A message written as dead or parked.
pub struct NewRow<'a> {
    pub consumer: &'a str,
    pub delivery: &'a Delivery,
    pub state: &'static str,
    pub holds_key: bool,
    pub error: &'a str,
    pub handler: &'a str,
    pub attempts: u32,
}

/// Writes a row for `row.delivery` unless an unresolved row of the same
/// consumer already holds that message (topic, partition, offset): a
/// message redelivered after a crash, between its row and its offset, is
/// recorded once. True when a row was written.
pub async fn insert(db: &Db, row: NewRow<'_>) -> Result<bool, sqlx::Error> {
    let d = row.delivery;
    let message_id = d.message_id().ok();
    let headers = headers_json(&d.headers);
    let error = crate::store::truncate(row.error, 2000);
    // Both databases take the id as text and the attempts as a bigint;
    // Postgres casts them to its column types (SQLite's CAST to `uuid`
    // would make a number of the text, so the casts are Postgres's only).
    let (id, hdrs, attempts) = match db {
        Db::Postgres(_) => (
            "CAST($2 AS uuid)",
            "CAST($8 AS jsonb)",
            "CAST($11 AS integer)",
        ),
        Db::Sqlite(_) => ("$2", "$8", "$11"),
    };
    let sql = format!(
        "INSERT INTO consumer_dead_letters
            (consumer, message_id, topic, partition, \"offset\", message_key, payload, headers, error, handler, attempts, state, holds_key)
         SELECT $1, {id}, $3, $4, $5, $6, $7, {hdrs}, $9, $10, {attempts}, $12, $13
          WHERE NOT EXISTS (SELECT 1 FROM consumer_dead_letters e
                             WHERE e.consumer = $1 AND e.topic = $3 AND e.partition = $4
                               AND e.\"offset\" = $5 AND e.resolved_at IS NULL)"
    );
    let n = on_pool!(db, |p| sqlx::query(&sql)
        .bind(row.consumer)
        .bind(message_id.map(|u| u.to_string()))
        .bind(&d.topic)
        .bind(d.partition)
        .bind(d.offset)
        .bind(&d.key)
        .bind(&d.payload)
        .bind(&headers)
        .bind(&error)
        .bind(row.handler)
        .bind(row.attempts as i64)
        .bind(row.state)
        .bind(row.holds_key)
        .execute(p)
        .await?
        .rows_affected());
    Ok(n > 0)
}

/// Records `d` as dead for `consumer`, with why (cut to 2000 characters),
/// the handler that gave up and how often it tried, holding its key back
/// when `holds_key`.
pub async fn record(
    db: &Db,
    consumer: &str,
    d: &Delivery,
    error: &str,
    handler: &str,
    attempts: u32,
    holds_key: bool,
) -> Result<(), sqlx::Error> {
    insert(
        db,
        NewRow {
            consumer,
            delivery: d,
            state: DEAD,
            holds_key,
            error,
            handler,
            attempts,
        },
    )
    .await
    .map(|_| ())
}

/// Records `d` as parked behind an unresolved row of its key.
pub async fn park(db: &Db, consumer: &str, d: &Delivery) -> Result<(), sqlx::Error> {
    insert(
        db,
        NewRow {
            consumer,
            delivery: d,
            state: PARKED,
            holds_key: true,
            error: "parked: an earlier message of this key has an unresolved dead letter",
            handler: "",
            attempts: 0,
        },
    )
    .await
    .map(|_| ())
}

/// The keys a consumer holds back now, with how many messages are parked
/// behind them and since when the oldest key has been.
#[derive(Debug, Clone, Default)]
pub struct ParkedKeys {
    pub keys: HashSet<Vec<u8>>,
    pub parked_messages: i64,
    pub oldest: Option<DateTime<Utc>>,
}

pub async fn parked_keys(db: &Db, consumer: &str) -> Result<ParkedKeys, sqlx::Error> {
    let sql = format!(
        "SELECT d.message_key, CAST(sum(CASE WHEN d.state = 'parked' THEN 1 ELSE 0 END) AS bigint),
                min({dead})
           FROM consumer_dead_letters d
          WHERE d.consumer = $1 AND d.resolved_at IS NULL AND d.holds_key
          GROUP BY d.message_key",
        dead = db.epoch_micros("d.dead_at"),
    );
    on_pool!(db, |p| {
        let rows = sqlx::query(&sql).bind(consumer).fetch_all(p).await?;
        let mut out = ParkedKeys::default();
        for r in &rows {
            let key: Option<Vec<u8>> = r.try_get(0)?;
            out.parked_messages += r.try_get::<i64, _>(1)?;
            let since = crate::store::outbox::sqlite_claim::from_micros(r.try_get(2)?);
            out.oldest = Some(out.oldest.map_or(since, |o: DateTime<Utc>| o.min(since)));
            if let Some(k) = key {
                out.keys.insert(k);
            }
        }
        Ok(out)
    })
}

/// The rows of `consumer` that may be applied now, oldest first: released
/// (`redrive`) or parked, with no unresolved row holding their key ahead of
/// them. At most one per key is ever returned.
pub async fn next_to_apply(
    db: &Db,
    consumer: &str,
    limit: i64,
) -> Result<Vec<ConsumerDeadLetter>, sqlx::Error> {
    let sql = format!(
        "SELECT {cols}
           FROM consumer_dead_letters d
          WHERE d.consumer = $1 AND d.resolved_at IS NULL AND d.state <> 'dead'
            AND (NOT d.holds_key OR NOT EXISTS (
                  SELECT 1 FROM consumer_dead_letters e
                   WHERE e.consumer = d.consumer AND e.resolved_at IS NULL AND e.holds_key
                     AND e.message_key = d.message_key AND e.id < d.id))
          ORDER BY d.id
          LIMIT $2",
        cols = columns(db, true)
    );
    on_pool!(db, |p| {
        let rows = sqlx::query(&sql)
            .bind(consumer)
            .bind(limit)
            .fetch_all(p)
            .await?;
        rows.iter().map(decode).collect()
    })
}

/// Inside the transaction that applies row `id`: takes the row (locking it
/// on Postgres until the commit) if it is still unresolved and not dead.
/// False when someone else resolved it first.
pub async fn take_for_apply(tx: &mut InboxTx, id: i64) -> Result<bool, sqlx::Error> {
    tx.as_host().await?;
    let sql = "UPDATE consumer_dead_letters SET state = state
                WHERE id = $1 AND resolved_at IS NULL AND state <> 'dead'";
    let n = match tx {
        InboxTx::Postgres(t) => sqlx::query(sql)
            .bind(id)
            .execute(&mut **t)
            .await?
            .rows_affected(),
        InboxTx::Sqlite(t) => sqlx::query(sql)
            .bind(id)
            .execute(&mut **t)
            .await?
            .rows_affected(),
    };
    Ok(n == 1)
}

/// Inside the transaction of its message's effect: resolves row `id` as
/// `applied` or `duplicate`.
pub async fn resolve_in(
    tx: &mut InboxTx,
    id: i64,
    resolution: &str,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    tx.as_host().await?;
    let sql = "UPDATE consumer_dead_letters SET resolved_at = $2, resolution = $3 WHERE id = $1";
    match tx {
        InboxTx::Postgres(t) => {
            sqlx::query(sql)
                .bind(id)
                .bind(StoredTime(now))
                .bind(resolution)
                .execute(&mut **t)
                .await?;
        }
        InboxTx::Sqlite(t) => {
            sqlx::query(sql)
                .bind(id)
                .bind(StoredTime(now))
                .bind(resolution)
                .execute(&mut **t)
                .await?;
        }
    };
    Ok(())
}

/// A row that failed again when applied becomes its key's dead letter
/// (again): why, the version that failed, the attempts added, and the
/// fix-forward choice cleared, so an operator chooses again.
pub async fn failed_again(
    db: &Db,
    id: i64,
    error: &str,
    handler: &str,
    attempts: u32,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    let sql = "UPDATE consumer_dead_letters
                  SET state = 'dead', error = $2, handler = $3,
                      attempts = attempts + CAST($4 AS integer), dead_at = $5, redrive_with = NULL
                WHERE id = $1 AND resolved_at IS NULL";
    let error = crate::store::truncate(error, 2000);
    on_pool!(db, |p| sqlx::query(sql)
        .bind(id)
        .bind(&error)
        .bind(handler)
        .bind(attempts as i64)
        .bind(StoredTime(now))
        .execute(p)
        .await
        .map(|_| ())?);
    Ok(())
}

/// Which rows an operator's redrive applies to.
#[derive(Debug, Clone, Copy)]
pub enum Selection<'a> {
    Id(i64),
    Key(&'a [u8]),
    All,
}

/// Lists `consumer`'s unresolved rows (dead, parked, redriving), oldest
/// first, optionally of one key; with `resolved`, the resolved ones too.
pub async fn list(
    db: &Db,
    consumer: &str,
    key: Option<&[u8]>,
    resolved: bool,
    limit: i64,
) -> Result<Vec<ConsumerDeadLetter>, sqlx::Error> {
    let sql = format!(
        "SELECT {cols} FROM consumer_dead_letters d
          WHERE d.consumer = $1 AND ($2 OR d.resolved_at IS NULL)
            AND (CAST($3 AS {bytes}) IS NULL OR d.message_key = $3)
          ORDER BY d.id
          LIMIT $4",
        cols = columns(db, false),
        bytes = bytes_type(db),
    );
    on_pool!(db, |p| {
        let rows = sqlx::query(&sql)
            .bind(consumer)
            .bind(resolved)
            .bind(key)
            .bind(limit)
            .fetch_all(p)
            .await?;
        rows.iter().map(decode).collect()
    })
}

fn bytes_type(db: &Db) -> &'static str {
    match db {
        Db::Postgres(_) => "bytea",
        Db::Sqlite(_) => "blob",
    }
}

/// One row of `consumer` in full (payload and headers), resolved or not.
pub async fn get(
    db: &Db,
    consumer: &str,
    id: i64,
) -> Result<Option<ConsumerDeadLetter>, sqlx::Error> {
    let sql = format!(
        "SELECT {cols} FROM consumer_dead_letters d WHERE d.consumer = $1 AND d.id = $2",
        cols = columns(db, true)
    );
    on_pool!(db, |p| {
        match sqlx::query(&sql)
            .bind(consumer)
            .bind(id)
            .fetch_optional(p)
            .await?
        {
            Some(r) => decode(&r).map(Some),
            None => Ok(None),
        }
    })
}

/// Releases `consumer`'s selected dead rows for the running consumer to
/// apply, through `with` (NAME@VERSION) when given; returns how many. Only
/// `dead` rows are released: parked ones follow their key's dead letter.
/// One transaction: a release killed before its commit released nothing.
pub async fn redrive(
    db: &Db,
    consumer: &str,
    selection: Selection<'_>,
    with: Option<&str>,
    faults: &crate::fault::Faults,
) -> Result<u64, RedriveError> {
    let (id, key, all) = match selection {
        Selection::Id(id) => (Some(id), None, false),
        Selection::Key(k) => (None, Some(k), false),
        Selection::All => (None, None, true),
    };
    let sql = format!(
        "UPDATE consumer_dead_letters SET state = 'redrive', redrive_with = $5
          WHERE consumer = $1 AND resolved_at IS NULL AND state = 'dead'
            AND ($4 OR CAST($2 AS bigint) = id OR CAST($3 AS {bytes}) = message_key)",
        bytes = bytes_type(db)
    );
    let point = crate::fault::FaultPoint::RedriveReleaseBeforeCommit;
    let n = on_pool!(db, |p| {
        let mut tx = p.begin().await?;
        let n = sqlx::query(&sql)
            .bind(consumer)
            .bind(id)
            .bind(key)
            .bind(all)
            .bind(with)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        faults.check(point).await?;
        tx.commit().await?;
        n
    });
    Ok(n)
}

#[derive(Debug, thiserror::Error)]
pub enum RedriveError {
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Fault(#[from] crate::fault::InjectedFault),
}

/// Resolves dead row `id` of `consumer` as discarded, with `reason`; the
/// messages parked behind it are then applied in order. False when `id` is
/// not an unresolved dead (or redriving) row of that consumer.
pub async fn discard(
    db: &Db,
    consumer: &str,
    id: i64,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let sql = "UPDATE consumer_dead_letters
                  SET resolved_at = $4, resolution = 'discarded', resolve_reason = $3
                WHERE consumer = $1 AND id = $2 AND resolved_at IS NULL AND state <> 'parked'";
    let n = on_pool!(db, |p| sqlx::query(sql)
        .bind(consumer)
        .bind(id)
        .bind(reason)
        .bind(StoredTime(now))
        .execute(p)
        .await?
        .rows_affected());
    Ok(n > 0)
}

/// How many unresolved rows of `consumer` and `key` are parked (waiting
/// behind a dead letter).
pub async fn parked_behind(db: &Db, consumer: &str, key: &[u8]) -> Result<i64, sqlx::Error> {
    let sql = "SELECT count(*) FROM consumer_dead_letters
                WHERE consumer = $1 AND message_key = $2 AND resolved_at IS NULL AND state = 'parked'";
    on_pool!(db, |p| sqlx::query_scalar(sql)
        .bind(consumer)
        .bind(key)
        .fetch_one(p)
        .await)
}

/// The unresolved row holding `key` back first, if any: the dead letter a
/// parked message waits behind.
pub async fn head_of_key(db: &Db, consumer: &str, key: &[u8]) -> Result<Option<i64>, sqlx::Error> {
    let sql = "SELECT min(id) FROM consumer_dead_letters
                WHERE consumer = $1 AND message_key = $2 AND resolved_at IS NULL AND holds_key";
    on_pool!(db, |p| sqlx::query_scalar(sql)
        .bind(consumer)
        .bind(key)
        .fetch_one(p)
        .await)
}

/// Per consumer: dead letters waiting, parked keys and messages, and since
/// when the oldest key has been held back.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConsumerDeadSummary {
    pub consumer: String,
    /// Unresolved rows that are dead (waiting for an operator).
    pub dead: i64,
    pub parked_keys: i64,
    pub parked_messages: i64,
    pub oldest_parked_at: Option<DateTime<Utc>>,
}

pub async fn consumer_dead_summary(db: &Db) -> Result<Vec<ConsumerDeadSummary>, sqlx::Error> {
    let sql = format!(
        "SELECT d.consumer,
                CAST(sum(CASE WHEN d.state = 'dead' THEN 1 ELSE 0 END) AS bigint),
                CAST(count(DISTINCT CASE WHEN d.holds_key THEN d.message_key END) AS bigint),
                CAST(sum(CASE WHEN d.state = 'parked' THEN 1 ELSE 0 END) AS bigint),
                min(CASE WHEN d.holds_key THEN {dead} END)
           FROM consumer_dead_letters d
          WHERE d.resolved_at IS NULL
          GROUP BY d.consumer
          ORDER BY d.consumer",
        dead = db.epoch_micros("d.dead_at"),
    );
    on_pool!(db, |p| {
        let rows = sqlx::query(&sql).fetch_all(p).await?;
        rows.iter()
            .map(|r| {
                Ok(ConsumerDeadSummary {
                    consumer: r.try_get(0)?,
                    dead: r.try_get(1)?,
                    parked_keys: r.try_get(2)?,
                    parked_messages: r.try_get(3)?,
                    oldest_parked_at: r
                        .try_get::<Option<i64>, _>(4)?
                        .map(crate::store::outbox::sqlite_claim::from_micros),
                })
            })
            .collect()
    })
}
