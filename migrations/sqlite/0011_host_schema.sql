-- 0011: nothing to change on SQLite. Postgres migration 0011 moves
-- outboxd's tables into a schema of their own, so that a consumer plugin's
-- role needs no USAGE on it; a SQLite file has one schema, and plugin SQL
-- is walled there by SQLite's authorizer (host/src/store/sqlite_plugin_guard.rs).
-- This file keeps the two schemas' version numbers in step.
SELECT 1;
