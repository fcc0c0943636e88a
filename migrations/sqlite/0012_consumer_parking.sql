-- 0012: consumer dead letters an operator can act on, and per-key parking
-- (see the Postgres migration). Times are microseconds since the epoch.
ALTER TABLE consumer_dead_letters ADD COLUMN state TEXT NOT NULL DEFAULT 'dead'
  CHECK (state IN ('dead', 'parked', 'redrive'));
ALTER TABLE consumer_dead_letters ADD COLUMN holds_key INTEGER NOT NULL DEFAULT 1;
ALTER TABLE consumer_dead_letters ADD COLUMN resolved_at INTEGER;
ALTER TABLE consumer_dead_letters ADD COLUMN resolution TEXT
  CHECK (resolution IN ('applied', 'duplicate', 'discarded'));
ALTER TABLE consumer_dead_letters ADD COLUMN resolve_reason TEXT;
ALTER TABLE consumer_dead_letters ADD COLUMN redrive_with TEXT;
UPDATE consumer_dead_letters SET holds_key = 0;
CREATE INDEX consumer_dead_letters_unresolved
  ON consumer_dead_letters (consumer, message_key, id) WHERE resolved_at IS NULL;
