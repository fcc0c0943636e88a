-- 0017: webhook routes an endpoint stopped with 410 Gone.
--
-- A row stops the route's deliveries: its events stay pending (no attempt
-- is counted) until `outboxd route resume NAME` deletes the row. Every
-- relay reads this table, so a pause holds across processes and restarts.
CREATE TABLE outboxd.route_pauses (
  route     text        PRIMARY KEY,
  reason    text        NOT NULL,
  paused_at timestamptz NOT NULL
);
