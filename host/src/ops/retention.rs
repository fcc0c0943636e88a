//! Retention: both tables grow without bound otherwise. Deletes run in
//! small batches in a loop, so no statement holds locks for long.
//! Dead rows are never deleted automatically. The statements are the
//! store's (`store/outbox/retention.rs`).

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::config::RetentionConfig;
use crate::store::Db;
use crate::store::outbox::retention::{Sweep, sweep_batch};

/// `[retention]`, a config section, in `outboxd-core`.

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CleanupReport {
    pub outbox_deleted: u64,
    pub payloads_purged: u64,
    pub inbox_deleted: u64,
    pub transport_deleted: u64,
    pub statements: u64,
}

fn days_before(now: DateTime<Utc>, days: f64) -> DateTime<Utc> {
    now - chrono::Duration::milliseconds((days * 86_400_000.0) as i64)
}

/// Runs every retention rule to completion, batch by batch.
pub async fn cleanup(
    db: &Db,
    cfg: &RetentionConfig,
    now: DateTime<Utc>,
) -> Result<CleanupReport, sqlx::Error> {
    let mut report = CleanupReport::default();
    let published_cutoff = days_before(now, cfg.published_days);
    let purge = cfg
        .purge_payload_days
        .map(|days| (Sweep::Payloads, days_before(now, days)));
    let deletes = [
        (Sweep::PublishedEvents, published_cutoff),
        (Sweep::InboxMarks, days_before(now, cfg.inbox_days)),
        (Sweep::TransportMessages, published_cutoff),
    ];
    for (sweep, cutoff) in purge.into_iter().chain(deletes) {
        let n = batched(
            db,
            &mut report.statements,
            sweep,
            cutoff,
            now,
            cfg.batch_size,
        )
        .await?;
        match sweep {
            Sweep::Payloads => report.payloads_purged = n,
            Sweep::PublishedEvents => report.outbox_deleted = n,
            Sweep::InboxMarks => report.inbox_deleted = n,
            Sweep::TransportMessages => report.transport_deleted = n,
        }
    }
    Ok(report)
}

async fn batched(
    db: &Db,
    statements: &mut u64,
    sweep: Sweep,
    cutoff: DateTime<Utc>,
    now: DateTime<Utc>,
    batch: i64,
) -> Result<u64, sqlx::Error> {
    let mut total = 0;
    loop {
        let n = sweep_batch(db, sweep, cutoff, now, batch).await?;
        *statements += 1;
        total += n;
        if n == 0 {
            return Ok(total);
        }
    }
}
