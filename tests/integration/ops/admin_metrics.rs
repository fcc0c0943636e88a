//! What the admin API reports of the daemon's other work: retention and
//! reconciliation running on their schedules, and a transformer chain's
//! plugins in the plugin list and in /metrics.

use std::time::Duration;

use outboxd::daemon::Daemon;

use crate::support::admin::{TOKEN, admin_config, http, put_confirmed};
use crate::support::pipeline::Pipeline;
use crate::support::plugins::plugin_path;
use crate::support::{TestDb, eventually, on_both};

/// Retention and reconciliation run on their schedules inside the daemon,
/// and report through the metrics.
async fn scheduled_retention_and_reconciliation_run_inside_the_daemon(t: TestDb) {
    outboxd_demo::orders::create_schema(&t.db)
        .await
        .expect("orders");
    outboxd_demo::orders::create_order(&t.db, "o1", "c", 100)
        .await
        .expect("order");
    t.exec("UPDATE orders SET status = 'confirmed' WHERE id = 'o1'")
        .await;
    put_confirmed(&t.db, "old").await;
    let long_ago = if t.is_postgres() {
        "now() - interval '30 days'"
    } else {
        "0"
    };
    t.exec(&format!("UPDATE outbox SET published_at = {long_ago}"))
        .await;

    let mut config = admin_config(&t.url);
    config.retention.interval_seconds = 1;
    config.admin.reconcile_interval_seconds = 1;
    config.reconcile = vec![outboxd::config::ReconcileRule {
        name: "confirmed-orders".into(),
        query: "SELECT o.id, 'order.confirmed', '{}' FROM orders o WHERE o.status = 'confirmed'
                 AND NOT EXISTS (SELECT 1 FROM outbox e WHERE e.aggregate_id = o.id)"
            .into(),
        enqueue_missing: false,
    }];
    let pipeline = Pipeline::start(Daemon::default(), &config, &t.db).await;
    let addr = pipeline.addr();
    let metrics = eventually(
        Duration::from_secs(10),
        "retention and reconciliation in /metrics",
        async || {
            let metrics = http(addr, "GET", "/metrics", Some(TOKEN), None).await.1;
            if metrics.contains("outboxd_reconcile_missing{rule=\"confirmed-orders\"} 1")
                && metrics.contains("outboxd_retention_deleted_total{table=\"outbox\"} 1")
            {
                Ok(metrics)
            } else {
                Err(metrics)
            }
        },
    )
    .await;
    assert!(
        metrics.contains("outboxd_reconcile_missing{rule=\"confirmed-orders\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("outboxd_retention_deleted_total{table=\"outbox\"} 1"),
        "{metrics}"
    );
    assert_eq!(t.count("SELECT count(*) FROM outbox").await, 0);
    pipeline.stop().await;
}
on_both!(scheduled_retention_and_reconciliation_run_inside_the_daemon);

/// With a transformer chain configured, the plugins endpoint lists it and
/// /metrics carries its calls, errors, latency and memory per version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_metrics_and_list_are_served() {
    let t = TestDb::sqlite().await;
    put_confirmed(&t.db, "o1").await;
    let mut config = admin_config(&t.url);
    config.plugins = vec![outboxd::config::PluginSpec::new(
        "cloudevents",
        plugin_path("cloudevents"),
    )];
    let mut route = outboxd::route::Route::new("order.*", "orders");
    route.transformers = vec!["cloudevents".into()];
    config.routes = vec![route];
    let pipeline = Pipeline::start(Daemon::default(), &config, &t.db).await;
    let addr = pipeline.addr();
    t.wait_count(
        Duration::from_secs(15),
        "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL",
        1,
    )
    .await;
    let (_, list) = http(addr, "GET", "/api/plugins/loaded", Some(TOKEN), None).await;
    let list: Vec<serde_json::Value> = serde_json::from_str(&list).expect("json");
    assert_eq!(list.len(), 1);
    assert_eq!(
        (list[0]["name"].as_str(), list[0]["calls"].as_u64()),
        (Some("cloudevents"), Some(1))
    );
    let (_, metrics) = http(addr, "GET", "/metrics", Some(TOKEN), None).await;
    for needle in [
        "outboxd_plugin_calls_total{plugin=\"cloudevents\"",
        "outboxd_plugin_call_seconds_count{plugin=\"cloudevents\"",
        "outboxd_plugin_errors_total{plugin=\"cloudevents\"",
        "outboxd_plugin_memory_high_water_bytes{plugin=\"cloudevents\"",
    ] {
        assert!(metrics.contains(needle), "metrics lack `{needle}`");
    }
    let high_water: u64 = metrics
        .lines()
        .find(|l| l.starts_with("outboxd_plugin_memory_high_water_bytes{plugin=\"cloudevents\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .expect("memory gauge");
    assert!(high_water > 0, "the instance's memory is recorded");
    pipeline.stop().await;
}
