//! Postgres over TLS, libpq's way, against a throwaway cluster that
//! accepts TLS only (tests/pg-tls.sh, its certificates made by the openssl
//! command): `outboxd run` with `sslmode=verify-full`, a client
//! certificate and the WAL relay relays and consumes with every backend
//! encrypted; SCRAM over TLS; each bad certificate refused at start with
//! the URL (password hidden), the reason and the fix; and `sslmode=require`
//! on the local cluster.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use outboxd::event::NewEvent;
use outboxd::store::{Db, enqueue, migrate};
use serde_json::json;
use sqlx::Row;

use crate::support::admin::{TOKEN, http};
use crate::support::process::outboxd_demo_binary;
use crate::support::{eventually, pg_admin_url, wal_config_toml};

/// A running TLS-only cluster; stopped and removed when dropped.
struct TlsCluster {
    dir: PathBuf,
    port: u16,
}

impl TlsCluster {
    fn start() -> TlsCluster {
        let dir = std::env::temp_dir().join(format!("outboxd-pgtls-{}", uuid::Uuid::new_v4()));
        let out = std::process::Command::new("bash")
            .arg(repo().join("tests/pg-tls.sh"))
            .arg("start")
            .arg(&dir)
            .output()
            .expect("run bash tests/pg-tls.sh");
        let mut cluster = TlsCluster { dir, port: 0 };
        assert!(
            out.status.success(),
            "tests/pg-tls.sh could not start a TLS cluster (it needs initdb, pg_ctl and openssl; \
             Debian: apt-get install postgresql openssl):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.port = String::from_utf8_lossy(&out.stdout)
            .trim()
            .strip_prefix("PORT=")
            .and_then(|p| p.parse().ok())
            .expect("tests/pg-tls.sh prints PORT=N");
        cluster
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// The URL of the client-certificate role, verifying everything.
    fn cert_url(&self) -> String {
        format!(
            "postgres://outboxd_tls_cert@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
            self.port,
            self.file("ca.pem"),
            self.file("client.pem"),
            self.file("client.key")
        )
    }

    /// The URL of the SCRAM role (its password in it), on `host`, with
    /// `params` after it.
    fn scram_url(&self, host: &str, params: &str) -> String {
        format!(
            "postgres://outboxd_tls_scram:scram-over-tls@{host}:{}/postgres?{params}",
            self.port
        )
    }
}

impl Drop for TlsCluster {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(repo().join("tests/pg-tls.sh"))
            .arg("stop")
            .arg(&self.dir)
            .output();
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// `outboxd-demo` (outboxd with the example's `builtin:billing` consumer)
/// with `config`.
fn outboxd_demo(config: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(outboxd_demo_binary());
    cmd.arg("--config")
        .arg(config)
        .env_remove("OUTBOXD_FAULT")
        .env_remove("OUTBOXD_LOG")
        .kill_on_drop(true);
    cmd
}

async fn count(db: &Db, sql: &str) -> i64 {
    let Db::Postgres(p) = db else {
        panic!("Postgres only")
    };
    sqlx::query_scalar(sql).fetch_one(p).await.expect(sql)
}

/// The WAL relay and a consumer over `sslmode=verify-full` with the test
/// CA, logged in by client certificate: every event is relayed and
/// consumed, and `pg_stat_ssl` shows every one of outboxd's backends (the
/// pools' and the replication connection) encrypted, as `outboxd stats`
/// reports.
#[tokio::test]
async fn wal_relay_and_consumer_run_over_verify_full_with_a_client_certificate() {
    let c = TlsCluster::start();
    let url = c.cert_url();
    let db = Db::connect(&url, 4).await.expect("connect over TLS");
    migrate(&db).await.expect("migrate over TLS");
    outboxd_demo::billing::create_schema(&db)
        .await
        .expect("billing tables");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("outboxd.toml");
    let admin_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let extra = format!(
        r#"
[admin]
enabled = true
listen = "{admin_addr}"
token = "{TOKEN}"

[[consumers]]
name = "billing"
topics = ["order.confirmed"]
handler = "builtin:billing"
"#
    );
    std::fs::write(&config, wal_config_toml(&url, "outboxd_tls", &extra)).expect("config");
    let migrated = outboxd_demo(&config)
        .arg("migrate")
        .output()
        .await
        .expect("outboxd-demo migrate");
    assert!(
        migrated.status.success(),
        "migrate (creates the slot over TLS): {}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let mut run = outboxd_demo(&config)
        .arg("run")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn outboxd-demo run");
    let Db::Postgres(pool) = &db else {
        unreachable!()
    };
    for i in 0..60 {
        let mut tx = pool.begin().await.expect("begin");
        enqueue(
            &mut tx,
            NewEvent::new(
                format!("order-{i}"),
                "order.confirmed",
                json!({ "order_id": format!("order-{i}"), "customer_id": "c", "total_cents": 100 + i }),
            ),
        )
        .await
        .expect("enqueue");
        tx.commit().await.expect("commit");
    }
    eventually(
        Duration::from_secs(60),
        "60 orders were not all invoiced over TLS",
        async || {
            let invoiced = count(&db, "SELECT count(*) FROM invoices").await;
            if invoiced >= 60 {
                return Ok(());
            }
            assert!(
                run.try_wait().expect("try_wait").is_none(),
                "outboxd-demo run exited"
            );
            Err(invoiced)
        },
    )
    .await;
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM outboxd.outbox WHERE published_at IS NULL"
        )
        .await,
        0
    );
    let rows = sqlx::query(
        "SELECT a.application_name, coalesce(s.ssl, false) FROM pg_stat_activity a \
           LEFT JOIN pg_stat_ssl s ON s.pid = a.pid \
          WHERE a.application_name LIKE 'outboxd%' AND a.pid <> pg_backend_pid()",
    )
    .fetch_all(pool)
    .await
    .expect("pg_stat_ssl");
    let backends: Vec<(String, bool)> = rows
        .iter()
        .map(|r| (r.get::<String, _>(0), r.get::<bool, _>(1)))
        .collect();
    assert!(
        backends
            .iter()
            .any(|(name, _)| name == "outboxd-relay outboxd_tls"),
        "the WAL relay's replication connection is among the backends: {backends:?}"
    );
    assert!(
        backends.iter().any(|(name, _)| name == "outboxd"),
        "the pools' connections are among the backends: {backends:?}"
    );
    assert!(
        backends.iter().all(|(_, ssl)| *ssl),
        "every outboxd backend is encrypted: {backends:?}"
    );
    let stats = outboxd_demo(&config)
        .args(["stats", "--json"])
        .output()
        .await
        .expect("outboxd stats");
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap_or_else(|e| {
        panic!(
            "stats --json: {e}: {}",
            String::from_utf8_lossy(&stats.stderr)
        )
    });
    let connections = stats["connections"].as_array().expect("connections");
    assert!(
        !connections.is_empty()
            && connections
                .iter()
                .all(|c| c["encrypted"] == json!(true) && c["version"].is_string()),
        "stats says every connection is encrypted: {connections:?}"
    );
    let (status, body) = http(admin_addr, "GET", "/api/stats", Some(TOKEN), None).await;
    assert_eq!(status, 200, "{body}");
    let api: serde_json::Value = serde_json::from_str(&body).expect("/api/stats is JSON");
    let connections = api["connections"]
        .as_array()
        .expect("connections in /api/stats");
    assert!(
        connections
            .iter()
            .any(|c| c["application_name"] == json!("outboxd-relay outboxd_tls"))
            && connections.iter().all(|c| c["encrypted"] == json!(true)),
        "/api/stats says every connection, the replication one too, is encrypted: {connections:?}"
    );
    run.start_kill().expect("stop the run");
    let _ = run.wait().await;
}

/// A role that logs in with SCRAM over TLS, and the client-certificate
/// role without its certificate refused by the server.
#[tokio::test]
async fn scram_over_tls_connects_and_a_missing_client_certificate_is_refused() {
    let c = TlsCluster::start();
    let url = c.scram_url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", c.file("ca.pem")),
    );
    let db = Db::connect(&url, 2).await.expect("SCRAM over TLS");
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl"
        )
        .await,
        1
    );
    db.close().await;
    let no_cert = format!(
        "postgres://outboxd_tls_cert@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}",
        c.port,
        c.file("ca.pem")
    );
    let e = Db::connect(&no_cert, 1).await.expect_err("no certificate");
    assert!(e.to_string().contains("certificate"), "{e}");
}

