//! The databases underneath: connections and pools (`db.rs`, TLS in
//! `pg_tls.rs`), migrations, error hints, advisory locks, commit
//! notifications, stored time, and SQLite's busy handler, file watcher and
//! plugin-SQL guard. Nothing here imports the other folders of `store/`.

pub(in crate::store) mod db;
pub mod locks;
pub(in crate::store) mod migrate;
pub mod notify;
pub mod pg_tls;
pub mod problem;
pub(in crate::store) mod sqlite_busy;
pub mod sqlite_plugin_guard;
pub mod sqlite_watch;
pub(in crate::store) mod stored_time;
