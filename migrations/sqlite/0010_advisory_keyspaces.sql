-- 0010: nothing to change on SQLite. Postgres migration 0010 gives its
-- advisory locks separate keyspaces; SQLite has no advisory locks (its one
-- writer lock serialises producers and the embedded transport's writers),
-- and this file keeps the two schemas' version numbers in step.
SELECT 1;
