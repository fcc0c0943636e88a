//! Plugin benchmark: per-event transform cost and relay throughput with and
//! without the cloudevents plugin. Run after `bash plugins/build.sh`:
//!
//! `cargo run --release -p outboxd-bench --example plugin_bench`

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxd::broker::PublishError;
use outboxd::broker::Publisher;
use outboxd::clock::SystemClock;
use outboxd::config::PluginSpec;
use outboxd::event::NewEvent;
use outboxd::message::OutgoingMessage;
use outboxd::plugin::EngineConfig;
use outboxd::plugin::GuestEvent;
use outboxd::plugin::PluginEngine;
use outboxd::plugin::TransformerPlugin;
use outboxd::plugin::lifecycle::chains::build_chains;
use outboxd::relay::Relay;
use outboxd::relay::RelayConfig;
use outboxd::relay::StepOutcome;
use outboxd::route::Route;
use outboxd::route::Router;
use outboxd::store::{AnyStore, Db, enqueue, migrate};

struct NullBroker;

impl Publisher for NullBroker {
    async fn publish(&self, _msg: OutgoingMessage) -> Result<(), PublishError> {
        Ok(())
    }
}

fn dist(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../plugins/dist/{name}.wasm"));
    assert!(
        p.exists(),
        "{} is missing: run `bash plugins/build.sh`",
        p.display()
    );
    p
}

fn payload(bytes: usize) -> serde_json::Value {
    let filler = "x".repeat(bytes.saturating_sub(40));
    serde_json::json!({"order_id": "o-1", "total": 42, "note": filler})
}

async fn transform_cost(engine: &PluginEngine, reuse: bool, bytes: usize, iters: u32) -> Duration {
    let mut spec = PluginSpec::new("cloudevents", dist("cloudevents"));
    spec.limits.reuse_instances = reuse;
    let plugin = TransformerPlugin::load(engine, &spec).expect("load");
    let event = GuestEvent {
        id: uuid::Uuid::new_v4().to_string(),
        aggregate_id: "order-1".into(),
        event_type: "order.confirmed".into(),
        payload: payload(bytes).to_string().into_bytes(),
        headers: vec![(
            "traceparent".into(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
        )],
        created_at: "2026-11-29T12:00:00+00:00".into(),
        key: b"order-1".to_vec(),
        attempt: 0,
    };
    for _ in 0..100 {
        plugin.transform(&event).await.expect("warm-up");
    }
    let start = Instant::now();
    for _ in 0..iters {
        std::hint::black_box(plugin.transform(&event).await.expect("transform"));
    }
    start.elapsed() / iters
}

async fn relay_throughput(engine: &PluginEngine, with_plugin: bool, events: usize) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let db = Db::connect(&url, 4).await.expect("db");
    migrate(&db).await.expect("migrate");
    let Db::Sqlite(pool) = &db else {
        unreachable!()
    };
    for chunk in 0..events / 500 {
        let mut tx = pool.begin().await.expect("begin");
        for i in 0..500 {
            let n = chunk * 500 + i;
            enqueue(
                &mut tx,
                NewEvent::new(format!("agg-{n}"), "order.confirmed", payload(256)),
            )
            .await
            .expect("enqueue");
        }
        tx.commit().await.expect("commit");
    }
    let route = Route::new("order.*", "orders");
    let routes = vec![if with_plugin {
        route.with_transformers(&["cloudevents"])
    } else {
        route
    }];
    let chains = build_chains(
        engine,
        &[PluginSpec::new("cloudevents", dist("cloudevents"))],
        &routes,
    )
    .expect("chains");
    let relay = Relay::new(
        AnyStore::new(&db, Duration::from_secs(30)),
        NullBroker,
        Router::new(routes),
        RelayConfig {
            batch_size: 100,
            ..RelayConfig::default()
        },
        Arc::new(SystemClock),
    )
    .with_chains(chains);
    let start = Instant::now();
    let mut done = 0;
    while let StepOutcome::Published(r) = relay.step().await.expect("step") {
        done += r.published;
    }
    assert_eq!(done, events);
    events as f64 / start.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let engine = PluginEngine::new(EngineConfig::default()).expect("engine");
    println!("per-event transform cost, cloudevents (Rust), mean of N calls");
    for (bytes, iters) in [(256, 20_000), (4096, 10_000), (65_536, 2_000)] {
        let reused = transform_cost(&engine, true, bytes, iters).await;
        let fresh = transform_cost(&engine, false, bytes, iters / 10).await;
        println!(
            "  {bytes:>6} B  reused instance {reused:>10.2?}   instance per call {fresh:>10.2?}"
        );
    }
    let pooled = PluginEngine::new(EngineConfig {
        cache_dir: None,
        pooling: true,
    })
    .expect("engine");
    let fresh_pooled = transform_cost(&pooled, false, 256, 2_000).await;
    println!("     256 B  instance per call, pooling allocator {fresh_pooled:>10.2?}");
    println!("relay throughput, SQLite file, batch 100, null broker, 20000 events of 256 B");
    let mut plain = Vec::new();
    let mut with = Vec::new();
    for _ in 0..3 {
        plain.push(relay_throughput(&engine, false, 20_000).await);
        with.push(relay_throughput(&engine, true, 20_000).await);
    }
    let best = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    println!(
        "  no plugins   {:>9.0} events/s (best of 3: {plain:.0?})",
        best(&plain)
    );
    println!(
        "  cloudevents  {:>9.0} events/s (best of 3: {with:.0?})",
        best(&with)
    );
    println!(
        "  ratio        {:>9.1} %",
        100.0 * best(&with) / best(&plain)
    );
}
