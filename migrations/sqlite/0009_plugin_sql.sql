-- Consumer plugins' SQL (issue 18): nothing to store on SQLite. The size
-- of every string and blob a plugin statement builds is bounded by
-- sqlite3_limit(SQLITE_LIMIT_LENGTH) while it runs, and the authorizer
-- checks its tables and functions (host/src/store/sqlite_plugin_guard.rs).
-- This file keeps the two schemas' version numbers in step.
SELECT 1;
