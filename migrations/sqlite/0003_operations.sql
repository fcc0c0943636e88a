-- 0003: discarding dead events, early payload purge, retention indexes.
ALTER TABLE outbox ADD COLUMN discarded_at INTEGER;
ALTER TABLE outbox ADD COLUMN discard_reason TEXT;
ALTER TABLE outbox ADD COLUMN payload_purged_at INTEGER;

CREATE INDEX outbox_dead ON outbox (seq) WHERE dead_at IS NOT NULL AND published_at IS NULL;
CREATE INDEX outbox_published_at ON outbox (published_at) WHERE published_at IS NOT NULL;
