//! `/metrics` and `/api/plugins` report every plugin version the daemon
//! runs, of both worlds: a file transformer, the registry consumer plugin's
//! first version, and a version deployed after start, first as a shadow
//! candidate and then activated, while orders flow the whole time; and a
//! file consumer plugin, once however many consumers run it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use outboxd::config::ConsumerSection;
use outboxd::config::PluginSpec;
use outboxd::daemon::Daemon;
use outboxd::plugin::lifecycle::registry::Registry;
use outboxd::route::Route;
use outboxd_demo::billing;

use crate::support::admin::{TOKEN, admin_config, http};
use crate::support::db::pairs;
use crate::support::pipeline::Pipeline;
use crate::support::plugins::{plugin_path, registry_spec, wasm};
use crate::support::swap::{deploy, put_order};
use crate::support::{TestDb, eventually, on_both};

/// `outboxd_plugin_calls_total` and the latency count of each version, by
/// `(plugin, version)`, from a `/metrics` text.
fn plugin_series(metrics: &str, family: &str) -> BTreeMap<(String, String), u64> {
    let mut found = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(family).and_then(|r| r.strip_prefix('{')) else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
        };
        if let (Some(p), Some(v), Ok(n)) = (label("plugin"), label("version"), value.parse()) {
            // The same series twice would be an invalid exposition.
            assert!(
                found.insert((p.clone(), v.clone()), n).is_none(),
                "{family} has {p}@{v} twice:\n{metrics}"
            );
        }
    }
    found
}

/// What the consumer did, for a failure message: inbox rows per version,
/// dead letters, and the plugin lines of /metrics.
async fn diagnose(t: &TestDb, addr: std::net::SocketAddr) -> String {
    let handled = pairs(
        &t.db,
        "SELECT COALESCE(handled_by, '?'), CAST(count(*) AS TEXT) FROM inbox GROUP BY handled_by",
    )
    .await;
    let dead = pairs(
        &t.db,
        "SELECT handler, error FROM consumer_dead_letters ORDER BY id LIMIT 3",
    )
    .await;
    let (_, metrics) = http(addr, "GET", "/metrics", Some(TOKEN), None).await;
    let plugins: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("outboxd_plugin_calls") || l.starts_with("outboxd_plugin_errors"))
        .collect();
    format!(
        "inbox by version {handled:?}\ndead letters {dead:?}\n{}",
        plugins.join("\n")
    )
}

/// Waits (60 s at most) until `done` holds; on a timeout, says what the
/// consumer did.
async fn until(
    t: &TestDb,
    addr: std::net::SocketAddr,
    what: &str,
    mut done: impl AsyncFnMut() -> bool,
) {
    eventually(Duration::from_secs(60), what, async || {
        if done().await {
            Ok(())
        } else {
            Err(format!("\n{}", diagnose(t, addr).await))
        }
    })
    .await
}

