//! The relay benchmark's rows: one per grid point and variant, the line
//! printed for each, and the closing ratios to the poll-and-mark baseline.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct RelayBenchRow {
    pub design: String,
    pub sink: String,
    /// `none` or the transformer plugin's name.
    pub transformer: String,
    pub batch: usize,
    pub workers: usize,
    pub pipeline: bool,
    pub events: i64,
    pub seconds: f64,
    pub events_per_second: f64,
}

/// One grid point's settings.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cell {
    pub(super) batch: usize,
    pub(super) workers: usize,
    pub(super) pipeline: bool,
}

pub(super) fn row(
    design: &str,
    sink: &str,
    transformer: &str,
    Cell {
        batch,
        workers,
        pipeline,
    }: Cell,
    events: i64,
    seconds: f64,
) -> RelayBenchRow {
    RelayBenchRow {
        design: design.into(),
        sink: sink.into(),
        transformer: transformer.into(),
        batch,
        workers,
        pipeline,
        events,
        seconds,
        events_per_second: events as f64 / seconds.max(1e-9),
    }
}

pub(super) fn print_row(r: Option<&RelayBenchRow>) {
    if let Some(r) = r {
        println!(
            "{:<9} sink {:<8} transformer {:<12} batch {:>4} workers {} pipeline {:<5} : {:>8} events in {:>7.2} s = {:>9.0} events/s (exactly once, in order)",
            r.design,
            r.sink,
            r.transformer,
            r.batch,
            r.workers,
            r.pipeline,
            r.events,
            r.seconds,
            r.events_per_second
        );
    }
}

/// The ratio of every row to the first (the poll-and-mark baseline, same
/// run), and of a transformer row to its plugin-free twin.
pub(super) fn print_ratios(rows: &[RelayBenchRow]) {
    let baseline_rate = rows[0].events_per_second;
    println!(
        "\nratio to a sequential poll-and-mark relay (batch 50, each send awaited, one UPDATE per row; same run): "
    );
    for r in &rows[1..] {
        let plain = rows[1..]
            .iter()
            .find(|p| {
                p.transformer == "none"
                    && p.sink == r.sink
                    && p.batch == r.batch
                    && p.workers == r.workers
                    && p.pipeline == r.pipeline
            })
            .map_or(r.events_per_second, |p| p.events_per_second);
        println!(
            "  sink {:<8} batch {:>4} workers {} pipeline {:<5} transformer {:<12}: {:>6.1}x baseline{}",
            r.sink,
            r.batch,
            r.workers,
            r.pipeline,
            r.transformer,
            r.events_per_second / baseline_rate,
            if r.transformer == "none" {
                String::new()
            } else {
                format!(
                    ", {:.1} % of the plugin-free run",
                    100.0 * r.events_per_second / plain
                )
            }
        );
    }
}

/// Each sink's throughput against Kafka's at the same grid point and
/// transformer (same run), when `kafka` is among the sinks.
pub(super) fn print_sink_ratios(rows: &[RelayBenchRow]) {
    let outboxd: Vec<&RelayBenchRow> = rows.iter().filter(|r| r.design == "outboxd").collect();
    if !outboxd.iter().any(|r| r.sink == "kafka") || !outboxd.iter().any(|r| r.sink != "kafka") {
        return;
    }
    println!("\nratio to the same relay publishing to Kafka (same run):");
    for r in outboxd.iter().filter(|r| r.sink != "kafka") {
        let Some(kafka) = outboxd.iter().find(|k| {
            k.sink == "kafka"
                && k.transformer == r.transformer
                && k.batch == r.batch
                && k.workers == r.workers
                && k.pipeline == r.pipeline
        }) else {
            continue;
        };
        println!(
            "  batch {:>4} workers {} pipeline {:<5} transformer {:<12} sink {:<8}: {:>9.0} events/s = {:>5.2}x Kafka's {:.0}",
            r.batch,
            r.workers,
            r.pipeline,
            r.transformer,
            r.sink,
            r.events_per_second,
            r.events_per_second / kafka.events_per_second,
            kafka.events_per_second
        );
    }
}
