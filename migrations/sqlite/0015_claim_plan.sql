-- 0015: the claim walks `outbox_claimable` (unpublished, live rows in seq
-- order), and its check for an older pending row of the same aggregate
-- uses `outbox_pending_by_aggregate` (see the Postgres migration of the
-- same number).
DROP INDEX outbox_pending;
CREATE INDEX outbox_claimable ON outbox (seq)
  WHERE published_at IS NULL AND dead_at IS NULL;
