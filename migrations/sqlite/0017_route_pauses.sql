-- 0017: webhook routes an endpoint stopped with 410 Gone (see the Postgres
-- file): a row holds the route's events pending until it is resumed.
CREATE TABLE route_pauses (
  route     TEXT    PRIMARY KEY,
  reason    TEXT    NOT NULL,
  paused_at TEXT    NOT NULL
);
