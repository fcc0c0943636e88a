//! The WAL relay's start-up checks: each problem with the server, the role,
//! the slot or the publication is an error naming what to change, and
//! nothing is half made. (Readers, hand-offs and crashes: `relay.rs`.)

use outboxd::config::{Config, WalSection};
use outboxd::store::Db;
use outboxd::store::outbox::wal::{self, WalSetupError};

use crate::support::TestDb;

fn wal_section(slot: &str) -> WalSection {
    WalSection {
        slot: slot.to_string(),
        ..WalSection::default()
    }
}

/// The slot of a test: named like its database, dropped at the end.
async fn slot_of(t: &TestDb) -> String {
    t.url.rsplit('/').next().expect("database name").to_string()
}

#[tokio::test]
async fn wal_setup_creates_the_publication_and_slot_once_and_checks_them_after() {
    let t = TestDb::postgres().await;
    let slot = slot_of(&t).await;
    let w = wal_section(&slot);
    let first = wal::ensure(&t.db, &w).await.expect("create");
    assert!(first.created_publication && first.created_slot, "{first:?}");
    let second = wal::ensure(&t.db, &w).await.expect("check");
    assert!(
        !second.created_publication && !second.created_slot,
        "{second:?}"
    );
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}' AND plugin = 'pgoutput'"
        ))
        .await,
        1
    );
    // Inserts only: the relay's own marks and retention's deletes must not
    // stream back.
    assert_eq!(
        t.count(
            "SELECT count(*) FROM pg_publication WHERE pubname = 'outboxd_outbox' \
             AND pubinsert AND NOT pubupdate AND NOT pubdelete AND NOT pubtruncate"
        )
        .await,
        1
    );
    wal::drop_slot(&t.db, &slot).await.expect("drop the slot");
}

#[tokio::test]
async fn wal_setup_refuses_a_publication_that_streams_updates_and_names_the_fix() {
    let t = TestDb::postgres().await;
    let slot = slot_of(&t).await;
    t.exec("CREATE PUBLICATION outboxd_outbox FOR TABLE outboxd.outbox")
        .await;
    let e = wal::ensure(&t.db, &wal_section(&slot))
        .await
        .expect_err("publishes updates and deletes");
    let text = e.to_string();
    assert!(
        matches!(e, WalSetupError::PublicationMismatch { .. })
            && text.contains("relay.wal.publication")
            && text.contains("update=true")
            && text.contains("DROP PUBLICATION outboxd_outbox"),
        "{text}"
    );
    // Nothing was half made: no slot.
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'"
        ))
        .await,
        0
    );
}

#[tokio::test]
async fn wal_setup_refuses_a_slot_of_another_database() {
    let a = TestDb::postgres().await;
    let b = TestDb::postgres().await;
    let slot = slot_of(&a).await;
    wal::ensure(&a.db, &wal_section(&slot))
        .await
        .expect("a's slot");
    let e = wal::ensure(&b.db, &wal_section(&slot))
        .await
        .expect_err("the slot is a's");
    wal::drop_slot(&a.db, &slot).await.expect("drop the slot");
    let text = e.to_string();
    assert!(
        text.contains("relay.wal.slot") && text.contains("give this database its own"),
        "{text}"
    );
}

#[tokio::test]
async fn wal_setup_refuses_a_role_without_replication_and_names_the_grant() {
    let t = TestDb::postgres().await;
    let role = format!("{}_norepl", slot_of(&t).await);
    t.exec(&format!("CREATE ROLE {role} LOGIN")).await;
    t.exec(&format!("GRANT ALL ON SCHEMA outboxd TO {role}"))
        .await;
    let url = t.url.replacen("postgres@", &format!("{role}@"), 1);
    let db = Db::connect(&url, 2).await.expect("connect as the role");
    let e = wal::ensure(&db, &wal_section(&role))
        .await
        .expect_err("no REPLICATION");
    db.close().await;
    let text = e.to_string();
    assert!(
        text.contains(&format!("ALTER ROLE \"{role}\" REPLICATION")),
        "{text}"
    );
}

#[test]
fn wal_source_on_sqlite_is_a_config_error_naming_the_key() {
    let e = Config::from_toml(
        "t.toml",
        "[database]\nurl = \"sqlite://outbox.db\"\n[relay]\nsource = \"wal\"\n",
        Vec::new(),
    )
    .expect_err("SQLite has no WAL stream");
    let text = e.to_string();
    assert!(
        text.contains("relay.source") && text.contains("\"poll\""),
        "{text}"
    );
}

#[test]
fn a_bad_slot_name_is_a_config_error() {
    let e = Config::from_toml(
        "t.toml",
        "[database]\nurl = \"postgres://u@h/d\"\n[relay]\nsource = \"wal\"\n[relay.wal]\nslot = \"Bad-Name\"\n",
        Vec::new(),
    )
    .expect_err("not an identifier");
    let text = e.to_string();
    assert!(
        text.contains("relay.wal.slot") && text.contains("lowercase letters"),
        "{text}"
    );
}
