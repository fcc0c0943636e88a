//! The SQLite wall around consumer-plugin SQL: SQLite's own authorizer
//! (`sqlite3_set_authorizer`), a progress-handler deadline and a length
//! limit on every string and blob, all active only while one plugin
//! statement runs on the connection.
//!
//! SQLite calls the authorizer while it prepares a statement, once for
//! every table and column read or written, every function, pragma,
//! ATTACH, transaction or schema change in it, including what views and
//! triggers expand to. Plugin statements are prepared fresh
//! (`persistent(false)`), so each one is checked; the host's own cached
//! statements were prepared while no policy was active and are never
//! re-checked.
//!
//! The callbacks are installed once per connection (in `after_connect`)
//! with a pointer to that connection's [`ConnGuard`], which lives as long
//! as the process: SQLite may call them until the connection closes, and a
//! closed connection's guard is a few dozen bytes. While no policy is set
//! they allow everything and cost one atomic load.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use libsqlite3_sys as ffi;
use outboxd_core::config::TableGrants;
use outboxd_core::sql_gate::{is_allowed_function, is_host_table};
use sqlx::sqlite::SqliteConnection;

/// SQLite's compiled-in maximum string or blob length (SQLITE_MAX_LENGTH),
/// which the host's own statements run under.
const HOST_LENGTH_LIMIT: c_int = 1_000_000_000;
/// Virtual-machine steps between two looks at the deadline.
const PROGRESS_STEPS: c_int = 1_000;

/// What one plugin statement may do.
#[derive(Debug, Clone)]
pub struct PluginPolicy {
    pub consumer: String,
    pub grants: TableGrants,
    pub deadline: Instant,
    /// The largest string or blob the statement may build or bind.
    pub max_value_bytes: u64,
}

#[derive(Default)]
struct ConnGuard {
    active: AtomicBool,
    state: Mutex<GuardState>,
}

#[derive(Default)]
struct GuardState {
    policy: Option<PluginPolicy>,
    /// The statement's future was dropped while the statement may still be
    /// running on sqlx's worker thread: interrupt it, authorize nothing new
    /// under the policy, until [`reset`].
    draining: bool,
    /// The first thing the authorizer or the deadline refused, in words.
    refused: Option<String>,
}

/// Connections left draining; the pool's `before_acquire` resets them.
static DRAINING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Whether any connection may still be draining a dropped plugin statement.
pub fn any_draining() -> bool {
    DRAINING.load(Ordering::Acquire) > 0
}

/// Connection handle address → its guard. Looked up when a plugin
/// statement starts, never by the callbacks (they get the guard itself).
fn guards() -> &'static Mutex<HashMap<usize, &'static ConnGuard>> {
    static GUARDS: OnceLock<Mutex<HashMap<usize, &'static ConnGuard>>> = OnceLock::new();
    GUARDS.get_or_init(Default::default)
}

