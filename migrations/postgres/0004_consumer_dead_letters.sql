-- 0004: dead-letter records of consumers. A message whose handler failed
-- permanently, or too many times, is recorded here with everything needed
-- to understand and replay it, and the partition moves on.
CREATE TABLE consumer_dead_letters (
  id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  consumer     text        NOT NULL,
  -- NULL when the message carried no usable message-id header.
  message_id   uuid,
  topic        text        NOT NULL,
  partition    integer     NOT NULL,
  "offset"     bigint      NOT NULL,
  message_key  bytea,
  payload      bytea       NOT NULL,
  headers      jsonb       NOT NULL DEFAULT '[]'::jsonb,
  error        text        NOT NULL,
  -- Which handler failed: builtin:NAME or plugin NAME@VERSION.
  handler      text        NOT NULL,
  attempts     integer     NOT NULL,
  dead_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX consumer_dead_letters_by_consumer ON consumer_dead_letters (consumer, id);
