//! NATS JetStream, both ways: the relay's publisher (PubAck, subjects by
//! partition, the duplicate window) and a consumer group's member (leases,
//! per-key order, commit only after handling, takeover from the cursor),
//! against the machine's nats-server (OUTBOXD_TEST_NATS, default
//! nats://127.0.0.1:4222), and a server of the test's own where one must
//! be configured differently.

mod tls;
mod transport;
