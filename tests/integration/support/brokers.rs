//! The machine's NATS, RabbitMQ and Redis servers, and deleting what a
//! test created on them.

use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use outboxd::config::nats::stream_name;
use outboxd::config::rabbitmq::queue_name;
use outboxd::config::redis::stream_key;

/// The nats-server tests use (OUTBOXD_TEST_NATS).
pub fn nats_url() -> String {
    std::env::var("OUTBOXD_TEST_NATS").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// The RabbitMQ tests use (OUTBOXD_TEST_RABBITMQ).
pub fn rabbitmq_url() -> String {
    std::env::var("OUTBOXD_TEST_RABBITMQ")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The Redis tests use (OUTBOXD_TEST_REDIS).
pub fn redis_url() -> String {
    std::env::var("OUTBOXD_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The partitions tests configure on NATS, RabbitMQ and Redis (queues and
/// streams to delete).
const PARTITIONS: i32 = 4;

/// Deletes a topic's stream (NATS), exchange and partition queues
/// (RabbitMQ) or partition streams (Redis) when dropped, passed or failed.
pub enum Cleanup {
    Nats { url: String, topic: String },
    Rabbitmq { url: String, topic: String },
    Redis { url: String, topic: String },
}

impl Cleanup {
    pub fn nats(url: &str, topic: &str) -> Self {
        Cleanup::Nats {
            url: url.into(),
            topic: topic.into(),
        }
    }

    pub fn rabbitmq(url: &str, topic: &str) -> Self {
        Cleanup::Rabbitmq {
            url: url.into(),
            topic: topic.into(),
        }
    }

    pub fn redis(url: &str, topic: &str) -> Self {
        Cleanup::Redis {
            url: url.into(),
            topic: topic.into(),
        }
    }

    async fn run(&self) {
        match self {
            Cleanup::Nats { url, topic } => {
                if let Ok(c) = async_nats::connect(url.as_str()).await {
                    let _ = async_nats::jetstream::new(c)
                        .delete_stream(stream_name(topic))
                        .await;
                }
            }
            Cleanup::Rabbitmq { url, topic } => {
                let Ok(c) =
                    lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await
                else {
                    return;
                };
                for p in 0..PARTITIONS {
                    if let Ok(ch) = c.create_channel().await {
                        let _ = ch
                            .queue_delete(
                                queue_name(topic, p).into(),
                                QueueDeleteOptions::default(),
                            )
                            .await;
                    }
                }
                if let Ok(ch) = c.create_channel().await {
                    let _ = ch
                        .exchange_delete(topic.as_str().into(), ExchangeDeleteOptions::default())
                        .await;
                }
                let _ = c.close(200, "done".into()).await;
            }
            Cleanup::Redis { url, topic } => {
                let Ok(client) = ::redis::Client::open(url.as_str()) else {
                    return;
                };
                if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                    let keys: Vec<String> = (0..PARTITIONS).map(|p| stream_key(topic, p)).collect();
                    let _ = ::redis::cmd("DEL")
                        .arg(&keys)
                        .query_async::<i64>(&mut c)
                        .await;
                }
            }
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        // A thread of its own: the test's runtime may be shutting down.
        std::thread::scope(|s| {
            s.spawn(|| {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                rt.block_on(self.run());
            });
        });
    }
}
