//! How a SQLite connection waits for the write lock that another connection
//! holds. SQLite's own busy handler (`busy_timeout`) sleeps 1, 2, 5, 10 …
//! then 100 ms between tries, so a writer that arrives just after another
//! one often waits tens of milliseconds for a lock held for a few hundred
//! microseconds. Ours looks again after 50 µs at first and backs off to
//! 1 ms, within the same 30 s budget. It runs on the thread sqlx gives the
//! connection, never on an async worker.

use std::ffi::{c_int, c_void};
use std::time::Duration;

use sqlx::sqlite::SqliteConnection;

/// The total wait before a write gives up with `database is locked`.
pub const BUSY_BUDGET: Duration = Duration::from_secs(30);

/// The pause before try `tries` (0-based), and whether to try at all.
fn pause_before(tries: c_int) -> Option<Duration> {
    const QUICK: c_int = 16;
    const MEDIUM: c_int = 100;
    let quick = Duration::from_micros(50);
    let medium = Duration::from_micros(250);
    let slow = Duration::from_millis(1);
    let spent_fast = quick * QUICK as u32 + medium * (MEDIUM - QUICK) as u32;
    let max_tries = MEDIUM + ((BUSY_BUDGET - spent_fast).as_millis() as c_int);
    match tries {
        t if t < 0 || t >= max_tries => None,
        t if t < QUICK => Some(quick),
        t if t < MEDIUM => Some(medium),
        _ => Some(slow),
    }
}

extern "C" fn wait_for_lock(_data: *mut c_void, tries: c_int) -> c_int {
    match pause_before(tries) {
        Some(pause) => {
            std::thread::sleep(pause);
            1
        }
        None => 0,
    }
}

/// Replaces the connection's busy handler with [`wait_for_lock`].
#[allow(unsafe_code)] // The one SQLite call sqlx does not wrap; see SAFETY.
pub async fn install(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr();
    // SAFETY: `db` is the open connection that `handle` keeps locked for the
    // duration of this call, so no other thread uses it meanwhile. The
    // callback is a plain function with no captured state (the user-data
    // pointer is null), so it cannot outlive anything it points to, and it
    // never calls back into SQLite.
    let rc = unsafe {
        libsqlite3_sys::sqlite3_busy_handler(db, Some(wait_for_lock), std::ptr::null_mut())
    };
    if rc == libsqlite3_sys::SQLITE_OK {
        Ok(())
    } else {
        Err(sqlx::Error::Protocol(format!(
            "sqlite3_busy_handler failed with code {rc}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::{BUSY_BUDGET, pause_before};

    #[test]
    fn the_pauses_add_up_to_the_budget_and_then_stop() {
        let mut total = std::time::Duration::ZERO;
        let mut tries = 0;
        while let Some(p) = pause_before(tries) {
            total += p;
            tries += 1;
        }
        assert!(
            total >= BUSY_BUDGET - std::time::Duration::from_millis(2),
            "{total:?}"
        );
        assert!(
            total <= BUSY_BUDGET + std::time::Duration::from_millis(2),
            "{total:?}"
        );
        assert_eq!(pause_before(0), Some(std::time::Duration::from_micros(50)));
        assert_eq!(pause_before(-1), None);
    }
}
