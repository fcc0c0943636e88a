//! Micro-benchmarks of one plugin call (what a call costs, apart from the
//! database): a `transform` of the Rust cloudevents plugin and a `handle` of
//! the Rust billing plugin (one INSERT through the borrowed transaction,
//! SQLite in a temporary file; the built-in `BillingHandler` doing the same
//! beside it), each at payloads of 256 B, 4 KiB and 64 KiB, on a reused
//! instance.
//!
//! ```sh
//! bash plugins/build.sh
//! cargo bench -p outboxd-bench --bench plugin_calls
//! ```
//!
//! Each benchmark warms up for 1 s, then takes 30 samples of about 100 ms,
//! each a run of back-to-back calls, and prints the median time per call
//! with the 10th and 90th percentiles of the samples. `cargo test -p
//! outboxd-bench --bench plugin_calls` runs each call once instead, which is
//! what the smoke test in CI does.
//!
//! The harness is these few lines rather than a benchmarking crate: a
//! dev-dependency that turns on features of a crate the binaries also use
//! makes CI compile that crate, and all that depends on it, twice.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use outboxd::config::PluginSpec;
use outboxd::config::TxnPolicy;
use outboxd::consumer::Handler;
use outboxd::message::Delivery;
use outboxd::message::headers;
use outboxd::plugin::ConsumerPlugin;
use outboxd::plugin::EngineConfig;
use outboxd::plugin::GuestEvent;
use outboxd::plugin::PluginEngine;
use outboxd::plugin::TransformerPlugin;
use outboxd::plugin::bindings::transformer::outbox::plugin::types::Message;
use outboxd::store::InboxTx;
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

/// How a benchmark runs: measured (`cargo bench` passes `--bench`) or once
/// (`cargo test`).
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Measure,
    Once,
}

const WARM_UP: Duration = Duration::from_secs(1);
const SAMPLES: usize = 30;
const SAMPLE_TARGET: Duration = Duration::from_millis(100);

/// Runs `run(iters)` (which returns the time its `iters` calls took) and
/// prints the time per call: median, 10th and 90th percentile of the
/// samples, and the payload bytes per second at the median.
fn bench(mode: Mode, name: &str, bytes: usize, mut run: impl FnMut(u64) -> Duration) {
    if mode == Mode::Once {
        let took = run(1);
        println!("{name:<32} ok (one call, {took:?})");
        return;
    }
    // Warm up, and learn how many calls make a sample of about 100 ms. Runs
    // double in length but never pass one sample's worth: a run builds its
    // inputs up front (64 KiB each for the largest payloads), so an
    // unbounded doubling would hold hundreds of megabytes.
    let started = Instant::now();
    let (mut calls, mut spent) = (0u64, Duration::ZERO);
    let mut iters = 1u64;
    let sample_calls = |calls: u64, spent: Duration| {
        let per_call = spent.as_secs_f64() / calls.max(1) as f64;
        ((SAMPLE_TARGET.as_secs_f64() / per_call.max(1e-9)) as u64).max(1)
    };
    while started.elapsed() < WARM_UP {
        spent += run(iters);
        calls += iters;
        iters = iters.saturating_mul(2).min(sample_calls(calls, spent));
    }
    let iters = sample_calls(calls, spent);
    let mut per_call: Vec<f64> = (0..SAMPLES)
        .map(|_| run(iters).as_secs_f64() / iters as f64)
        .collect();
    per_call.sort_by(f64::total_cmp);
    let at = |q: f64| per_call[((per_call.len() - 1) as f64 * q).round() as usize];
    let median = at(0.5);
    println!(
        "{name:<32} {:>10.2} µs/call  [p10 {:.2}, p90 {:.2}]  {:>8.1} MiB/s  ({SAMPLES} samples of {iters} calls)",
        median * 1e6,
        at(0.1) * 1e6,
        at(0.9) * 1e6,
        bytes as f64 / median / (1024.0 * 1024.0),
    );
}

fn transform(mode: Mode) {
    let rt = runtime();
    let engine = PluginEngine::new(EngineConfig::default()).expect("engine");
    let spec = PluginSpec::new("cloudevents", dist("cloudevents"));
    let plugin = TransformerPlugin::load(&engine, &spec).expect("load cloudevents");
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
        bench(
            mode,
            &format!("transform/cloudevents/{bytes}"),
            bytes,
            |iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    rt.block_on(plugin.transform(&event)).expect("transform");
                }
                start.elapsed()
            },
        );
    }
}

fn handle(mode: Mode) {
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
    for bytes in SIZES {
        // The same effect by the built-in handler, for the plugin's overhead.
        // One transaction per sample, rolled back so the table does not grow
        // between samples; only the calls are timed.
        bench(
            mode,
            &format!("handle/billing/native/{bytes}"),
            bytes,
            |iters| {
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
            },
        );
        bench(
            mode,
            &format!("handle/billing/plugin/{bytes}"),
            bytes,
            |iters| {
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
            },
        );
    }
}

fn main() {
    // `cargo bench` runs the target with `--bench`; `cargo test` without.
    let mode = if std::env::args().any(|a| a == "--bench") {
        Mode::Measure
    } else {
        Mode::Once
    };
    transform(mode);
    handle(mode);
}
