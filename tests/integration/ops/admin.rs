//! The admin API against a running pipeline: probes, auth, metrics, stats
//! and the dead-letter endpoints. `admin_metrics.rs` has the scheduled jobs
//! and the plugins as the admin API reports them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use outboxd::config::Config;
use outboxd::daemon::Daemon;

use crate::support::admin::{TOKEN, admin_config, http, put_confirmed};
use crate::support::pipeline::Pipeline;
use crate::support::{ScriptedPublisher, TestDb, on_both};

async fn admin_api_probes_auth_metrics_and_dead_letters(t: TestDb) {
    // Two events die through a permanent broker error before the daemon starts.
    put_confirmed(&t.db, "a1").await;
    put_confirmed(&t.db, "a2").await;
    let broker = ScriptedPublisher::failing();
    broker.permanent.store(true, Ordering::SeqCst);
    t.relay(broker.clone()).step().await.expect("step");

    let pipeline = Pipeline::start(Daemon::default(), &admin_config(&t.url), &t.db).await;
    let addr = pipeline.addr();

    assert_eq!(http(addr, "GET", "/healthz", None, None).await.0, 200);
    assert_eq!(http(addr, "GET", "/readyz", None, None).await.0, 200);
    let (status, page) = http(addr, "GET", "/", None, None).await;
    assert_eq!(status, 200);
    assert!(
        page.contains("<title>outboxd</title>")
            && !page.contains("http://")
            && !page.contains("https://"),
        "self-contained page"
    );

    for path in ["/metrics", "/api/stats", "/api/dead", "/api/plugins"] {
        assert_eq!(
            http(addr, "GET", path, None, None).await.0,
            401,
            "{path} without a token"
        );
        assert_eq!(
            http(addr, "GET", path, Some("wrong-token-wrong-token"), None)
                .await
                .0,
            401,
            "{path} with a wrong token"
        );
    }
    assert_eq!(
        http(addr, "POST", "/api/dead/1/redrive", None, None)
            .await
            .0,
        401
    );

    let (status, stats) = http(addr, "GET", "/api/stats", Some(TOKEN), None).await;
    assert_eq!(status, 200);
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("stats json");
    assert_eq!(stats["dead"], 2);

    let (_, dead) = http(addr, "GET", "/api/dead", Some(TOKEN), None).await;
    let dead: Vec<serde_json::Value> = serde_json::from_str(&dead).expect("dead json");
    assert_eq!(dead.len(), 2);
    let (s1, s2) = (
        dead[0]["seq"].as_i64().expect("seq"),
        dead[1]["seq"].as_i64().expect("seq"),
    );
    assert_eq!(
        http(addr, "GET", &format!("/api/dead/{s1}"), Some(TOKEN), None)
            .await
            .0,
        200
    );
    assert_eq!(
        http(addr, "GET", "/api/dead/999999", Some(TOKEN), None)
            .await
            .0,
        404
    );
    assert_eq!(
        http(addr, "POST", "/api/dead/redrive", Some(TOKEN), None)
            .await
            .0,
        400,
        "a filter is required"
    );

    // Redrive one: the running relay publishes it over the embedded transport.
    let (status, body) = http(
        addr,
        "POST",
        &format!("/api/dead/{s1}/redrive"),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(
        (status, body.contains("\"redriven\":1")),
        (200, true),
        "{body}"
    );
    t.wait_count(
        Duration::from_secs(10),
        &format!("SELECT count(*) FROM outbox WHERE seq = {s1} AND published_at IS NOT NULL"),
        1,
    )
    .await;
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM outbox WHERE seq = {s1} AND published_at IS NOT NULL"
        ))
        .await,
        1
    );

    // Discard the other, with and without a reason.
    assert_eq!(
        http(
            addr,
            "POST",
            &format!("/api/dead/{s2}/discard"),
            Some(TOKEN),
            Some("{\"reason\":\"\"}")
        )
        .await
        .0,
        400
    );
    let (status, _) = http(
        addr,
        "POST",
        &format!("/api/dead/{s2}/discard"),
        Some(TOKEN),
        Some("{\"reason\":\"obsolete\"}"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        http(
            addr,
            "POST",
            &format!("/api/dead/{s2}/discard"),
            Some(TOKEN),
            Some("{\"reason\":\"again\"}")
        )
        .await
        .0,
        404
    );

    let (status, metrics) = http(addr, "GET", "/metrics", Some(TOKEN), None).await;
    assert_eq!(status, 200);
    for needle in [
        "outboxd_outbox_pending 0",
        "outboxd_outbox_oldest_pending_age_seconds",
        "outboxd_outbox_dead 0",
        "outboxd_outbox_blocked_aggregates 0",
        "outboxd_relay_published_total 1",
        "outboxd_relay_lag_seconds_count 1",
    ] {
        assert!(
            metrics.contains(needle),
            "metrics lack `{needle}`:\n{metrics}"
        );
    }

    pipeline.stop().await;
}
on_both!(admin_api_probes_auth_metrics_and_dead_letters);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_reports_an_unreachable_database() {
    let t = TestDb::postgres().await;
    let pipeline = Pipeline::start(Daemon::default(), &admin_config(&t.url), &t.db).await;
    let addr = pipeline.addr();
    assert_eq!(http(addr, "GET", "/readyz", None, None).await.0, 200);
    t.db.close().await;
    let (status, body) = http(addr, "GET", "/readyz", None, None).await;
    assert_eq!(status, 503);
    // The probe answers a status word; the failing check is named in
    // /api/stats, behind the token.
    assert_eq!(body, "not ready\n");
    let (_, stats) = http(addr, "GET", "/api/stats", Some(TOKEN), None).await;
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("stats json");
    assert_eq!(
        stats["readiness"]["checks"]["database"]["ok"], false,
        "{stats}"
    );
    pipeline.stop_tx.send(true).expect("stop");
    let _ = outboxd::daemon::join_all_workers(pipeline.set).await;
}

#[test]
fn admin_without_a_token_is_refused_at_startup() {
    let err = Config::from_toml("t.toml", "[admin]\nenabled = true\n", std::iter::empty())
        .expect_err("no token");
    assert!(
        err.to_string().contains("admin.token")
            && err.to_string().contains("OUTBOXD__ADMIN__TOKEN"),
        "{err}"
    );
}
