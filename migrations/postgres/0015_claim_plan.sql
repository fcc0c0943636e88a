-- 0015: the claim's plan no longer depends on fresh statistics.
--
-- The claim walks unpublished, live rows in `seq` order and, for each, asks
-- whether an older unpublished row of the same aggregate exists. Both
-- questions could use `outbox_pending (seq) WHERE published_at IS NULL`.
-- After a burst of inserts that autoanalyze had not seen yet (a broker
-- outage, a backlog written while every relay was down), the planner took
-- the pending rows for a handful and answered the second question by
-- rescanning that whole index for every row of the first: 12 s per claim
-- of 100 at 64,000 pending, measured in a million-event soak.
--
-- The index the first question walks now leaves dead rows out. The second
-- question must see dead rows (a dead event holds its successors back), so
-- the only partial index it can use is `outbox_pending_by_aggregate`, a
-- probe by (aggregate_id, seq), whatever the statistics say. Building the
-- new index reads the whole table once and holds inserts back meanwhile
-- (0.8 s for a million rows on the two-core test machine).
DROP INDEX outboxd.outbox_pending;
CREATE INDEX outbox_claimable ON outboxd.outbox (seq)
  WHERE published_at IS NULL AND dead_at IS NULL;
