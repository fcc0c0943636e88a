-- 0003: what operations need: discarding a dead event with a reason,
-- purging payloads of published rows early (privacy), and the indexes the
-- retention job and the dead-letter views use.

-- A discarded event is finished without being published: published_at is
-- set so it no longer holds back its aggregate, and these say why.
ALTER TABLE outbox ADD COLUMN discarded_at timestamptz;
ALTER TABLE outbox ADD COLUMN discard_reason text;
-- Set when the retention job replaced the payload of a published row.
ALTER TABLE outbox ADD COLUMN payload_purged_at timestamptz;

CREATE INDEX outbox_dead ON outbox (seq) WHERE dead_at IS NOT NULL AND published_at IS NULL;
CREATE INDEX outbox_published_at ON outbox (published_at) WHERE published_at IS NOT NULL;