fn cstr<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: SQLite passes NUL-terminated strings valid for the call.
    #[allow(unsafe_code)]
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// The decision for one authorizer call; `Err` says why it is refused.
fn decide(
    policy: &PluginPolicy,
    action: c_int,
    a1: Option<&str>,
    a2: Option<&str>,
    db_name: Option<&str>,
    via: Option<&str>,
) -> Result<(), String> {
    let table_key = |t: &str, key: &str| {
        format!(
            "table `{t}` is not in consumers[{}].tables.{key}; add it there to allow it",
            policy.consumer
        )
    };
    // Reached through a view or trigger the operator granted: its body is
    // the operator's responsibility, except that the host's tables stay out
    // of reach.
    let granted_via = via.is_some_and(|v| policy.grants.may_read(v));
    let table_ok = |t: &str, write: bool| -> Result<(), String> {
        if is_host_table(t) {
            return Err(format!(
                "`{t}` is outboxd's own table or a catalog; plugin SQL can never reach it"
            ));
        }
        if db_name.is_some_and(|d| d != "main") {
            return Err(format!(
                "`{}.{t}`: only the main database is reachable",
                db_name.unwrap_or_default()
            ));
        }
        let t = t.to_ascii_lowercase();
        let allowed = if write {
            policy.grants.may_write(&t)
        } else {
            policy.grants.may_read(&t)
        };
        if allowed || granted_via {
            Ok(())
        } else {
            Err(table_key(&t, if write { "write" } else { "read" }))
        }
    };
    match action {
        ffi::SQLITE_SELECT => Ok(()),
        ffi::SQLITE_READ => table_ok(a1.unwrap_or_default(), false),
        ffi::SQLITE_INSERT | ffi::SQLITE_UPDATE | ffi::SQLITE_DELETE => {
            table_ok(a1.unwrap_or_default(), true)
        }
        ffi::SQLITE_FUNCTION => {
            let f = a2.unwrap_or_default().to_ascii_lowercase();
            if is_allowed_function(&f) || granted_via {
                Ok(())
            } else {
                Err(format!(
                    "function `{f}` is not on plugin SQL's allowlist (see SECURITY.md)"
                ))
            }
        }
        ffi::SQLITE_RECURSIVE => Err("recursive CTEs are not allowed in plugin SQL".into()),
        ffi::SQLITE_PRAGMA => Err(format!(
            "PRAGMA {} is not allowed in plugin SQL",
            a1.unwrap_or_default()
        )),
        ffi::SQLITE_ATTACH | ffi::SQLITE_DETACH => {
            Err("ATTACH and DETACH are not allowed in plugin SQL".into())
        }
        ffi::SQLITE_TRANSACTION | ffi::SQLITE_SAVEPOINT => {
            Err("the host owns the transaction: no BEGIN, COMMIT, ROLLBACK or SAVEPOINT".into())
        }
        other => Err(format!(
            "SQLite action {other} (schema changes and the like) is not allowed in plugin SQL"
        )),
    }
}

#[allow(unsafe_code)]
unsafe extern "C" fn authorize(
    data: *mut c_void,
    action: c_int,
    a1: *const c_char,
    a2: *const c_char,
    db_name: *const c_char,
    via: *const c_char,
) -> c_int {
    // SAFETY: `data` is the `&'static ConnGuard` given at install time.
    let guard = unsafe { &*(data as *const ConnGuard) };
    if !guard.active.load(Ordering::Acquire) {
        return ffi::SQLITE_OK;
    }
    let Ok(mut state) = guard.state.lock() else {
        return ffi::SQLITE_DENY;
    };
    if state.draining {
        return ffi::SQLITE_OK;
    }
    let Some(policy) = &state.policy else {
        return ffi::SQLITE_OK;
    };
    match decide(policy, action, cstr(a1), cstr(a2), cstr(db_name), cstr(via)) {
        Ok(()) => ffi::SQLITE_OK,
        Err(why) => {
            state.refused.get_or_insert(why);
            ffi::SQLITE_DENY
        }
    }
}

#[allow(unsafe_code)]
unsafe extern "C" fn progress(data: *mut c_void) -> c_int {
    // SAFETY: as for `authorize`.
    let guard = unsafe { &*(data as *const ConnGuard) };
    if !guard.active.load(Ordering::Acquire) {
        return 0;
    }
    let Ok(mut state) = guard.state.lock() else {
        return 1;
    };
    if state.draining {
        return 1;
    }
    match &state.policy {
        Some(p) if Instant::now() >= p.deadline => {
            state.refused.get_or_insert(
                "the statement ran past the plugin's deadline and was interrupted".into(),
            );
            1
        }
        _ => 0,
    }
}

