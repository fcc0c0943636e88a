//! The sandbox limits of transformer plugins, each with an `_obeyed` and a
//! `_violated` test: deadline, memory cap, trap, output cap, fan-out cap and
//! the sandbox itself (no files, no sockets).

use std::time::{Duration, Instant};

use outboxd::plugin::{ErrorKind, PluginError};
use serde_json::json;

use crate::support::plugins::{event, json_of, load, roomy, spec};

// ---- deadline ----------------------------------------------------------

#[tokio::test]
async fn deadline_obeyed() {
    let p = load(&spec("hostile-spin"));
    let out = p.transform(&event(json!({"spin_ms": 5}))).await;
    assert_eq!(out.expect("a 5 ms spin fits the 50 ms deadline").len(), 1);
}

#[tokio::test]
async fn deadline_violated() {
    let p = load(&spec("hostile-spin"));
    let start = Instant::now();
    let err = p
        .transform(&event(json!({"spin_ms": null})))
        .await
        .expect_err("an endless loop must time out");
    assert_eq!(err, PluginError::Timeout(50));
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "took {:?}",
        start.elapsed()
    );
    // The Store was thrown away; the next call gets a fresh instance.
    let before = p.metrics().snapshot().instantiations;
    p.transform(&event(json!({"spin_ms": 1})))
        .await
        .expect("the plugin works again");
    assert_eq!(p.metrics().snapshot().instantiations, before + 1);
    assert_eq!(p.metrics().snapshot().errors_of(ErrorKind::Timeout), 1);
}

// ---- memory cap --------------------------------------------------------

#[tokio::test]
async fn memory_cap_obeyed() {
    let p = load(&roomy("hostile-memory-bomb"));
    let out = p
        .transform(&event(json!({"alloc_mib": 16})))
        .await
        .expect("16 MiB fits the 64 MiB cap");
    assert_eq!(out.len(), 1);
}

#[tokio::test]
async fn memory_cap_violated() {
    let p = load(&roomy("hostile-memory-bomb"));
    let err = p
        .transform(&event(json!({"alloc_mib": 512})))
        .await
        .expect_err("512 MiB exceeds the cap");
    assert_eq!(
        err,
        PluginError::OutOfMemory {
            cap_bytes: 64 << 20
        }
    );
    p.transform(&event(json!({"alloc_mib": 1})))
        .await
        .expect("a fresh instance works");
}

// ---- traps -------------------------------------------------------------

#[tokio::test]
async fn trap_obeyed() {
    let p = load(&spec("hostile-panic"));
    p.transform(&event(json!({"panic": false})))
        .await
        .expect("no panic, no trap");
}

#[tokio::test]
async fn trap_violated() {
    let p = load(&spec("hostile-panic"));
    let err = p
        .transform(&event(json!({"panic": true})))
        .await
        .expect_err("a panic is a trap");
    assert!(matches!(err, PluginError::Trap(_)), "{err:?}");
    assert!(!err.is_permanent());
    p.transform(&event(json!({"panic": false})))
        .await
        .expect("a fresh instance works");
}

// ---- output caps -------------------------------------------------------

#[tokio::test]
async fn output_cap_obeyed() {
    let p = load(&roomy("hostile-huge-output"));
    let out = p
        .transform(&event(json!({"bytes": 100_000, "count": 3})))
        .await
        .expect("300 kB in 3 messages is within the caps");
    assert_eq!(out.len(), 3);
}

#[tokio::test]
async fn output_cap_violated() {
    let p = load(&roomy("hostile-huge-output"));
    let err = p
        .transform(&event(json!({"bytes": 4 << 20})))
        .await
        .expect_err("4 MiB exceeds max_output_bytes");
    assert!(
        matches!(err, PluginError::OutputTooLarge { cap, .. } if cap == 1 << 20),
        "{err:?}"
    );
}

#[tokio::test]
async fn fan_out_cap_obeyed() {
    let mut s = roomy("hostile-huge-output");
    s.limits.max_outputs = 10;
    let out = load(&s)
        .transform(&event(json!({"bytes": 1, "count": 10})))
        .await
        .expect("10 outputs are allowed");
    assert_eq!(out.len(), 10);
}

#[tokio::test]
async fn fan_out_cap_violated() {
    let mut s = roomy("hostile-huge-output");
    s.limits.max_outputs = 10;
    let err = load(&s)
        .transform(&event(json!({"bytes": 1, "count": 11})))
        .await
        .expect_err("11 outputs exceed the cap");
    assert_eq!(err, PluginError::TooManyOutputs { count: 11, cap: 10 });
}

// ---- files, sockets, environment ---------------------------------------

#[tokio::test]
async fn sandbox_obeyed() {
    let p = load(&spec("hostile-escape"));
    let out = p.transform(&event(json!({}))).await.expect("forwarded");
    assert_eq!(json_of(&out[0].payload), json!({}));
}

#[tokio::test]
async fn sandbox_violated() {
    // Something is listening, so only the sandbox can refuse the connect.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let secret = std::env::temp_dir().join(format!("outboxd-secret-{}", std::process::id()));
    std::fs::write(&secret, "the secret").expect("write");
    let p = load(&spec("hostile-escape"));
    let out = p
        .transform(&event(json!({
            "file": secret.display().to_string(),
            "connect": addr.to_string(),
            "env": "PATH",
        })))
        .await
        .expect("the plugin reports what it could do");
    let report = json_of(&out[0].payload);
    for key in ["file", "connect", "env"] {
        let verdict = report[key].as_str().expect("a verdict");
        assert!(verdict.starts_with("denied"), "{key}: {verdict}");
    }
    assert!(!report.to_string().contains("the secret"));
    let _ = std::fs::remove_file(secret);
}

// ---- the example plugins -----------------------------------------------
