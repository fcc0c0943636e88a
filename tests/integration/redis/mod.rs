//! Redis Streams, both ways: the relay's publisher (XADD per partition
//! stream, the cap, the fields) and a consumer group's member (leases,
//! per-key order, XACK only after the commit, a dead member's pending
//! entries claimed), against the machine's redis-server (OUTBOXD_TEST_REDIS,
//! default redis://127.0.0.1:6379), and a server of the test's own where
//! one must be restarted or configured differently.

mod server;
mod transport;
