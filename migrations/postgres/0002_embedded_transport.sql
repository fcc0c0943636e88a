-- 0002: the embedded transport, a durable pub/sub inside the database.
--
-- A topic has a fixed number of partitions; a message's partition is derived
-- from its key, so one key keeps its order, as on Kafka. Offsets are the
-- global identity value; within one partition they only grow, because
-- publishers of one partition serialise on an advisory lock.
CREATE TABLE transport_messages (
  "offset"     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  topic        text        NOT NULL,
  partition    integer     NOT NULL,
  message_key  bytea,
  payload      bytea       NOT NULL,
  headers      jsonb       NOT NULL DEFAULT '[]'::jsonb,
  message_id   uuid        NOT NULL,
  published_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX transport_messages_by_partition
  ON transport_messages (topic, partition, "offset");

-- One cursor per (group, topic, partition): the last offset whose handling
-- is complete. A consumer owns a partition through a lease.
CREATE TABLE transport_cursors (
  consumer_group text        NOT NULL,
  topic          text        NOT NULL,
  partition      integer     NOT NULL,
  last_offset    bigint      NOT NULL DEFAULT 0,
  lease_owner    text,
  lease_until    timestamptz,
  PRIMARY KEY (consumer_group, topic, partition)
);