/// Installs the authorizer and the progress handler on a new connection
/// (`after_connect`); both do nothing until [`begin`].
#[allow(unsafe_code)] // Two SQLite calls sqlx does not wrap; see SAFETY.
pub async fn install(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr();
    let guard: &'static ConnGuard = Box::leak(Box::default());
    let data = guard as *const ConnGuard as *mut c_void;
    // SAFETY: `db` is the open connection that `handle` keeps locked, so no
    // other thread uses it during these calls. `data` points to a guard
    // that is never freed, so it outlives every callback SQLite makes. The
    // callbacks only read it (an atomic, a mutex held briefly) and never
    // call back into SQLite.
    let rc = unsafe {
        ffi::sqlite3_progress_handler(db, PROGRESS_STEPS, Some(progress), data);
        ffi::sqlite3_set_authorizer(db, Some(authorize), data)
    };
    if rc != ffi::SQLITE_OK {
        return Err(sqlx::Error::Protocol(format!(
            "sqlite3_set_authorizer failed with code {rc}"
        )));
    }
    if let Ok(mut map) = guards().lock() {
        map.insert(db as usize, guard);
    }
    Ok(())
}

/// Sets `limit` as the connection's longest string or blob.
#[allow(unsafe_code)] // sqlite3_limit, which sqlx does not wrap; see SAFETY.
async fn set_length_limit(conn: &mut SqliteConnection, limit: c_int) -> Result<usize, sqlx::Error> {
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr();
    // SAFETY: `db` is open and locked by `handle` for this call.
    unsafe { ffi::sqlite3_limit(db, ffi::SQLITE_LIMIT_LENGTH, limit) };
    Ok(db as usize)
}

/// The policy of one plugin statement on one connection, active until
/// [`Active::end`]. If the statement's future is dropped instead (the wall
/// deadline), the statement may still be running on sqlx's worker thread:
/// the connection then drains (the statement is interrupted) until
/// [`reset`], which the plugin host runs at once and the pool runs before
/// handing the connection out again.
#[derive(Debug)]
pub struct Active {
    guard: &'static ConnGuard,
}

impl std::fmt::Debug for ConnGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnGuard")
            .field("active", &self.active.load(Ordering::Relaxed))
            .finish()
    }
}

/// Makes `policy` the rule for the next statement on `conn`.
pub async fn begin(
    conn: &mut SqliteConnection,
    policy: PluginPolicy,
) -> Result<Active, sqlx::Error> {
    let limit = c_int::try_from(policy.max_value_bytes).unwrap_or(HOST_LENGTH_LIMIT);
    let db = set_length_limit(conn, limit.clamp(1, HOST_LENGTH_LIMIT)).await?;
    let guard = guards().lock().ok().and_then(|m| m.get(&db).copied());
    let Some(guard) = guard else {
        set_length_limit(conn, HOST_LENGTH_LIMIT).await?;
        return Err(sqlx::Error::Protocol(
            "this SQLite connection has no plugin guard installed; refusing to run plugin SQL on it".into(),
        ));
    };
    if let Ok(mut state) = guard.state.lock() {
        state.policy = Some(policy);
        state.refused = None;
    }
    guard.active.store(true, Ordering::Release);
    Ok(Active { guard })
}

impl Active {
    /// Ends the statement's policy and gives the connection back the host's
    /// length limit; returns what the guard refused, if anything.
    pub async fn end(self, conn: &mut SqliteConnection) -> Result<Option<String>, sqlx::Error> {
        let refused = clear(self.guard);
        std::mem::forget(self);
        set_length_limit(conn, HOST_LENGTH_LIMIT).await?;
        Ok(refused)
    }
}

fn clear(guard: &ConnGuard) -> Option<String> {
    guard.active.store(false, Ordering::Release);
    guard.state.lock().ok().and_then(|mut s| {
        if s.draining {
            s.draining = false;
            DRAINING.fetch_sub(1, Ordering::AcqRel);
        }
        s.policy = None;
        s.refused.take()
    })
}

