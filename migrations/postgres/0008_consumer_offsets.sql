-- 0008: Kafka offsets of consumers with statically assigned partitions
-- (`consumers[].kafka_partitions`). Such a consumer joins no consumer group:
-- it reads its partitions from `next_offset` and writes the offset here
-- after the handler's transaction commits. A crash between the two replays
-- a few messages, which the inbox turns into no-ops.
CREATE TABLE consumer_offsets (
  consumer    text        NOT NULL,
  topic       text        NOT NULL,
  partition   integer     NOT NULL,
  next_offset bigint      NOT NULL,
  updated_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer, topic, partition)
);
