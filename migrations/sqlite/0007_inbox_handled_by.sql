-- 0007: which handler version handled each inbox message (see the Postgres
-- migration of the same number).
ALTER TABLE inbox ADD COLUMN handled_by TEXT;
