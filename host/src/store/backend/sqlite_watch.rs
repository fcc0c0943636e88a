//! Change notification for a SQLite file, the embedded default's stand-in
//! for Postgres's LISTEN/NOTIFY: relays and consumers wait on a
//! [`watch::Receiver`] that ticks when the outbox or the embedded transport
//! may have new rows, instead of polling the database.
//!
//! Two sources feed it:
//! - commits in this process: every connection that [`Db::connect`] opens
//!   gets an update hook and a commit hook, and a commit that inserted into
//!   `outbox` or `transport_messages` wakes the watcher at once;
//! - commits by other processes: a thread blocks on inotify (Linux) for
//!   writes to the database and its WAL, so an idle host never wakes;
//!   without inotify it `stat`s the files every [`FILE_CHECK_IDLE`], or
//!   [`FILE_CHECK_BUSY`] while they keep changing.
//!
//! SQLite's commit hook runs before the commit is durable, so the watcher
//! ticks only once `PRAGMA data_version` (on a connection of its own) shows
//! that another connection committed: a woken reader always sees the rows.
//!
//! The same per-file state runs the WAL checkpoints: the pool's connections
//! have `wal_autocheckpoint = 0`, and a task of its own checkpoints every
//! [`CHECKPOINT_EVERY`]. Otherwise whichever commit crosses the threshold
//! (1,000 pages) also writes the pages back and fsyncs the database, and
//! on a busy disk that one relay, consumer or producer commit stalls for
//! as long as the fsync takes.
//!
//! [`Db::connect`]: crate::store::Db::connect

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, SystemTime};

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteOperation, SqlitePool};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{Notify, watch};

/// How often the file thread looks for commits made by other processes
/// while the file is busy (it changed within [`BUSY_FOR`])...
pub const FILE_CHECK_BUSY: Duration = Duration::from_millis(1);
/// ...and while it is quiet, which is what an idle host pays for.
pub const FILE_CHECK_IDLE: Duration = Duration::from_millis(4);
/// How long the file counts as busy after its last change.
const BUSY_FOR: Duration = Duration::from_secs(1);

/// How long the watcher waits for a hooked commit to become visible before
/// it gives up on it (the commit failed, or was rolled back by a hook).
const COMMIT_VISIBLE_WITHIN: Duration = Duration::from_millis(100);

/// How often the WAL is checkpointed (passively: never waiting for
/// readers or writers).
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// The tables whose inserts readers wait for.
const WATCHED_TABLES: [&str; 2] = ["outbox", "transport_messages"];

/// One per database file in this process, shared by every pool on it.
#[derive(Debug)]
pub struct CommitSignal {
    path: PathBuf,
    ticks: watch::Sender<u64>,
    /// A commit of a watched table is under way (commit hook) or the files
    /// changed (file thread).
    hint: Notify,
    started: AtomicBool,
    checkpointing: AtomicBool,
}

fn registry() -> &'static Mutex<HashMap<PathBuf, Weak<CommitSignal>>> {
    static SIGNALS: OnceLock<Mutex<HashMap<PathBuf, Weak<CommitSignal>>>> = OnceLock::new();
    SIGNALS.get_or_init(Default::default)
}

/// The signal of the file `opts` opens, or `None` for an in-memory
/// database (nothing outside this pool can write to it).
pub fn signal_for(opts: &SqliteConnectOptions) -> Option<Arc<CommitSignal>> {
    let file = opts.get_filename();
    if file.as_os_str().is_empty() || file == Path::new(":memory:") {
        return None;
    }
    let path = std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf());
    let mut map = registry().lock().unwrap_or_else(|p| p.into_inner());
    map.retain(|_, w| w.strong_count() > 0);
    if let Some(s) = map.get(&path).and_then(Weak::upgrade) {
        return Some(s);
    }
    let signal = Arc::new(CommitSignal {
        path: path.clone(),
        ticks: watch::channel(0).0,
        hint: Notify::new(),
        started: AtomicBool::new(false),
        checkpointing: AtomicBool::new(false),
    });
    map.insert(path, Arc::downgrade(&signal));
    Some(signal)
}

