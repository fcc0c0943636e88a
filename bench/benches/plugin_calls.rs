//! Criterion micro-benchmarks of one plugin call (what a call costs, apart from the database): a `transform`
//! of the Rust cloudevents plugin and a `handle` of the Rust billing plugin
//! (one INSERT through the borrowed transaction, SQLite in a temporary
//! file; the built-in `BillingHandler` doing the same beside it), each at payloads of 256 B, 4 KiB and 64 KiB, on a reused
//! instance.
//!
//! ```sh
//! bash plugins/build.sh
//! cargo bench -p outboxd --bench plugin_calls
//! ```
//!
//! `cargo test -p outboxd --bench plugin_calls` runs each benchmark once
//! (criterion's test mode), which is what the smoke test in CI does.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use outboxd::broker::{Delivery, headers};
use outboxd::consumer::{Handler, InboxTx};
use outboxd::plugin::bindings::transformer::outbox::plugin::types::Message;
use outboxd::plugin::{
    ConsumerPlugin, EngineConfig, GuestEvent, PluginEngine, PluginSpec, TransformerPlugin,
    TxnPolicy,
};
use outboxd::store::{Db, migrate};
use outboxd_demo::billing::BillingHandler;

const SIZES: [usize; 3] = [256, 4096, 65_536];

fn dist(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../plugins/dist/{name}.wasm"));
    assert!(
        p.exists(),
        "{} is missing: run `bash plugins/build.sh`",
        p.display()
    );
    p
}

/// A JSON order of `bytes` bytes (the `note` field pads it).
fn order(bytes: usize, i: u64) -> Vec<u8> {
    let head =
        format!(r#"{{"order_id":"o-{i:012}","customer_id":"c-1","total_cents":4200,"note":""#);
    let pad = bytes.saturating_sub(head.len() + 2);
    let mut out = head.into_bytes();
    out.extend(std::iter::repeat_n(b'x', pad));
    out.extend_from_slice(b"\"}");
    out
}

fn delivery(payload: Vec<u8>) -> Delivery {
    Delivery {
        topic: "order.confirmed".into(),
        partition: 0,
        offset: 0,
        key: None,
        payload,
        headers: vec![(
            headers::MESSAGE_ID.into(),
            uuid::Uuid::new_v4().to_string().into_bytes(),
        )],
        attempt: 0,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn transform(c: &mut Criterion) {
    let rt = runtime();
    let engine = PluginEngine::new(EngineConfig::default()).expect("engine");
    let spec = PluginSpec::new("cloudevents", dist("cloudevents"));
    let plugin = TransformerPlugin::load(&engine, &spec).expect("load cloudevents");
    let mut group = c.benchmark_group("transform/cloudevents");
    for bytes in SIZES {
        let event = GuestEvent {
            id: uuid::Uuid::new_v4().to_string(),
            aggregate_id: "order-1".into(),
            event_type: "order.confirmed".into(),
            payload: order(bytes, 1),
            headers: vec![(
                "traceparent".into(),
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            )],
            created_at: "2026-11-29T12:00:00+00:00".into(),
            key: b"order-1".to_vec(),
            attempt: 0,
        };
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_with_input(BenchmarkId::from_parameter(bytes), &event, |b, event| {
            b.iter(|| rt.block_on(plugin.transform(event)).expect("transform"));
        });
    }
    group.finish();
}

fn handle(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let db = rt.block_on(async {
        let url = format!("sqlite://{}", dir.path().join("bench.db").display());
        let db = Db::connect(&url, 2).await.expect("db");
        migrate(&db).await.expect("migrate");
        outboxd_demo::billing::create_schema(&db)
            .await
            .expect("invoices");
        db
    });
    let Db::Sqlite(pool) = &db else {
        unreachable!("a sqlite:// URL")
    };
    let engine = PluginEngine::new(EngineConfig::default()).expect("engine");
    let spec = PluginSpec::new("billing", dist("billing"));
    let plugin = ConsumerPlugin::load(&engine, &spec).expect("load billing");
    // The billing plugin writes `invoices`, and nothing else.
    let policy = TxnPolicy {
        consumer: "billing".into(),
        tables: outboxd::config::TableGrants {
            read: vec![],
            write: vec!["invoices".into()],
        },
        ..TxnPolicy::default()
    };
    let mut group = c.benchmark_group("handle/billing");
    for bytes in SIZES {
        // The same effect by the built-in handler, for the plugin's overhead.
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_function(BenchmarkId::new("native", bytes), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let deliveries: Vec<Delivery> =
                        (0..iters).map(|i| delivery(order(bytes, i))).collect();
                    let mut tx = InboxTx::Sqlite(pool.begin().await.expect("begin"));
                    let start = Instant::now();
                    for d in &deliveries {
                        BillingHandler.handle(&mut tx, d).await.expect("handle");
                    }
                    let took = start.elapsed();
                    if let InboxTx::Sqlite(t) = tx {
                        t.rollback().await.expect("rollback");
                    }
                    took
                })
            });
        });
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_function(BenchmarkId::new("plugin", bytes), |b| {
            // One transaction per sample, rolled back so the table does not
            // grow between samples; only the calls are timed.
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let messages: Vec<Message> = (0..iters)
                        .map(|i| Message {
                            id: uuid::Uuid::new_v4().to_string(),
                            topic: "order.confirmed".into(),
                            key: None,
                            payload: order(bytes, i),
                            headers: Vec::new(),
                            attempt: 0,
                        })
                        .collect();
                    let mut tx = InboxTx::Sqlite(pool.begin().await.expect("begin"));
                    let start = Instant::now();
                    for m in &messages {
                        plugin.handle(&mut tx, m, &policy).await.expect("handle");
                    }
                    let took = start.elapsed();
                    if let InboxTx::Sqlite(t) = tx {
                        t.rollback().await.expect("rollback");
                    }
                    took
                })
            });
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = transform, handle
}
criterion_main!(benches);