async fn a_consumer_version_activated_under_load_is_in_metrics_and_the_plugin_list(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let reg = Registry::new(t.db.clone());
    let v1 = deploy(&reg, "c", wasm("billing")).await;
    reg.activate("c", v1, "test").await.expect("activate v1");

    let mut config = admin_config(&t.url);
    config.plugins = vec![
        registry_spec("c"),
        PluginSpec::new("redact-pii", plugin_path("redact-pii")),
    ];
    config.routes = vec![Route::new("order.*", "orders").with_transformers(&["redact-pii"])];
    let mut section = ConsumerSection::new("billing", vec!["orders".into()], "plugin:c");
    section.tables.write = vec!["invoices".into()];
    t.provision_plugin_role(&mut section).await;
    config.consumers = vec![section];
    config.plugin_runtime.registry_poll = Some(Duration::from_millis(100));
    let pipeline = Pipeline::start(Daemon::default(), &config, &t.db).await;
    let addr = pipeline.addr();

    // Orders flow from here to the end of the swap, at most 40 ahead of
    // the consumer.
    let produced = Arc::new(AtomicUsize::new(0));
    let producing = Arc::new(AtomicBool::new(true));
    let producer = {
        let (db, produced, producing) = (t.db.clone(), produced.clone(), producing.clone());
        let stats = pipeline.handles.consumer_stats[0].1.clone();
        tokio::spawn(async move {
            let mut i = 0;
            while producing.load(Ordering::SeqCst) {
                if i >= stats.handled.load(Ordering::SeqCst) as usize + 40 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                put_order(&db, i).await;
                i += 1;
                produced.store(i, Ordering::SeqCst);
            }
        })
    };
    let inbox = |label: &'static str| {
        let t = &t;
        async move {
            t.count(&format!(
                "SELECT count(*) FROM inbox WHERE handled_by = '{label}'"
            ))
            .await
        }
    };
    until(&t, addr, "v1 handles 20 orders", async || {
        inbox("c@1").await >= 20
    })
    .await;

    // Deployed after start: first a shadow candidate, then the active one.
    let v2 = deploy(&reg, "c", wasm("invoicing")).await;
    assert_eq!(v2, 2);
    reg.shadow("c", v2, true, None).await.expect("shadow v2");
    until(&t, addr, "the candidate's shadow calls", async || {
        let (_, metrics) = http(addr, "GET", "/metrics", Some(TOKEN), None).await;
        let calls = plugin_series(&metrics, "outboxd_plugin_calls_total");
        calls.get(&("c".into(), "2".into())).copied().unwrap_or(0) > 0
    })
    .await;
    reg.activate("c", v2, "test").await.expect("activate v2");
    until(&t, addr, "v2 handles 20 orders", async || {
        inbox("c@2").await >= 20
    })
    .await;
    assert!(
        producing.load(Ordering::SeqCst),
        "the orders stopped before the swap: not under load"
    );
    // The metrics as an operator reads them while the load still runs.
    let (status, live) = http(addr, "GET", "/metrics", Some(TOKEN), None).await;
    assert_eq!(status, 200);
    let live_calls = plugin_series(&live, "outboxd_plugin_calls_total");
    for version in [("c", "1"), ("c", "2"), ("redact-pii", "sha256:")] {
        assert!(
            live_calls
                .iter()
                .any(|((p, v), n)| p == version.0 && v.starts_with(version.1) && *n > 0),
            "no calls of {version:?} in /metrics during the load:\n{live}"
        );
    }

    producing.store(false, Ordering::SeqCst);
    producer.await.expect("producer");
    let total = produced.load(Ordering::SeqCst) as i64;
    until(
        &t,
        addr,
        &format!("all {total} orders handled"),
        async || t.count("SELECT count(*) FROM inbox").await >= total,
    )
    .await;

    // Settled: each version was called at least once per message it
    // handled (v2 also ran in shadow before it was active).
    let (_, metrics) = http(addr, "GET", "/metrics", Some(TOKEN), None).await;
    let calls = plugin_series(&metrics, "outboxd_plugin_calls_total");
    let latencies = plugin_series(&metrics, "outboxd_plugin_call_seconds_count");
    let (by_v1, by_v2) = (inbox("c@1").await as u64, inbox("c@2").await as u64);
    for (version, handled) in [("1", by_v1), ("2", by_v2)] {
        let key = ("c".to_string(), version.to_string());
        let n = calls.get(&key).copied().unwrap_or(0);
        assert!(
            n >= handled,
            "c@{version} handled {handled} orders but /metrics counts {n} calls:\n{metrics}"
        );
        assert_eq!(
            latencies.get(&key),
            Some(&n),
            "c@{version}: one latency observation per call"
        );
    }
    assert!(
        metrics.contains("outboxd_plugin_memory_high_water_bytes{plugin=\"c\",version=\"2\"}"),
        "{metrics}"
    );

    // The plugin list: one row per version, with this process's counters.
    let (_, list) = http(addr, "GET", "/api/plugins", Some(TOKEN), None).await;
    let list: Vec<serde_json::Value> = serde_json::from_str(&list).expect("json");
    let rows: Vec<(String, String, String)> = list
        .iter()
        .map(|p| {
            (
                p["name"].as_str().expect("name").to_string(),
                p["version"].to_string().trim_matches('"').to_string(),
                p["state"].as_str().expect("state").to_string(),
            )
        })
        .collect();
    assert_eq!(rows.len(), 3, "one row per version: {rows:?}");
    assert_eq!(rows[0], ("c".into(), "1".into(), "candidate".into()));
    assert_eq!(rows[1], ("c".into(), "2".into(), "active".into()));
    assert_eq!(
        (rows[2].0.as_str(), rows[2].2.as_str()),
        ("redact-pii", "active")
    );
    for (row, world, source) in [
        (&list[0], "consumer", "registry"),
        (&list[1], "consumer", "registry"),
        (&list[2], "transformer", "file"),
    ] {
        assert_eq!(
            (row["world"].as_str(), row["source"].as_str()),
            (Some(world), Some(source)),
            "{row}"
        );
        assert_eq!(row["loaded"], true, "{row}");
        assert!(row["calls"].as_u64().expect("calls") > 0, "{row}");
        assert!(row["p99_ms"].as_f64().expect("p99") > 0.0, "{row}");
    }
    assert_eq!(
        list[1]["calls"].as_u64(),
        calls.get(&("c".to_string(), "2".to_string())).copied(),
        "the list and /metrics count the same calls"
    );
    pipeline.stop().await;
    println!(
        "plugin metrics under load ({}): {total} orders, c@1 handled {by_v1}, c@2 handled {by_v2}; calls {calls:?}",
        if t.is_postgres() {
            "postgres"
        } else {
            "sqlite"
        }
    );
}
on_both!(a_consumer_version_activated_under_load_is_in_metrics_and_the_plugin_list);

/// The case an operator reported: a file transformer and a file consumer
/// plugin, and only the transformer in `/metrics` after the consumer had
/// handled three messages. Two consumers naming the same file plugin share
/// one loaded version: one series, counting both consumers' calls.
async fn a_file_consumer_plugin_is_in_metrics(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let mut config = admin_config(&t.url);
    config.plugins = vec![
        PluginSpec::new("billing", plugin_path("billing")),
        PluginSpec::new("redact-pii", plugin_path("redact-pii")),
    ];
    config.routes = vec![Route::new("order.*", "orders").with_transformers(&["redact-pii"])];
    for name in ["billing", "billing-again"] {
        let mut section = ConsumerSection::new(name, vec!["orders".into()], "plugin:billing");
        section.tables.write = vec!["invoices".into()];
        t.provision_plugin_role(&mut section).await;
        config.consumers.push(section);
    }
    for i in 0..3 {
        put_order(&t.db, i).await;
    }
    let pipeline = Pipeline::start(Daemon::default(), &config, &t.db).await;
    let addr = pipeline.addr();
    until(&t, addr, "6 messages handled", async || {
        t.count("SELECT count(*) FROM inbox").await >= 6
    })
    .await;
    let (_, metrics) = http(addr, "GET", "/metrics", Some(TOKEN), None).await;
    let calls = plugin_series(&metrics, "outboxd_plugin_calls_total");
    let of = |name: &str| {
        calls
            .iter()
            .filter(|((p, _), _)| p == name)
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        of("billing"),
        vec![6],
        "one series, both consumers' calls:\n{metrics}"
    );
    assert_eq!(of("redact-pii"), vec![3], "{metrics}");
    pipeline.stop().await;
}
on_both!(a_file_consumer_plugin_is_in_metrics);
