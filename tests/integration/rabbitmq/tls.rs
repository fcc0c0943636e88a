//! `amqps://` to RabbitMQ through a TLS-terminating proxy of the test's own
//! (the machine's RabbitMQ serves plain AMQP only): the server is verified
//! against `ca_file`, and without it the handshake fails with the fix.

use std::time::Duration;

use outboxd::broker::rabbitmq::{RabbitConsumer, RabbitConsumerConfig, RabbitPublisher, start};
use outboxd::broker::{MessageSource, Publisher};
use outboxd::config::{RabbitSection, RabbitUrl};

use crate::support::brokers::{Cleanup, rabbitmq_url};
use crate::support::eventually;
use crate::support::publisher::msg;
use crate::support::tls::TestCa;

/// Accepts TLS on a free port and forwards each connection to the
/// machine's RabbitMQ; stops when dropped.
struct TlsProxy {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl TlsProxy {
    async fn start(ca: &TestCa) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let acceptor = ca.acceptor();
        let upstream = {
            let u = rabbitmq_url();
            let rest = u.split_once('@').map_or(u.as_str(), |(_, r)| r).to_string();
            rest.split('/')
                .next()
                .unwrap_or("127.0.0.1:5672")
                .to_string()
        };
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(socket).await else {
                        return;
                    };
                    let Ok(mut plain) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        Self { port, task }
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn section(port: u16, ca_file: Option<String>) -> RabbitSection {
    RabbitSection {
        url: RabbitUrl(format!("amqps://guest:guest@127.0.0.1:{port}/%2f")),
        ca_file,
        fetch_wait: Duration::from_millis(100),
        ..RabbitSection::default()
    }
}

#[tokio::test]
async fn amqps_verifies_the_server_against_the_ca_file_and_carries_messages() {
    let ca = TestCa::new();
    let proxy = TlsProxy::start(&ca).await;
    let topic = format!("t.tls.{}", uuid::Uuid::new_v4().simple());
    let _cleanup = Cleanup::rabbitmq(&rabbitmq_url(), &topic);
    let topics = std::collections::BTreeSet::from([topic.clone()]);

    // Mozilla's roots alone do not know the test's CA: refused, with the fix.
    let e = start(&section(proxy.port, None), &topics, 4, Some(1))
        .await
        .expect_err("an unknown CA is refused");
    assert!(!e.is_transient(), "a failed handshake is not retried: {e}");
    let e = e.to_string();
    assert!(
        e.contains("TLS failed") && e.contains("transport.rabbitmq.ca_file"),
        "{e}"
    );
    assert!(!e.contains("guest:guest"), "{e}");

    let s = section(proxy.port, Some(ca.ca_file().display().to_string()));
    let conn = start(&s, &topics, 4, Some(1))
        .await
        .expect("amqps with the CA");
    let p = RabbitPublisher::new(&s, Some(conn), 4, Duration::from_secs(5))
        .await
        .expect("publisher");
    for n in 0..5 {
        p.publish(msg(&topic, "k", n))
            .await
            .expect("confirmed over TLS");
    }
    let mut c = RabbitConsumer::new(
        s,
        RabbitConsumerConfig {
            group: "g".into(),
            topics: vec![topic.clone()],
            partitions: 4,
            prefetch: 10,
            fetch_wait: Duration::from_millis(100),
        },
    );
    let got = eventually(Duration::from_secs(20), "5 messages over TLS", async || {
        let got = c.fetch(100).await.expect("fetch");
        if got.len() >= 5 {
            Ok(got)
        } else {
            Err(format!("{} fetched", got.len()))
        }
    })
    .await;
    for d in &got {
        c.commit(d).await.expect("ack over TLS");
    }
    c.release().await.expect("release");
}
