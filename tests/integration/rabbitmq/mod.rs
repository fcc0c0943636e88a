//! RabbitMQ, both ways: the relay's publisher (confirms, the mandatory
//! flag, queues by partition) and a consumer group's member (per-key order,
//! ack only after handling, single-active-consumer takeover), against the
//! machine's RabbitMQ (OUTBOXD_TEST_RABBITMQ, default
//! amqp://guest:guest@127.0.0.1:5672/%2f). Each test uses exchanges and
//! queues of its own and deletes them at the end.

mod tls;
mod transport;
