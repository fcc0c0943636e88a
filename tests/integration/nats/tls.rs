//! `tls://` to a nats-server of the test's own that requires TLS (NATS
//! speaks first in plain text, so no proxy can add TLS in front): the
//! server is verified against `ca_file`, and without it the handshake
//! fails with the fix.

use std::collections::BTreeSet;
use std::time::Duration;

use outboxd::broker::Publisher;
use outboxd::broker::nats::{NatsPublisher, connect, start};
use outboxd::config::NatsSection;

use crate::support::eventually;
use crate::support::publisher::msg;
use crate::support::tls::TestCa;

#[tokio::test]
async fn tls_verifies_the_server_against_the_ca_file_and_carries_messages() {
    let ca = TestCa::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("addr")
        .port();
    let store = tempfile::tempdir().expect("store");
    let dir = ca.dir.path();
    let mut server = std::process::Command::new("nats-server")
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(store.path())
        .arg("--tls")
        .arg("--tlscert")
        .arg(dir.join("server.pem"))
        .arg("--tlskey")
        .arg(dir.join("server.key"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("nats-server (Debian's nats-server package) starts");
    eventually(
        Duration::from_secs(10),
        "nats-server listening",
        async || {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .map(|_| ())
        },
    )
    .await;
    let url = format!("tls://127.0.0.1:{port}");

    let e = connect(&NatsSection {
        url: url.clone(),
        ..NatsSection::default()
    })
    .await
    .expect_err("an unknown CA is refused");
    let text = e.to_string();
    assert!(
        text.contains(&url) && text.contains("transport.nats.ca_file"),
        "{text}"
    );
    assert!(
        !e.is_transient(),
        "a failed handshake is not retried: {text}"
    );

    let s = NatsSection {
        url,
        ca_file: Some(ca.ca_file().display().to_string()),
        ..NatsSection::default()
    };
    let topic = format!("t.tls.{}", uuid::Uuid::new_v4().simple());
    let client = start(&s, &BTreeSet::from([topic.clone()]), Some(1))
        .await
        .expect("TLS with the CA");
    let p = NatsPublisher::new(client, 4, Duration::from_secs(5));
    p.publish(msg(&topic, "k", 1))
        .await
        .expect("PubAck over TLS");
    let _ = server.kill();
    let _ = server.wait();
}
