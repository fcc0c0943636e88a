-- 0010: each advisory lock family gets its own keyspace.
--
-- Until now outbox_enqueue locked hashtextextended(aggregate_id, 0), and the
-- embedded transport's writer locked hashtextextended(topic, partition),
-- both in the bigint keyspace: aggregate 'orders' and partition 0 of topic
-- 'orders' were one lock, so a producer's transaction stalled that
-- partition's writer (and the relay's publishes), and the other way round.
--
-- Aggregates now lock in the two-int4 keyspace, which Postgres keeps apart
-- from the bigint one and which nothing else uses: the same 64-bit hash,
-- split into its high and low halves. Partitions lock
-- hashtextextended(topic, partition + 2^32) in the bigint keyspace (see
-- host/src/store/locks.rs for the whole layout).
--
-- Rolling upgrade: a producer of the previous release (its Rust enqueue)
-- still takes hashtextextended(aggregate_id, 0) EXCLUSIVE. So that it and a
-- new producer still exclude each other on one aggregate, the new form also
-- takes that old key, SHARED: shared conflicts with exclusive, while two new
-- producers share it and wait for each other only on the new key; a new
-- partition writer, which takes its old key shared as well, therefore never
-- waits for a new producer through the old keys. The shared old lock can be
-- dropped (by a later migration replacing this function, and in
-- store/locks.rs) once no host of a release before 0010 runs against the
-- database.
CREATE OR REPLACE FUNCTION outbox_enqueue(
  p_aggregate_id text,
  p_event_type   text,
  p_payload      jsonb,
  p_headers      jsonb DEFAULT '{}'::jsonb
) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
  new_id uuid;
  h bigint := hashtextextended(p_aggregate_id, 0);
BEGIN
  PERFORM pg_advisory_xact_lock_shared(h);
  PERFORM pg_advisory_xact_lock((h >> 32)::int4, h::bit(32)::int4);
  INSERT INTO outbox (aggregate_id, event_type, payload, headers)
  VALUES (p_aggregate_id, p_event_type, p_payload, coalesce(p_headers, '{}'::jsonb))
  RETURNING id INTO new_id;
  RETURN new_id;
END $$;
