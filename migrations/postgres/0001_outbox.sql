-- 0001: the outbox table, as in seed 000, plus what production needs.
--
-- seq orders events; id travels with the message as its message id.
-- Rows are never updated by producers after insert: the relay owns
-- published_at, attempts, last_error, next_attempt_at and the dead state.
CREATE TABLE outbox (
  seq                  bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  id                   uuid        NOT NULL DEFAULT gen_random_uuid() UNIQUE,
  aggregate_id         text        NOT NULL CHECK (aggregate_id <> ''),
  event_type           text        NOT NULL CHECK (event_type <> ''),
  payload              jsonb       NOT NULL,
  -- Free-form string headers, for example traceparent.
  headers              jsonb       NOT NULL DEFAULT '{}'::jsonb
                                   CHECK (jsonb_typeof(headers) = 'object'),
  created_at           timestamptz NOT NULL DEFAULT now(),
  published_at         timestamptz,
  attempts             integer     NOT NULL DEFAULT 0,
  last_error           text,
  next_attempt_at      timestamptz NOT NULL DEFAULT now(),
  -- Terminal state: the relay gave up. Dead rows are never deleted
  -- automatically, and they keep later events of their aggregate waiting.
  dead_at              timestamptz,
  dead_reason          text,
  -- Idempotent operations (seed 001): an optional operation key scoped by
  -- tenant, with a canonical fingerprint of what the key stands for.
  idempotency_tenant   text        NOT NULL DEFAULT '',
  idempotency_key      text,
  payload_fingerprint  text
);

-- Seed 000's partial index: only pending rows, so it stays small while the
-- table grows.
CREATE INDEX outbox_pending ON outbox (seq) WHERE published_at IS NULL;

-- What the claim query's NOT EXISTS looks up: is there an older pending row
-- of the same aggregate? Without it the check scans the table.
CREATE INDEX outbox_pending_by_aggregate ON outbox (aggregate_id, seq)
  WHERE published_at IS NULL;

-- One row per (tenant, operation key).
CREATE UNIQUE INDEX outbox_idempotency ON outbox (idempotency_tenant, idempotency_key)
  WHERE idempotency_key IS NOT NULL;

-- Consumer side: one row per message already handled by a consumer.
CREATE TABLE inbox (
  consumer      text        NOT NULL,
  message_id    uuid        NOT NULL,
  processed_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer, message_id)
);
CREATE INDEX inbox_processed_at ON inbox (processed_at);

-- Wake relays early: one notification per inserting statement, so producers
-- that use the raw SQL contract wake the relay too.
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('outboxd_outbox', '');
  RETURN NULL;
END $$;

CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
  FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- The SQL contract for producers in other languages: call this inside your
-- own transaction. It takes the per-aggregate advisory lock first, so the
-- seq order of one aggregate is its commit order (no commit-order gap).
CREATE FUNCTION outbox_enqueue(
  p_aggregate_id text,
  p_event_type   text,
  p_payload      jsonb,
  p_headers      jsonb DEFAULT '{}'::jsonb
) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
  new_id uuid;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtextextended(p_aggregate_id, 0));
  INSERT INTO outbox (aggregate_id, event_type, payload, headers)
  VALUES (p_aggregate_id, p_event_type, p_payload, coalesce(p_headers, '{}'::jsonb))
  RETURNING id INTO new_id;
  RETURN new_id;
END $$;
