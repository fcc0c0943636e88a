-- 0008: Kafka offsets of consumers with statically assigned partitions (see
-- the Postgres migration of the same number).
CREATE TABLE consumer_offsets (
  consumer    TEXT    NOT NULL,
  topic       TEXT    NOT NULL,
  partition   INTEGER NOT NULL,
  next_offset INTEGER NOT NULL,
  updated_at  TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP,
  PRIMARY KEY (consumer, topic, partition)
);