/// Starts the file's checkpointer (once per file and process) and returns
/// whether it runs, in which case the pool's connections leave checkpoints
/// to it (`wal_autocheckpoint = 0`).
pub fn start_checkpointer(signal: &Arc<CommitSignal>, opts: &SqliteConnectOptions) -> bool {
    if signal.checkpointing.swap(true, Ordering::AcqRel) {
        return true;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        signal.checkpointing.store(false, Ordering::Release);
        return false;
    };
    runtime.spawn(checkpoint(Arc::downgrade(signal), opts.clone()));
    true
}

/// Checkpoints the WAL until the last pool on the file is gone. A failed
/// checkpoint is retried at the next round, with a fresh connection.
async fn checkpoint(signal: Weak<CommitSignal>, opts: SqliteConnectOptions) {
    /// Clears `checkpointing` however the task ends, so that the next pool
    /// on the file starts a new checkpointer.
    struct Checkpointing(Weak<CommitSignal>);
    impl Drop for Checkpointing {
        fn drop(&mut self) {
            if let Some(s) = self.0.upgrade() {
                s.checkpointing.store(false, Ordering::Release);
            }
        }
    }
    let _running = Checkpointing(signal.clone());
    let mut conn: Option<SqliteConnection> = None;
    let mut warned = false;
    loop {
        tokio::time::sleep(CHECKPOINT_EVERY).await;
        let Some(s) = signal.upgrade() else { break };
        drop(s);
        if conn.is_none() {
            conn = opts.connect().await.ok();
        }
        let Some(c) = conn.as_mut() else { continue };
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .execute(&mut *c)
            .await
        {
            if !warned {
                tracing::warn!(error = %e, "SQLite WAL checkpoint failed; retrying");
                warned = true;
            }
            conn = None;
        } else {
            warned = false;
        }
    }
    if let Some(c) = conn {
        let _ = c.close().await;
    }
}

/// Installs the hooks that report this connection's commits of watched
/// tables to `signal`. Called for every connection of a pool.
pub async fn install_hooks(
    conn: &mut SqliteConnection,
    signal: Arc<CommitSignal>,
) -> Result<(), sqlx::Error> {
    let inserted = Arc::new(AtomicBool::new(false));
    let mut handle = conn.lock_handle().await?;
    let on_update = inserted.clone();
    handle.set_update_hook(move |change| {
        if matches!(change.operation, SqliteOperation::Insert)
            && WATCHED_TABLES.contains(&change.table)
        {
            on_update.store(true, Ordering::Relaxed);
        }
    });
    let on_commit = inserted.clone();
    let weak = Arc::downgrade(&signal);
    handle.set_commit_hook(move || {
        if on_commit.swap(false, Ordering::Relaxed)
            && let Some(signal) = weak.upgrade()
        {
            signal.hint.notify_one();
        }
        true
    });
    handle.set_rollback_hook(move || inserted.store(false, Ordering::Relaxed));
    Ok(())
}

/// A receiver that ticks after a commit that may have added outbox or
/// transport rows, by this process or another. The watcher starts on the
/// first call for a file and stops when the last receiver is gone. `None`
/// for an in-memory database.
pub async fn subscribe(pool: &SqlitePool) -> Option<watch::Receiver<u64>> {
    let opts = pool.connect_options();
    let signal = signal_for(&opts)?;
    let rx = signal.ticks.subscribe();
    if !signal.started.swap(true, Ordering::AcqRel) {
        match (*opts).clone().connect().await {
            Ok(conn) => {
                spawn_file_thread(&signal);
                tokio::spawn(watch_commits(signal.clone(), conn));
            }
            Err(e) => {
                signal.started.store(false, Ordering::Release);
                tracing::warn!(error = %e, "cannot open the SQLite change watcher's connection; relays and consumers poll instead");
                return None;
            }
        }
    }
    Some(rx)
}

/// Clears `started` when the watcher ends, however it ends (its runtime
/// may shut down under it), so the next subscriber starts a new one.
struct Running(Arc<CommitSignal>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.started.store(false, Ordering::Release);
    }
}

