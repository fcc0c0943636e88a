-- 0014: the audit of consumer plugins' outbound HTTP requests (see the
-- Postgres file for the columns' meaning).
--
-- On SQLite the table lives in a sidecar file, `<database>-outbound`,
-- attached to every host connection as schema `outbound`
-- (host/src/store/db.rs). The inbox transaction holds the main file's
-- write lock while a plugin runs, so an intent written to the main file
-- before the request is sent would wait for the very transaction it
-- precedes. The sidecar has its own lock: the intent commits there at
-- once, and the inbox transaction writes the outcome there before it
-- commits. Plugin SQL reaches only the main database (the authorizer).
-- In WAL mode a commit across two files is atomic per file, not as a set:
-- a crash in between leaves an outcome without its inbox mark, which reads
-- as "the call was made and answered, the message will be redelivered",
-- true either way.
CREATE TABLE outbound.outbound_calls (
    id              text PRIMARY KEY,
    message_id      text NOT NULL,
    consumer        text NOT NULL,
    plugin          text NOT NULL,
    idempotency_key text NOT NULL,
    method          text NOT NULL,
    scheme          text NOT NULL,
    host            text NOT NULL,
    port            integer NOT NULL,
    path            text NOT NULL,
    started_at      text NOT NULL,
    status          integer,
    error           text,
    duration_ms     integer,
    completed_at    text
);
CREATE INDEX outbound.outbound_calls_idempotency_key ON outbound_calls (idempotency_key);
CREATE INDEX outbound.outbound_calls_message_id ON outbound_calls (message_id);
