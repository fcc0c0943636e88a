-- 0014: the audit of consumer plugins' outbound HTTP requests.
--
-- One row per request the host sent for a plugin. The row (the intent) is
-- committed in a short transaction of its own BEFORE the request leaves;
-- status, error, duration_ms and completed_at (the outcome) are written in
-- the message's inbox transaction, or, when that rolls back, in a short
-- transaction of their own. A row with no outcome is a request whose
-- answer no committed transaction recorded (a crash between the send and
-- the inbox commit): what reconciliation looks for, by idempotency_key.
-- In outboxd's own schema, which plugin roles cannot reach.
CREATE TABLE outboxd.outbound_calls (
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
    started_at      timestamptz NOT NULL,
    status          integer,
    error           text,
    duration_ms     bigint,
    completed_at    timestamptz
);
CREATE INDEX outbound_calls_idempotency_key ON outboxd.outbound_calls (idempotency_key);
CREATE INDEX outbound_calls_message_id ON outboxd.outbound_calls (message_id);
