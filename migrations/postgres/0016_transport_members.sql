-- 0016: the embedded transport's consumer-group members.
--
-- A member used to take every free partition, so the first member of a
-- group held them all and the others waited as standbys: a million-event
-- soak found one consumer process applying every effect while the other
-- idled. Each member now records itself here, renewed with its leases, and
-- holds at most its share of the partitions, ceil(partitions / live
-- members); a member above its share gives the rest back at its next
-- renewal (what it handled is committed, so the next holder reads on from
-- there). A member that stops gracefully deletes its row; a killed one's
-- row and leases expire together.
CREATE TABLE outboxd.transport_members (
  consumer_group text        NOT NULL,
  member         text        NOT NULL,
  seen_until     timestamptz NOT NULL,
  PRIMARY KEY (consumer_group, member)
);
