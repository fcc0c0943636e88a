-- 0001: the outbox table, as in seed 000, plus what production needs.
--
-- Timestamps are integer microseconds since the Unix epoch, so they compare
-- and sort cheaply; the defaults let producers that use the raw SQL contract
-- leave them out. SQLite serialises writers, so seq order is commit order.
CREATE TABLE outbox (
  seq                  INTEGER PRIMARY KEY AUTOINCREMENT,
  -- A random (version 4) uuid unless the producer supplies one.
  id                   TEXT    NOT NULL UNIQUE CHECK (length(id) = 36) DEFAULT (lower(
                         hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' ||
                         substr(hex(randomblob(2)), 2) || '-' ||
                         substr('89ab', 1 + (abs(random()) % 4), 1) ||
                         substr(hex(randomblob(2)), 2) || '-' || hex(randomblob(6)))),
  aggregate_id         TEXT    NOT NULL CHECK (aggregate_id <> ''),
  event_type           TEXT    NOT NULL CHECK (event_type <> ''),
  payload              TEXT    NOT NULL CHECK (json_valid(payload)),
  headers              TEXT    NOT NULL DEFAULT '{}'
                               CHECK (json_valid(headers) AND json_type(headers) = 'object'),
  created_at           INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER)),
  published_at         INTEGER,
  attempts             INTEGER NOT NULL DEFAULT 0,
  last_error           TEXT,
  next_attempt_at      INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER)),
  dead_at              INTEGER,
  dead_reason          TEXT,
  idempotency_tenant   TEXT    NOT NULL DEFAULT '',
  idempotency_key      TEXT,
  payload_fingerprint  TEXT,
  -- SQLite has no SKIP LOCKED: a relay task leases the rows it claims.
  lease_owner          TEXT,
  lease_until          INTEGER
);

CREATE INDEX outbox_pending ON outbox (seq) WHERE published_at IS NULL;
CREATE INDEX outbox_pending_by_aggregate ON outbox (aggregate_id, seq)
  WHERE published_at IS NULL;
CREATE UNIQUE INDEX outbox_idempotency ON outbox (idempotency_tenant, idempotency_key)
  WHERE idempotency_key IS NOT NULL;

CREATE TABLE inbox (
  consumer      TEXT    NOT NULL,
  message_id    TEXT    NOT NULL,
  processed_at  INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER)),
  PRIMARY KEY (consumer, message_id)
);
CREATE INDEX inbox_processed_at ON inbox (processed_at);