/// Ticks the receivers after each commit that became visible, until the
/// last receiver is gone.
async fn watch_commits(signal: Arc<CommitSignal>, mut conn: SqliteConnection) {
    let running = Running(signal);
    let s = &running.0;
    let mut seen = data_version(&mut conn).await.unwrap_or(0);
    loop {
        tokio::select! {
            _ = s.hint.notified() => {}
            _ = s.ticks.closed() => break,
        }
        // The hooked commit (or the other process's) may still be under
        // way: wait until this connection can see it.
        let deadline = tokio::time::Instant::now() + COMMIT_VISIBLE_WITHIN;
        let mut tries = 0u32;
        loop {
            match data_version(&mut conn).await {
                Ok(v) if v != seen => {
                    seen = v;
                    s.ticks.send_modify(|n| *n = n.wrapping_add(1));
                    break;
                }
                Ok(_) if tokio::time::Instant::now() < deadline => {}
                Ok(_) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "SQLite change watcher: data_version failed");
                    break;
                }
            }
            tries += 1;
            // A commit usually lands within a few queries; an fsync (FULL)
            // takes milliseconds, so after that wait a tick at a time.
            if tries < 20 {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
    let _ = conn.close().await;
}

async fn data_version(conn: &mut SqliteConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("PRAGMA data_version")
        .fetch_one(conn)
        .await
}

/// What a `stat` of the database and its WAL says; a commit by any process
/// changes it.
fn file_state(path: &Path) -> [(u64, Option<SystemTime>); 2] {
    let look = |p: &Path| match std::fs::metadata(p) {
        Ok(m) => (m.len(), m.modified().ok()),
        Err(_) => (0, None),
    };
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    [look(path), look(Path::new(&wal))]
}

fn spawn_file_thread(signal: &Arc<CommitSignal>) {
    let weak = Arc::downgrade(signal);
    let path = signal.path.clone();
    let spawned = std::thread::Builder::new()
        .name("outboxd-sqlite-watch".into())
        .spawn(move || {
            #[cfg(target_os = "linux")]
            match notify_on_writes(&weak, &path) {
                Ok(()) => return,
                Err(e) => tracing::debug!(error = %e, "inotify unavailable; watching the SQLite files by stat"),
            }
            poll_files(&weak, &path);
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the SQLite file watcher: commits by other processes are seen at the next poll");
    }
}

/// Linux: blocks on inotify for writes to the database or its WAL, so an
/// idle host does not wake at all. Returns when the file's last pool and
/// receiver are gone (noticed at the next write), or fails at once when
/// inotify is unavailable.
#[cfg(target_os = "linux")]
fn notify_on_writes(signal: &Weak<CommitSignal>, path: &Path) -> std::io::Result<()> {
    use rustix::fs::inotify;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let names: Vec<std::ffi::OsString> = {
        let file = path.file_name().unwrap_or_default().to_owned();
        let mut wal = file.clone();
        wal.push("-wal");
        vec![file, wal]
    };
    let fd = inotify::init(inotify::CreateFlags::CLOEXEC)?;
    inotify::add_watch(
        &fd,
        dir,
        inotify::WatchFlags::MODIFY | inotify::WatchFlags::CREATE | inotify::WatchFlags::MOVED_TO,
    )?;
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    let mut events = inotify::Reader::new(&fd, &mut buf);
    loop {
        let event = events.next()?;
        let ours = event.file_name().is_some_and(|n| {
            use std::os::unix::ffi::OsStrExt;
            names.iter().any(|ours| ours.as_bytes() == n.to_bytes())
        });
        let Some(s) = signal.upgrade() else {
            return Ok(());
        };
        if s.ticks.receiver_count() == 0 {
            return Ok(());
        }
        if ours {
            s.hint.notify_one();
        }
    }
}

/// Elsewhere, or without inotify: `stat` the files, every
/// [`FILE_CHECK_BUSY`] while they keep changing and every
/// [`FILE_CHECK_IDLE`] once they are quiet.
fn poll_files(signal: &Weak<CommitSignal>, path: &Path) {
    let mut last = file_state(path);
    let mut changed_at = std::time::Instant::now();
    loop {
        std::thread::sleep(if changed_at.elapsed() < BUSY_FOR {
            FILE_CHECK_BUSY
        } else {
            FILE_CHECK_IDLE
        });
        let Some(s) = signal.upgrade() else { return };
        if s.ticks.receiver_count() == 0 {
            return;
        }
        let now = file_state(path);
        if now != last {
            last = now;
            changed_at = std::time::Instant::now();
            s.hint.notify_one();
        }
    }
}
