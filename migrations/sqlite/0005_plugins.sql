-- 0005: what the transformer plugins did to an event (see the Postgres
-- migration of the same number).
ALTER TABLE outbox ADD COLUMN outcome TEXT
  CHECK (outcome IS NULL OR outcome IN ('published', 'filtered'));
ALTER TABLE outbox ADD COLUMN transformed_by TEXT;
