-- 0013: fix-forward: the registry version (`NAME@VERSION`) a redriven dead
-- event runs through instead of the active one (see the Postgres migration
-- of the same number).
ALTER TABLE outbox ADD COLUMN redrive_with TEXT;