/// `sslmode=require` on the local cluster (Debian's self-signed
/// certificate): encrypted, without verification.
#[tokio::test]
async fn sslmode_require_connects_to_the_local_cluster() {
    let admin = pg_admin_url();
    let sep = if admin.contains('?') { '&' } else { '?' };
    let url = format!("{admin}{sep}sslmode=require");
    let db = Db::connect(&url, 1).await.unwrap_or_else(|e| {
        panic!(
            "{admin} with sslmode=require: {e}. The server must run with ssl = on \
             (the local cluster on 127.0.0.1:5432 does, with Debian's snakeoil certificate)"
        )
    });
    let Db::Postgres(pool) = &db else {
        unreachable!()
    };
    let tls = outboxd::store::backend::pg_tls::connection_tls(pool)
        .await
        .expect("connection_tls");
    let own: Vec<_> = tls
        .iter()
        .filter(|c| c.application_name == "outboxd")
        .collect();
    assert!(
        !own.is_empty() && own.iter().all(|c| c.encrypted),
        "{tls:?}"
    );
}

/// Runs `outboxd run` against `url` and returns what it printed when it
/// gave up; it must give up at start, not retry for a minute.
async fn refused_at_start(url: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("outboxd.toml");
    std::fs::write(
        &config,
        format!("[database]\nurl = \"{url}\"\n[relay]\nworkers = 1\n"),
    )
    .expect("config");
    let started = Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(40),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
            .arg("--config")
            .arg(&config)
            .arg("run")
            .env_remove("OUTBOXD_LOG")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("outboxd run kept trying {url} for 40 s instead of refusing it"))
    .expect("outboxd run");
    assert!(!out.status.success(), "outboxd run started with {url}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "refused only after {:?}",
        started.elapsed()
    );
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !text.contains("scram-over-tls"),
        "the password leaked into the error: {text}"
    );
    assert!(
        text.contains("outboxd_tls_scram:***@"),
        "the error names the URL, password hidden: {text}"
    );
    text
}

