//! `outboxd run` on a Kafka cluster that demands TLS, a SASL login or
//! both, against a real broker: a private tansu (`--authentication` checks
//! SCRAM against users made with `tansu user create`) behind a
//! TLS-terminating proxy (`private_kafka`). A relay and a consumer run end
//! to end over SSL, SASL_PLAINTEXT (SCRAM-SHA-256 and -512) and SASL_SSL,
//! with the password read by outboxd from an environment variable or a
//! file; a wrong password is refused at start, naming the mechanism and the
//! keys, and never shown. tansu accepts any PLAIN password, so a wrong
//! PLAIN password cannot be tested against it.

use std::time::{Duration, Instant};

use outboxd::config::Config;
use outboxd::daemon::Daemon;
use outboxd::fault::Faults;

use crate::support::TestDb;
use crate::support::kafka::{flows_end_to_end, pipeline_toml, unique};
use crate::support::private_kafka::{Tansu, TansuOptions, TlsProxy, free_port};
use crate::support::process::outboxd;
use crate::support::tls::TestCa;

const USER: &str = "relay";
const PASSWORD: &str = "s3cr3t-kafka-pw";

/// A private tansu demanding SASL, with `USER` for both SCRAM mechanisms.
/// Users are made while the broker runs without `--authentication` (an
/// unauthenticated client cannot make them), then it restarts with it on
/// the same storage.
async fn sasl_tansu(advertise: Option<String>, port: u16) -> (Tansu, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = TansuOptions {
        advertise,
        sqlite_dir: Some(dir.path().to_path_buf()),
        ..TansuOptions::on(port)
    };
    let open = Tansu::start(opts.clone()).await;
    open.create_user("scram256", USER, PASSWORD);
    open.create_user("scram512", USER, PASSWORD);
    drop(open);
    let guarded = Tansu::start(TansuOptions {
        authentication: true,
        ..opts
    })
    .await;
    (guarded, dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_and_a_consumer_run_end_to_end_over_ssl() {
    let ca = TestCa::new();
    let tansu_port = free_port();
    let proxy = TlsProxy::start(&ca, tansu_port).await;
    let _tansu = Tansu::start(TansuOptions {
        advertise: Some(format!("127.0.0.1:{}", proxy.port)),
        ..TansuOptions::on(tansu_port)
    })
    .await;
    let t = TestDb::sqlite().await;
    let kafka = format!(
        r#""bootstrap.servers" = "127.0.0.1:{}"
"security.protocol" = "SSL"
"ssl.ca.location" = "{}""#,
        proxy.port,
        ca.ca_file().display()
    );
    let config = Config::from_toml(
        "(test)",
        &pipeline_toml(&t.url, &unique("ssl"), &kafka),
        std::iter::empty(),
    )
    .expect("config");
    flows_end_to_end(&t, &config, 20).await;
    assert!(
        proxy.handshakes() > 0,
        "every connection went through the TLS proxy"
    );

    // A client that does not trust the CA is refused at start.
    let untrusted = format!(
        r#""bootstrap.servers" = "127.0.0.1:{}"
"security.protocol" = "SSL""#,
        proxy.port
    );
    let config = Config::from_toml(
        "(test)",
        &pipeline_toml(&t.url, &unique("ssl"), &untrusted),
        std::iter::empty(),
    )
    .expect("config");
    let Err(err) = Daemon::default()
        .spawn_pipeline(
            &config,
            &t.db,
            Faults::none(),
            tokio::sync::watch::channel(false).1,
        )
        .await
    else {
        panic!("an untrusted certificate is refused");
    };
    let err = err.to_string();
    assert!(
        err.contains("TLS handshake") && err.contains("ssl.ca.location"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_and_a_consumer_run_end_to_end_over_sasl_scram() {
    let port = free_port();
    let (_tansu, _dir) = sasl_tansu(None, port).await;
    for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let t = TestDb::sqlite().await;
        let kafka = format!(
            r#""bootstrap.servers" = "127.0.0.1:{port}"
"security.protocol" = "SASL_PLAINTEXT"
"sasl.mechanism" = "{mechanism}"
"sasl.username" = "{USER}"
"sasl.password_env" = "TEST_KAFKA_PASSWORD""#
        );
        let env = vec![("TEST_KAFKA_PASSWORD".to_string(), PASSWORD.to_string())];
        let config = Config::from_toml(
            "(test)",
            &pipeline_toml(&t.url, &unique("scram"), &kafka),
            env,
        )
        .expect("config");
        assert!(
            !format!("{config:?}").contains(PASSWORD),
            "Debug masks the password"
        );
        flows_end_to_end(&t, &config, 20).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_and_a_consumer_run_end_to_end_over_sasl_ssl() {
    let ca = TestCa::new();
    let tansu_port = free_port();
    let proxy = TlsProxy::start(&ca, tansu_port).await;
    let (_tansu, dir) = sasl_tansu(Some(format!("127.0.0.1:{}", proxy.port)), tansu_port).await;
    let password_file = dir.path().join("kafka-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).expect("password file");
    let t = TestDb::sqlite().await;
    let kafka = format!(
        r#""bootstrap.servers" = "127.0.0.1:{}"
"security.protocol" = "SASL_SSL"
"ssl.ca.location" = "{}"
"sasl.mechanism" = "SCRAM-SHA-256"
"sasl.username" = "{USER}"
"sasl.password_file" = "{}""#,
        proxy.port,
        ca.ca_file().display(),
        password_file.display()
    );
    let config = Config::from_toml(
        "(test)",
        &pipeline_toml(&t.url, &unique("sasl-ssl"), &kafka),
        std::iter::empty(),
    )
    .expect("config");
    assert_eq!(
        config
            .transport
            .kafka
            .get("sasl.password")
            .map(String::as_str),
        Some(PASSWORD),
        "the file's line break is not part of the password"
    );
    assert!(!config.transport.kafka.contains_key("sasl.password_file"));
    flows_end_to_end(&t, &config, 20).await;
    assert!(proxy.handshakes() > 0, "the traffic went through TLS");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_scram_password_is_refused_at_the_start_of_outboxd_run() {
    let port = free_port();
    let (_tansu, _dir) = sasl_tansu(None, port).await;
    let t = TestDb::sqlite().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("outboxd.toml");
    std::fs::write(
        &file,
        format!(
            r#"[transport]
kind = "kafka"
[transport.kafka]
"bootstrap.servers" = "127.0.0.1:{port}"
"security.protocol" = "SASL_PLAINTEXT"
"sasl.mechanism" = "SCRAM-SHA-256"
"sasl.username" = "{USER}"
"sasl.password_env" = "TEST_KAFKA_PASSWORD"
[[routes]]
event_type = "*"
topic = "orders"
"#
        ),
    )
    .expect("config file");
    let wrong = "not-the-password-4711";
    let started = Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        outboxd(&t)
            .args(["run", "--config"])
            .arg(&file)
            .env("TEST_KAFKA_PASSWORD", wrong)
            .output(),
    )
    .await
    .expect("outboxd run stops by itself")
    .expect("run outboxd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused: {stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "refused at once, not retried: {:?}",
        started.elapsed()
    );
    assert!(
        stderr.contains("transport.kafka")
            && stderr.contains("SASL authentication failed (SCRAM-SHA-256)")
            && stderr.contains("sasl.username")
            && stderr.contains("sasl.password_env"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(wrong),
        "the password is never shown: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unset_password_variable_is_a_config_error_naming_the_key() {
    let t = TestDb::sqlite().await;
    let text = pipeline_toml(
        &t.url,
        "orders",
        r#""bootstrap.servers" = "127.0.0.1:9"
"sasl.password_env" = "NO_SUCH_KAFKA_PASSWORD_VAR""#,
    );
    let err = Config::from_toml("(test)", &text, std::iter::empty())
        .expect_err("unset variable")
        .to_string();
    assert!(
        err.contains("transport.kafka.\"sasl.password_env\"")
            && err.contains("NO_SUCH_KAFKA_PASSWORD_VAR is not set"),
        "{err}"
    );
}
