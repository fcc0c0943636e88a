-- 0004: dead-letter records of consumers (see the Postgres migration).
CREATE TABLE consumer_dead_letters (
  id           INTEGER PRIMARY KEY AUTOINCREMENT,
  consumer     TEXT    NOT NULL,
  message_id   TEXT,
  topic        TEXT    NOT NULL,
  partition    INTEGER NOT NULL,
  "offset"     INTEGER NOT NULL,
  message_key  BLOB,
  payload      BLOB    NOT NULL,
  headers      TEXT    NOT NULL DEFAULT '[]',
  error        TEXT    NOT NULL,
  handler      TEXT    NOT NULL,
  attempts     INTEGER NOT NULL,
  dead_at      INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER))
);
CREATE INDEX consumer_dead_letters_by_consumer ON consumer_dead_letters (consumer, id);