/// A TCP endpoint that answers Postgres's SSLRequest and then presents
/// `cert` (an expired certificate), as a server with a lapsed certificate
/// would.
async fn tls_endpoint(cert: &str, key: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    let chain = rustls::pki_types::CertificateDer::pem_file_iter(cert)
        .expect("cert")
        .collect::<Result<Vec<_>, _>>()
        .expect("cert");
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(
        rustls::crypto::ring::default_provider().into(),
    )
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let mut request = [0u8; 8];
                if sock.read_exact(&mut request).await.is_ok() && sock.write_all(b"S").await.is_ok()
                {
                    let _ = acceptor.accept(sock).await;
                }
            });
        }
    });
    port
}

/// Each bad certificate fails `outboxd run` at start with the URL
/// (password hidden), the reason and the fix: a certificate for another
/// host under verify-full, an unknown CA, an expired certificate, a
/// missing `sslrootcert` file, and a client key that does not match its
/// certificate.
#[tokio::test]
async fn bad_certificates_are_refused_at_start_with_the_reason_and_the_fix() {
    let c = TlsCluster::start();
    let ca = c.file("ca.pem");

    let text = refused_at_start(&c.scram_url(
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .await;
    assert!(
        text.contains("not valid for name") && text.contains("sslmode=verify-ca"),
        "another host's certificate: {text}"
    );

    let text = refused_at_start(&c.scram_url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", c.file("other-ca.pem")),
    ))
    .await;
    assert!(
        text.contains("UnknownIssuer") && text.contains("set sslrootcert to the CA"),
        "an unknown CA: {text}"
    );

    let port = tls_endpoint(&c.file("expired.pem"), &c.file("expired.key")).await;
    let text = refused_at_start(&format!(
        "postgres://outboxd_tls_scram:scram-over-tls@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={ca}"
    ))
    .await;
    assert!(
        text.to_lowercase().contains("expired") && text.contains("renew the server's certificate"),
        "an expired certificate: {text}"
    );

    let missing = c.file("no-such-ca.pem");
    let text = refused_at_start(&c.scram_url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={missing}"),
    ))
    .await;
    assert!(
        text.contains(&format!("sslrootcert {missing} cannot be read"))
            && text.contains("point sslrootcert at a readable PEM file"),
        "a missing sslrootcert: {text}"
    );

    let text = refused_at_start(&c.scram_url(
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={ca}&sslcert={}&sslkey={}",
            c.file("client.pem"),
            c.file("stray.key")
        ),
    ))
    .await;
    assert!(
        text.contains("does not belong to sslcert")
            && text.contains("the client certificate was issued for"),
        "a key of another certificate: {text}"
    );
}