impl Drop for Active {
    fn drop(&mut self) {
        if let Ok(mut s) = self.guard.state.lock()
            && !s.draining
        {
            s.draining = true;
            DRAINING.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Ends whatever plugin statement `conn` last ran (its future may have
/// been dropped) and gives it the host's length limit back. The lock on the
/// handle is granted only once sqlx's worker is idle, so a statement still
/// draining has stopped by then.
pub async fn reset(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    let db = set_length_limit(conn, HOST_LENGTH_LIMIT).await?;
    if let Some(guard) = guards().lock().ok().and_then(|m| m.get(&db).copied()) {
        clear(guard);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> PluginPolicy {
        PluginPolicy {
            consumer: "billing".into(),
            grants: TableGrants {
                read: vec!["customers".into()],
                write: vec!["invoices".into()],
            },
            deadline: Instant::now(),
            max_value_bytes: 1 << 20,
        }
    }

    #[test]
    fn the_authorizer_allows_only_the_grants() {
        let p = policy();
        let main = Some("main");
        assert!(
            decide(
                &p,
                ffi::SQLITE_READ,
                Some("customers"),
                Some("id"),
                main,
                None
            )
            .is_ok()
        );
        assert!(
            decide(
                &p,
                ffi::SQLITE_READ,
                Some("invoices"),
                Some("id"),
                main,
                None
            )
            .is_ok()
        );
        assert!(decide(&p, ffi::SQLITE_INSERT, Some("invoices"), None, main, None).is_ok());
        assert!(
            decide(
                &p,
                ffi::SQLITE_UPDATE,
                Some("customers"),
                Some("n"),
                main,
                None
            )
            .is_err()
        );
        assert!(decide(&p, ffi::SQLITE_READ, Some("inbox"), Some("id"), main, None).is_err());
        assert!(decide(&p, ffi::SQLITE_DELETE, Some("outbox"), None, main, None).is_err());
        assert!(
            decide(
                &p,
                ffi::SQLITE_READ,
                Some("sqlite_master"),
                None,
                main,
                None
            )
            .is_err()
        );
        assert!(
            decide(
                &p,
                ffi::SQLITE_READ,
                Some("customers"),
                None,
                Some("temp"),
                None
            )
            .is_err()
        );
        assert!(decide(&p, ffi::SQLITE_FUNCTION, None, Some("lower"), None, None).is_ok());
        assert!(decide(&p, ffi::SQLITE_FUNCTION, None, Some("zeroblob"), None, None).is_err());
        assert!(
            decide(
                &p,
                ffi::SQLITE_FUNCTION,
                None,
                Some("load_extension"),
                None,
                None
            )
            .is_err()
        );
        assert!(
            decide(
                &p,
                ffi::SQLITE_PRAGMA,
                Some("writable_schema"),
                None,
                None,
                None
            )
            .is_err()
        );
        assert!(decide(&p, ffi::SQLITE_ATTACH, Some("/tmp/x"), None, None, None).is_err());
        assert!(decide(&p, ffi::SQLITE_RECURSIVE, None, None, None, None).is_err());
        assert!(
            decide(
                &p,
                ffi::SQLITE_TRANSACTION,
                Some("COMMIT"),
                None,
                None,
                None
            )
            .is_err()
        );
        assert!(
            decide(
                &p,
                ffi::SQLITE_CREATE_TEMP_TABLE,
                Some("inbox"),
                None,
                None,
                None
            )
            .is_err()
        );
        // Through a granted view: the operator's responsibility, but never
        // the host's tables.
        let mut v = policy();
        v.grants.read.push("invoice_totals".into());
        assert!(
            decide(
                &v,
                ffi::SQLITE_READ,
                Some("ledger"),
                None,
                main,
                Some("invoice_totals")
            )
            .is_ok()
        );
        assert!(
            decide(
                &v,
                ffi::SQLITE_READ,
                Some("inbox"),
                None,
                main,
                Some("invoice_totals")
            )
            .is_err()
        );
    }
}
