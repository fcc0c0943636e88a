//! The WAL relay's slot as operators see it: `store::wal_status` reads
//! `pg_replication_slots`, and the admin sampler turns it into
//! `outboxd_relay_wal_retained_bytes`. The slot is named after the test
//! database, so tests never share one, and each test drops it.

use std::sync::Arc;
use std::time::Duration;

use outboxd::admin::{History, SlotSampler, run_sampler};
use outboxd::metrics::Metrics;
use outboxd::store::outbox::wal_status::slot_status;

use crate::support::db::SlotGuard;
use crate::support::{TestDb, eventually};

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
    let slot = t.database_name().to_string();
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
    let slot = t.database_name().to_string();
    // Drops the slot if the test fails before it does.
    let _slot = SlotGuard { slot: slot.clone() };
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
    let value = eventually(
        Duration::from_secs(2),
        "the sampler exported the gauge",
        async || {
            metrics
                .render(None)
                .lines()
                .find_map(|l| l.strip_prefix(needle.as_str()))
                .and_then(|v| v.parse::<i64>().ok())
        },
    )
    .await;
    let _ = stop_tx.send(true);
    let _ = sampler.await;
    t.exec(&format!("SELECT pg_drop_replication_slot('{slot}')"))
        .await;
    assert!(
        value >= 1024 * 1024,
        "1 MiB written since the slot was made, the gauge says {value}"
    );
}

/// Runs the `outboxd` binary on the test database with `env` on top.
async fn outboxd(t: &TestDb, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_outboxd"));
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("OUTBOXD__DATABASE__URL", &t.url);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().await.expect("run outboxd");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn outboxd_stats_shows_the_slot_in_wal_mode_only() {
    let t = TestDb::postgres().await;
    let slot = t.database_name().to_string();
    let wal = [
        ("OUTBOXD__RELAY__SOURCE", "wal"),
        ("OUTBOXD__RELAY__WAL__SLOT", slot.as_str()),
    ];
    let (ok, text) = outboxd(&t, &["migrate"], &wal).await;
    assert!(ok, "migrate in WAL mode creates the slot:\n{text}");
    let (ok, table) = outboxd(&t, &["stats"], &wal).await;
    let (ok_json, json) = outboxd(&t, &["stats", "--json"], &wal).await;
    let (ok_poll, polling) = outboxd(&t, &["stats"], &[]).await;
    outboxd::store::outbox::wal::drop_slot(&t.db, &slot)
        .await
        .expect("drop the test's slot");
    assert!(ok && ok_json && ok_poll, "{table}\n{json}\n{polling}");
    assert!(
        table.contains(&format!("wal slot              {slot}\n")),
        "{table}"
    );
    assert!(
        table.contains("reader pid          none: no process reads the slot"),
        "{table}"
    );
    assert!(table.contains("retained WAL        "), "{table}");
    assert!(table.contains("confirmed flush LSN "), "{table}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("stats --json is JSON");
    assert_eq!(v["wal_slot"]["slot"], slot.as_str(), "{json}");
    assert!(v["wal_slot"]["active_pid"].is_null(), "{json}");
    assert!(v["wal_slot"]["retained_bytes"].as_i64().is_some(), "{json}");
    assert!(
        !polling.contains("wal slot"),
        "a polling config has no slot to show:\n{polling}"
    );
}
