-- 0016: the embedded transport's consumer-group members (see the Postgres
-- file): each member holds at most ceil(partitions / live members).
CREATE TABLE transport_members (
  consumer_group TEXT    NOT NULL,
  member         TEXT    NOT NULL,
  seen_until     INTEGER NOT NULL,
  PRIMARY KEY (consumer_group, member)
);
