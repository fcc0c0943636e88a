//! The WAL relay's slot as operators see it: `store::wal_status` reads
//! `pg_replication_slots`, and the admin sampler turns it into
//! `outboxd_relay_wal_retained_bytes`. The slot is named after the test
//! database, so tests never share one, and each test drops it.

use std::sync::Arc;
use std::time::Duration;

use outboxd::admin::{History, SlotSampler, run_sampler};
use outboxd::metrics::Metrics;
use outboxd::store::wal_status::slot_status;

use crate::support::TestDb;

/// The test database's name: its slot's name.
fn slot_of(t: &TestDb) -> String {
    t.url.rsplit('/').next().expect("a database in the URL").to_string()
}

/// Writes about `kib` KiB of WAL into the test database.
async fn write_wal(t: &TestDb, kib: i64) {
    t.exec(&format!(
        "CREATE TABLE IF NOT EXISTS wal_filler (pad text);
         INSERT INTO wal_filler SELECT repeat('x', 1000) FROM generate_series(1, {kib})"
    ))
    .await;
}

#[tokio::test]
async fn slot_status_reports_retained_wal_reader_and_confirmed_position() {
    let t = TestDb::postgres().await;
    let slot = slot_of(&t);
    assert_eq!(
        slot_status(&t.db, &slot).await.expect("status"),
        None,
        "no slot yet"
    );
    t.exec(&format!(
        "SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"
    ))
    .await;
    let before = slot_status(&t.db, &slot)
        .await
        .expect("status")
        .expect("the slot exists now");
    assert_eq!(before.slot, slot);
    assert_eq!(before.database.as_deref(), Some(slot.as_str()));
    assert_eq!(before.active_pid, None, "nobody reads the slot");
    assert!(before.confirmed_flush_lsn.is_some());
    // Nobody confirms: everything written from now on stays retained.
    write_wal(&t, 2048).await;
    let after = slot_status(&t.db, &slot)
        .await
        .expect("status")
        .expect("slot");
    let grew = after.retained_bytes - before.retained_bytes;
    t.exec(&format!("SELECT pg_drop_replication_slot('{slot}')"))
        .await;
    assert!(
        grew >= 2 * 1024 * 1024,
        "2 MiB written, retained grew by {grew} bytes ({before:?} -> {after:?})"
    );
    assert_eq!(after.confirmed_flush_lsn, before.confirmed_flush_lsn);
    assert_eq!(slot_status(&t.db, &slot).await.expect("status"), None);
}

#[tokio::test]
async fn the_admin_sampler_exports_the_slots_retained_bytes() {
    let t = TestDb::postgres().await;
    let slot = slot_of(&t);
    t.exec(&format!(
        "SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"
    ))
    .await;
    write_wal(&t, 1024).await;
    let metrics = Arc::new(Metrics::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let sampler = tokio::spawn(run_sampler(
        t.store(),
        Arc::new(History::default()),
        metrics.clone(),
        Duration::from_millis(50),
        Some(SlotSampler {
            db: t.db.clone(),
            slot: slot.clone(),
        }),
        stop_rx,
    ));
    let needle = format!("outboxd_relay_wal_retained_bytes{{slot=\"{slot}\"}} ");
    let mut value = None;
    for _ in 0..100 {
        let text = metrics.render(None);
        value = text
            .lines()
            .find_map(|l| l.strip_prefix(needle.as_str()))
            .and_then(|v| v.parse::<i64>().ok());
        if value.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_tx.send(true);
    let _ = sampler.await;
    t.exec(&format!("SELECT pg_drop_replication_slot('{slot}')"))
        .await;
    let value = value.expect("the sampler exported the gauge within 2 s");
    assert!(
        value >= 1024 * 1024,
        "1 MiB written since the slot was made, the gauge says {value}"
    );
}
