-- 0007: which handler version handled each inbox message. Consumer plugins
-- can be swapped while a consumer runs (registry rollout), so the audit
-- trail names the exact version: `NAME@VERSION` (a registry version number
-- or a file plugin's configured version). NULL for built-in handlers and
-- for rows written before this migration.
ALTER TABLE inbox ADD COLUMN handled_by text;
