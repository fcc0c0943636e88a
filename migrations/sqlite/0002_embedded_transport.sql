-- 0002: the embedded transport, a durable pub/sub inside the database.
-- SQLite serialises writers, so offsets grow in commit order.
CREATE TABLE transport_messages (
  "offset"     INTEGER PRIMARY KEY AUTOINCREMENT,
  topic        TEXT    NOT NULL,
  partition    INTEGER NOT NULL,
  message_key  BLOB,
  payload      BLOB    NOT NULL,
  headers      TEXT    NOT NULL DEFAULT '[]',
  message_id   TEXT    NOT NULL,
  published_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER))
);
CREATE INDEX transport_messages_by_partition
  ON transport_messages (topic, partition, "offset");

CREATE TABLE transport_cursors (
  consumer_group TEXT    NOT NULL,
  topic          TEXT    NOT NULL,
  partition      INTEGER NOT NULL,
  last_offset    INTEGER NOT NULL DEFAULT 0,
  lease_owner    TEXT,
  lease_until    INTEGER,
  PRIMARY KEY (consumer_group, topic, partition)
);
