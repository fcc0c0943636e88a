//! Against a redis-server of the test's own on a free port: a restart
//! with AOF (`appendfsync always`) loses no acknowledged entry, a group or
//! a pending entry, a wrong password is refused with the fix, and
//! `rediss://` verifies the server against `ca_file`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use outboxd::broker::redis::{RedisConsumer, RedisConsumerConfig, RedisPublisher, client, start};
use outboxd::broker::{MessageSource, Publisher};
use outboxd::config::{RedisSecret, RedisSection, RedisUrl};
use outboxd::message::Delivery;

use crate::support::publisher::msg;
use crate::support::tls::TestCa;
use crate::support::{TestDb, eventually, on_both};

/// A redis-server of this test's own, persisting to an append-only file in
/// a directory of its own; killed when the test ends.
struct OwnRedis {
    child: std::process::Child,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl OwnRedis {
    async fn start(extra: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("free port")
            .local_addr()
            .expect("addr")
            .port();
        let dir = tempfile::tempdir().expect("tempdir");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let child = Self::spawn(port, dir.path(), &extra).await;
        Self {
            child,
            port,
            dir,
            extra,
        }
    }

    async fn spawn(port: u16, dir: &std::path::Path, extra: &[String]) -> std::process::Child {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(dir)
            // `{port}` in an argument is the server's port (a TLS port).
            .args(extra.iter().map(|a| a.replace("{port}", &port.to_string())))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (Debian's redis-server package) starts");
        eventually(
            Duration::from_secs(10),
            "redis-server listening",
            async || {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .map(|_| ())
            },
        )
        .await;
        child
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// SIGKILL, then the same server again on the same port and files.
    async fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Self::spawn(self.port, self.dir.path(), &self.extra).await;
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn n_of(d: &Delivery) -> u64 {
    serde_json::from_slice::<serde_json::Value>(&d.payload).expect("json")["n"]
        .as_u64()
        .expect("n")
}

/// Fetches, handles (records) and commits until `want` messages are
/// handled, riding out the errors of a server that is restarting.
async fn handle(c: &mut RedisConsumer, handled: &mut Vec<Delivery>, want: usize) {
    eventually(
        Duration::from_secs(30),
        format!("{want} handled"),
        async || {
            if let Ok(got) = c.fetch(1000).await {
                let mut last = BTreeMap::new();
                for d in got {
                    last.insert(d.partition, d.clone());
                    handled.push(d);
                }
                if let Err(e) = c.commit_all(last.into_values().collect()).await {
                    return Err(e.to_string());
                }
            }
            if handled.len() >= want {
                Ok(())
            } else {
                Err(format!("{} handled", handled.len()))
            }
        },
    )
    .await;
}

/// A restart of Redis with AOF loses nothing: what was acknowledged to
/// the relay is there after it, the group and its pending entries too, and
/// the consumer goes on where its cursor is, each message handled once and
/// in key order.
async fn a_redis_restart_with_aof_loses_nothing(t: TestDb) {
    let mut server = OwnRedis::start(&[]).await;
    let section = RedisSection {
        url: RedisUrl(server.url()),
        fetch_wait: Duration::from_millis(100),
        ..RedisSection::default()
    };
    let topic = "orders".to_string();
    let c = start(&section, &BTreeSet::from([topic.clone()]), 4, true)
        .await
        .expect("streams created");
    let p = RedisPublisher::new(&c, 4, 1_000_000, Duration::from_secs(5))
        .await
        .expect("publisher");
    let mut consumer = RedisConsumer::new(
        t.db.clone(),
        client(&section).expect("client"),
        RedisConsumerConfig {
            group: "billing".into(),
            topics: vec![topic.clone()],
            partitions: 4,
            lease: Duration::from_secs(15),
            fetch_wait: Duration::from_millis(100),
            batch: 100,
        },
    );
    for n in 0..20 {
        p.publish(msg(&topic, &format!("k{}", n % 4), n as usize))
            .await
            .expect("publish");
    }
    let mut handled = Vec::new();
    handle(&mut consumer, &mut handled, 20).await;
    // Read and not committed when the server dies: pending in the group.
    for n in 20..30 {
        p.publish(msg(&topic, &format!("k{}", n % 4), n as usize))
            .await
            .expect("publish");
    }
    let unhandled = eventually(Duration::from_secs(10), "10 read", async || {
        let got = consumer.fetch(1000).await.map_err(|e| e.to_string())?;
        if got.len() == 10 {
            Ok(got)
        } else {
            Err(format!("{}", got.len()))
        }
    })
    .await;
    assert_eq!(unhandled.len(), 10);
    server.restart().await;
    // The publisher's connection comes back; its first publish may see the
    // old connection's loss, which the relay retries.
    for n in 30..40 {
        let m = msg(&topic, &format!("k{}", n % 4), n as usize);
        eventually(
            Duration::from_secs(15),
            "published after the restart",
            async || p.publish(m.clone()).await,
        )
        .await;
    }
    handle(&mut consumer, &mut handled, 40).await;
    let ns: BTreeSet<u64> = handled.iter().map(n_of).collect();
    assert_eq!(
        (handled.len(), ns.len()),
        (40, 40),
        "each message handled once, none lost"
    );
    for k in 0..4 {
        let key = format!("k{k}").into_bytes();
        let order: Vec<u64> = handled
            .iter()
            .filter(|d| d.key.as_deref() == Some(&key[..]))
            .map(n_of)
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "key k{k}: {order:?}");
    }
    consumer.release().await.expect("release");
}
on_both!(a_redis_restart_with_aof_loses_nothing);

#[tokio::test]
async fn a_wrong_password_is_refused_with_the_fix_and_shows_no_secret() {
    let server = OwnRedis::start(&["--requirepass", "right-secret-1"]).await;
    let mut s = RedisSection {
        url: RedisUrl(server.url()),
        password: Some(RedisSecret("wrong-secret-2".into())),
        ..RedisSection::default()
    };
    let topics = BTreeSet::from(["orders".to_string()]);
    for password in [Some("wrong-secret-2"), None] {
        s.password = password.map(|p| RedisSecret(p.into()));
        let e = start(&s, &topics, 4, true).await.expect_err("refused");
        let text = e.to_string();
        assert!(
            text.contains(&server.url())
                && text.contains("refused the login")
                && text.contains("transport.redis.password_env"),
            "{text}"
        );
        assert!(
            !text.contains("wrong-secret-2") && !text.contains("right-secret-1"),
            "{text}"
        );
        assert!(!e.is_transient(), "a refused login is not retried: {text}");
    }
    s.password = Some(RedisSecret("right-secret-1".into()));
    start(&s, &topics, 4, true)
        .await
        .expect("the right password connects");
    // The password in the URL works as well, and never shows.
    let in_url = RedisSection {
        url: RedisUrl(format!("redis://:right-secret-1@127.0.0.1:{}", server.port)),
        ..RedisSection::default()
    };
    let c = start(&in_url, &topics, 4, false).await.expect("connects");
    assert!(!format!("{c:?}").contains("right-secret-1"), "{c:?}");
}

#[tokio::test]
async fn rediss_verifies_the_server_against_the_ca_file_and_carries_messages() {
    let ca = TestCa::new();
    let dir = ca.dir.path();
    let (cert, key, ca_pem) = (
        dir.join("server.pem").display().to_string(),
        dir.join("server.key").display().to_string(),
        ca.ca_file().display().to_string(),
    );
    let server = OwnRedis::start(&[
        "--port",
        "0",
        "--tls-port",
        "{port}",
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca_pem,
        "--tls-auth-clients",
        "no",
    ])
    .await;
    let topics = BTreeSet::from(["orders".to_string()]);
    let mut s = RedisSection {
        url: RedisUrl(format!("rediss://127.0.0.1:{}", server.port)),
        ..RedisSection::default()
    };
    // Mozilla's roots do not know the test's CA: refused, not retried.
    let e = start(&s, &topics, 4, true)
        .await
        .expect_err("an unknown CA");
    assert!(
        !e.is_transient() && e.to_string().contains("transport.redis.ca_file"),
        "{e}"
    );
    s.ca_file = Some(ca_pem.clone());
    let c = start(&s, &topics, 4, true).await.expect("verified");
    let p = RedisPublisher::new(&c, 4, 1000, Duration::from_secs(5))
        .await
        .expect("publisher");
    p.publish(msg("orders", "k", 1))
        .await
        .expect("acknowledged");
}
