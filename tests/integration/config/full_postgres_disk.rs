//! A full Postgres disk, for real: the outbox table moves to a tablespace on
//! a 4 MiB tmpfs, a filler file takes the rest of it, and Postgres fails to
//! extend the table with `No space left on device` (SQLSTATE 53100).
//!
//! This needs what the test machines have: root (to mount the tmpfs) and the
//! Postgres server on this machine (a tablespace is a directory of the
//! server's). Without them the test fails and says so; it is never skipped.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use outboxd::NewEvent;
use outboxd::relay::StepOutcome;
use outboxd::store::{Db, EnqueueError};
use serde_json::json;

use crate::support::db::try_enqueue_on;
use crate::support::{ScriptedPublisher, TestDb, pg_admin_url};

const FULL_FIX: &str = "the database is full: free disk space";

/// A small tmpfs for a tablespace. It is unmounted when dropped only once
/// the tablespace is gone ([`SmallDisk::released`]): unmounting it under a
/// live tablespace would make Postgres's next checkpoint fail to fsync the
/// table's file, and Postgres PANICs on that. A test that fails half-way
/// leaves the tmpfs mounted and the tablespace in place, and
/// `tests/run.sh` drops both at its next start.
struct SmallDisk {
    dir: PathBuf,
    released: bool,
}

impl SmallDisk {
    fn mount(size: &str, owner: u32) -> SmallDisk {
        let dir =
            std::env::temp_dir().join(format!("outboxd-full-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("mkdir for the tmpfs");
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(&dir)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test mounts a {size} tmpfs for a Postgres tablespace and needs root \
             (CAP_SYS_ADMIN) for that: mount said {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        std::os::unix::fs::chown(&dir, Some(owner), None)
            .expect("chown the tmpfs to the server's user");
        SmallDisk {
            dir,
            released: false,
        }
    }

    /// Writes zeros into `filler` until the filesystem is full.
    fn fill(&self) -> u64 {
        let mut f = std::fs::File::create(self.filler()).expect("create the filler");
        let block = vec![0u8; 64 * 1024];
        let mut written = 0u64;
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        written
    }

    fn filler(&self) -> PathBuf {
        self.dir.join("filler")
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        if !self.released {
            eprintln!(
                "leaving the tmpfs at {} mounted: its tablespace may still be in use \
                 (tests/run.sh removes both when it next starts)",
                self.dir.display()
            );
            return;
        }
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The uid the Postgres server runs as: the owner of its data directory,
/// which must be on this machine.
async fn server_uid(admin: &sqlx::PgPool) -> u32 {
    let data: String = sqlx::query_scalar("SELECT current_setting('data_directory')")
        .fetch_one(admin)
        .await
        .expect("read data_directory (the test user must be a superuser)");
    std::fs::metadata(Path::new(&data))
        .unwrap_or_else(|e| {
            panic!(
                "the Postgres server's data directory {data} is not on this machine ({e}); \
                 this test needs a local server (tests/run.sh starts one) to put a tablespace on a small disk"
            )
        })
        .uid()
}

async fn enqueue_big(db: &Db, n: usize) -> Result<uuid::Uuid, EnqueueError> {
    // 16 KiB of hex from random uuids: pglz cannot shrink it much, so each
    // event needs fresh pages.
    let blob: String = (0..512)
        .map(|_| uuid::Uuid::new_v4().simple().to_string())
        .collect();
    let event = NewEvent::new(
        format!("agg-{n}"),
        "order.placed",
        json!({ "n": n, "blob": blob }),
    );
    try_enqueue_on(db, event).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_postgres_disk_refuses_new_events_with_the_fix_and_loses_nothing() {
    let t = TestDb::postgres().await;
    let admin = sqlx::PgPool::connect(&pg_admin_url()).await.expect("admin");
    let mut disk = SmallDisk::mount("4m", server_uid(&admin).await);
    let space = format!("outboxd_full_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(&format!(
        "CREATE TABLESPACE {space} LOCATION '{}'",
        disk.dir.display()
    ))
    .execute(&admin)
    .await
    .expect("CREATE TABLESPACE on the tmpfs");
    t.exec(&format!("ALTER TABLE outbox SET TABLESPACE {space}"))
        .await;

    // Room for a few events, then none.
    for n in 0..3 {
        enqueue_big(&t.db, n)
            .await
            .expect("room for the first events");
    }
    let filled = disk.fill();
    assert!(filled > 0, "the filler took the rest of the tmpfs");

    let mut committed = 3usize;
    let err = loop {
        match enqueue_big(&t.db, committed).await {
            Ok(_) => committed += 1,
            Err(e) => break e,
        }
        assert!(committed < 200, "the outbox kept growing on a full disk");
    };
    assert!(matches!(err, EnqueueError::Database(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(FULL_FIX), "{text}");
    assert!(text.contains("No space left on device"), "{text}");
    assert_eq!(
        t.count("SELECT count(*) FROM outbox").await,
        committed as i64,
        "the refused event left nothing behind; the producer got the error"
    );

    // The relay on the full disk: whatever it could mark is marked, and
    // anything it could not stays pending with the fix, to be retried.
    let broker = ScriptedPublisher::new();
    let relay = t.relay(broker.clone());
    match relay.step().await {
        Ok(StepOutcome::Published(report)) => {
            assert_eq!(report.published + report.retried, committed, "{report:?}")
        }
        Ok(StepOutcome::Idle) => panic!("the relay found nothing to do"),
        Err(e) => assert!(e.to_string().contains(FULL_FIX), "{e}"),
    }

    // Free the space: the producer's retry succeeds and every event is
    // published and marked.
    std::fs::remove_file(disk.filler()).expect("remove the filler");
    enqueue_big(&t.db, committed)
        .await
        .expect("with room again, the producer's retry succeeds");
    committed += 1;
    t.make_all_due().await;
    while let StepOutcome::Published(_) = relay.step().await.expect("step with room") {
        t.make_all_due().await;
    }
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
            .await,
        committed as i64,
        "every committed event is published and marked"
    );
    let sent: std::collections::HashSet<_> = broker.sent().iter().map(|m| m.message_id).collect();
    assert_eq!(sent.len(), committed, "each event reached the broker");

    // The tablespace must be empty before it can go. FORCE: a connection
    // the closed pool is still shutting down must not fail the drop.
    t.db.close().await;
    let name = &t.url[t.url.rfind('/').expect("url") + 1..];
    sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .execute(&admin)
        .await
        .expect("DROP DATABASE");
    sqlx::query(&format!("DROP TABLESPACE {space}"))
        .execute(&admin)
        .await
        .expect("DROP TABLESPACE");
    admin.close().await;
    disk.released = true;
}
