//! `outboxd-bench wal`: the WAL relay (`relay.source = "wal"`) against the
//! polling relay in one run, the two modes interleaved so both meet the
//! same machine: commit-to-effect latency through Kafka, throughput at a
//! backlog, with and without a transformer plugin, and what an idle relay
//! asks of the database.
//!
//! The relay under test is a real `outboxd run` process (the binary next to
//! this one), configured through a TOML file per run, so both modes run
//! exactly as deployed. The scenarios are in `latency.rs`,
//! `throughput.rs` and `idle.rs`; this file holds the arguments,
//! the relay process and the replication slot's housekeeping.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::PgPool;

use crate::BenchError;
use outboxd::store::{Db, migrate};

mod idle;
mod latency;
mod throughput;

#[derive(Debug, Clone, clap::Args)]
pub struct WalBenchArgs {
    /// A Postgres database the benchmark may empty and fill. Its WAL slot
    /// is named after it and dropped at the end.
    #[arg(long)]
    pub url: String,
    /// Kafka bootstrap servers (e.g. tansu). Without them only `idle` runs
    /// (on the embedded transport).
    #[arg(long)]
    pub brokers: Option<String>,
    /// Which measurements: `latency`, `throughput` (with `--plugin` also
    /// the plugin's share) and `idle`.
    #[arg(long, value_delimiter = ',', default_value = "latency,throughput,idle")]
    pub scenarios: Vec<String>,
    /// Relay sources to compare: `wal` and/or `poll`.
    #[arg(long, value_delimiter = ',', default_value = "wal,poll")]
    pub modes: Vec<String>,
    /// Interleaved runs of each latency and throughput cell.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Latency: arrival rate, events/s.
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Latency: how long events arrive.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Latency: messages per consumer transaction.
    #[arg(long, default_value_t = 20)]
    pub consumer_batch: usize,
    /// Throughput: events in the backlog.
    #[arg(long, default_value_t = 100_000)]
    pub backlog: i64,
    /// Throughput: aggregates the backlog is spread over.
    #[arg(long, default_value_t = 2_000)]
    pub aggregates: i64,
    /// Throughput: events per producing transaction while the backlog is
    /// written.
    #[arg(long, default_value_t = 100)]
    pub insert_batch: i64,
    /// `relay.workers` in both modes: polling workers, or the batches the
    /// WAL reader keeps in flight.
    #[arg(long, default_value_t = 2)]
    pub poll_workers: usize,
    /// Throughput: a transformer component (plugins/dist/cloudevents.wasm);
    /// every throughput cell then also runs with it on the route.
    #[arg(long)]
    pub plugin: Option<PathBuf>,
    /// Throughput: read every message back from Kafka and check each event
    /// arrived exactly once and in per-aggregate order.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub verify: bool,
    /// Idle: the measured window.
    #[arg(long, default_value_t = 30)]
    pub idle_seconds: u64,
    /// Idle: wait this long after the relay is up before the window opens,
    /// so its start-up statements are counted before it (Postgres backends
    /// flush their statistics up to about 10 s late when idle).
    #[arg(long, default_value_t = 12)]
    pub idle_settle_seconds: u64,
    /// The `outboxd` binary; by default the one next to this executable.
    #[arg(long, value_name = "PATH")]
    pub outboxd: Option<PathBuf>,
    /// Extra librdkafka properties for the relay's producer and the
    /// consumer, as KEY=VALUE (outboxd's defaults otherwise).
    #[arg(long = "kafka", value_parser = parse_kv)]
    pub kafka: Vec<(String, String)>,
    /// Extra `[relay]` settings for both modes, as TOML (`--relay
    /// pipeline=true`, `--relay batch_size=500`; a later one wins).
    #[arg(long = "relay", value_parser = parse_kv)]
    pub relay: Vec<(String, String)>,
    /// Write the results as JSON here too.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{s}`: expected KEY=VALUE"))
}

/// Where the relay under test finds new events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Wal,
    Poll,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Wal => "wal",
            Mode::Poll => "poll",
        }
    }
}

/// Everything the scenarios print, for `--json`.
#[derive(Debug, Default, Serialize)]
pub struct WalReport {
    pub latency: Vec<latency::LatencyRun>,
    pub throughput: Vec<throughput::ThroughputRun>,
    pub idle: Vec<idle::IdleRow>,
}

/// What every scenario shares: the database, the slot, the binary.
pub(crate) struct Bench {
    pub args: WalBenchArgs,
    pub pool: PgPool,
    pub db: Db,
    pub slot: String,
    pub outboxd: PathBuf,
    pub dir: tempfile::TempDir,
    pub modes: Vec<Mode>,
}

pub async fn wal(args: &WalBenchArgs) -> Result<WalReport, BenchError> {
    let db = Db::connect(&args.url, 8).await?;
    let Db::Postgres(pool) = &db else {
        return Err(BenchError::Refused(
            "the wal benchmark needs a postgres:// URL".into(),
        ));
    };
    let pool = pool.clone();
    migrate(&db).await?;
    let level: String = sqlx::query_scalar("SHOW wal_level")
        .fetch_one(&pool)
        .await?;
    if level != "logical" {
        return Err(BenchError::Refused(format!(
            "wal_level is `{level}`: the WAL relay needs `logical` (ALTER SYSTEM SET wal_level = logical, then restart Postgres; tests/run.sh does it)"
        )));
    }
    let modes = args
        .modes
        .iter()
        .map(|m| match m.as_str() {
            "wal" => Ok(Mode::Wal),
            "poll" => Ok(Mode::Poll),
            other => Err(BenchError::Refused(format!(
                "unknown --modes value `{other}`; use wal and/or poll"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    for s in &args.scenarios {
        if !["latency", "throughput", "idle"].contains(&s.as_str()) {
            return Err(BenchError::Refused(format!(
                "unknown --scenarios value `{s}`; use latency, throughput and/or idle"
            )));
        }
    }
    let wants = |s: &str| args.scenarios.iter().any(|x| x == s);
    if (wants("latency") || wants("throughput")) && args.brokers.is_none() {
        return Err(BenchError::Refused(
            "latency and throughput go through Kafka: pass --brokers HOST:PORT (eval \"$(tests/tansu.sh start)\" gives $KAFKA_BOOTSTRAP), or --scenarios idle".into(),
        ));
    }
    let outboxd = match &args.outboxd {
        Some(path) => path.clone(),
        None => std::env::current_exe()
            .map_err(|e| BenchError::Refused(format!("cannot find the outboxd binary: {e}")))?
            .with_file_name("outboxd"),
    };
    if !outboxd.is_file() {
        return Err(BenchError::Refused(format!(
            "{} is not a file: build outboxd first (cargo build [--release] -p outboxd) or pass --outboxd PATH",
            outboxd.display()
        )));
    }
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await?;
    let bench = Bench {
        args: args.clone(),
        slot: slot_name(&database),
        pool,
        db,
        outboxd,
        dir: {
            let mut dir = tempfile::tempdir().map_err(|e| {
                BenchError::Refused(format!("cannot make a temporary directory: {e}"))
            })?;
            // OUTBOXD_BENCH_KEEP=1 keeps the relays' configs and logs.
            if std::env::var_os("OUTBOXD_BENCH_KEEP").is_some() {
                println!(
                    "keeping the relays' configs and logs in {}",
                    dir.path().display()
                );
                dir.disable_cleanup(true);
            }
            dir
        },
        modes,
    };
    let result = run_scenarios(&bench, &wants).await;
    // Whatever happened, the slot must not outlive the benchmark: it would
    // pin WAL and block DROP DATABASE.
    let dropped = bench.drop_slot().await;
    let report = result?;
    dropped?;
    if let Some(path) = &args.json {
        super::write_json(path, &report)?;
    }
    Ok(report)
}

async fn run_scenarios(
    bench: &Bench,
    wants: &dyn Fn(&str) -> bool,
) -> Result<WalReport, BenchError> {
    let mut report = WalReport::default();
    if wants("latency") {
        report.latency = latency::run(bench).await?;
    }
    if wants("throughput") {
        report.throughput = throughput::run(bench).await?;
    }
    if wants("idle") {
        report.idle = idle::run(bench).await?;
    }
    Ok(report)
}

/// The slot for a database: its name, cut to Postgres's 63 bytes and to
/// what a slot name may hold.
fn slot_name(database: &str) -> String {
    let mut s: String = database
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '_' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '_',
        })
        .collect();
    if s.is_empty() || s.as_bytes()[0].is_ascii_digit() {
        s.insert_str(0, "b_");
    }
    s.truncate(63);
    s
}

/// How the relay process under test is configured, beyond its mode.
#[derive(Debug, Clone, Default)]
pub(crate) struct RelaySetup {
    /// The topic of `walbench.*` events.
    pub topic: String,
    /// A transformer on that route.
    pub plugin: Option<PathBuf>,
    /// Kafka when set, else the embedded transport.
    pub kafka: bool,
}

/// The probe event's type and topic: how the benchmark learns that a
/// relay is up (its probe was published).
pub(crate) const PROBE_TYPE: &str = "walprobe.ready";
const PROBE_TOPIC: &str = "outboxd.walbench.probe";
/// Partitions of every benchmark topic.
pub(crate) const PARTITIONS: i32 = 4;

impl Bench {
    pub fn brokers(&self) -> &str {
        self.args.brokers.as_deref().unwrap_or("127.0.0.1:9092")
    }

    /// librdkafka properties shared by the relay and the consumer.
    pub fn kafka_props(&self) -> std::collections::BTreeMap<String, String> {
        let mut props = std::collections::BTreeMap::from([(
            "bootstrap.servers".to_string(),
            self.brokers().to_string(),
        )]);
        for (k, v) in &self.args.kafka {
            props.insert(k.clone(), v.clone());
        }
        props
    }

    fn kafka_toml(&self) -> String {
        let mut s = String::from("[transport.kafka]\n");
        for (k, v) in self.kafka_props() {
            s.push_str(&format!("{} = {}\n", toml_str(&k), toml_str(&v)));
        }
        s
    }

    /// The config file of one relay process.
    fn relay_config(&self, mode: Mode, setup: &RelaySetup) -> String {
        let mut s = format!(
            "[database]\nurl = {url}\nmax_connections = 12\nmigrate_on_start = true\n\n",
            url = toml_str(&self.args.url)
        );
        if setup.kafka {
            s.push_str("[transport]\nkind = \"kafka\"\n\n");
            s.push_str(&self.kafka_toml());
        } else {
            s.push_str("[transport]\nkind = \"embedded\"\npartitions = 4\n");
        }
        // The same relay.workers in both modes: polling workers, or the
        // WAL reader's batches in flight.
        let mut relay = std::collections::BTreeMap::from([
            ("workers".to_string(), self.args.poll_workers.to_string()),
            ("batch_size".to_string(), "100".to_string()),
        ]);
        relay.extend(self.args.relay.iter().cloned());
        s.push_str("\n[relay]\n");
        for (k, v) in &relay {
            s.push_str(&format!("{k} = {v}\n"));
        }
        if mode == Mode::Wal {
            // A paused reader (the throughput scenario stops the process
            // while it writes the backlog) must keep its slot.
            s.push_str(&format!(
                "source = \"wal\"\n\n[relay.wal]\nslot = {}\nsender_timeout = \"60s\"\n",
                toml_str(&self.slot)
            ));
        }
        s.push_str(&format!(
            "\n[[routes]]\nevent_type = {}\ntopic = {}\n",
            toml_str(PROBE_TYPE),
            toml_str(PROBE_TOPIC)
        ));
        s.push_str(&format!(
            "\n[[routes]]\nevent_type = \"walbench.*\"\ntopic = {}\n",
            toml_str(&setup.topic)
        ));
        if let Some(path) = &setup.plugin {
            s.push_str(&format!(
                "transformers = [\"bench_plugin\"]\n\n[[plugins]]\nname = \"bench_plugin\"\npath = {}\nconfig = {{ source = \"/outboxd/bench\" }}\n",
                toml_str(&path.display().to_string())
            ));
        }
        // Nothing else runs in the process: no admin API (and so no
        // sampler), retention not before the run is over.
        s.push_str("\n[admin]\nenabled = false\n\n[retention]\ninterval_seconds = 86400\n");
        s
    }

    /// Starts `outboxd run` in `mode` and waits until it has published a
    /// probe event. The outbox must hold no other pending event.
    pub async fn start_relay(
        &self,
        mode: Mode,
        setup: &RelaySetup,
    ) -> Result<RelayProcess, BenchError> {
        if mode == Mode::Wal {
            self.skip_slot_to_now().await?;
        }
        if setup.kafka {
            let topics = [PROBE_TOPIC.to_string(), setup.topic.clone()];
            outboxd::broker::kafka::ensure_topics(&self.kafka_props(), &topics, PARTITIONS)
                .await
                .map_err(|e| BenchError::Refused(format!("--brokers {}: {e}", self.brokers())))?;
        }
        let path = self.dir.path().join(format!("relay-{}.toml", mode.name()));
        std::fs::write(&path, self.relay_config(mode, setup))
            .map_err(|e| BenchError::Refused(format!("cannot write {}: {e}", path.display())))?;
        let log = self.dir.path().join(format!("relay-{}.log", mode.name()));
        // Kept runs append a marker instead of starting the file again.
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"--- new relay process ---\n"));
        let child = spawn(&self.outboxd, &path, &log)?;
        let mut relay = RelayProcess { child, log };
        if let Err(e) = self.wait_probe(&mut relay).await {
            relay.stop().await;
            return Err(e);
        }
        Ok(relay)
    }

    async fn wait_probe(&self, relay: &mut RelayProcess) -> Result<(), BenchError> {
        let seq: i64 = sqlx::query_scalar(
            "INSERT INTO outbox (aggregate_id, event_type, payload) VALUES ('probe', $1, '{}') RETURNING seq",
        )
        .bind(PROBE_TYPE)
        .fetch_one(&self.pool)
        .await?;
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = relay.child.try_wait() {
                return Err(BenchError::Refused(format!(
                    "`outboxd run` exited at start ({status}): {}",
                    relay.log_tail()
                )));
            }
            let done: bool =
                sqlx::query_scalar("SELECT published_at IS NOT NULL FROM outbox WHERE seq = $1")
                    .bind(seq)
                    .fetch_one(&self.pool)
                    .await?;
            if done {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(60) {
                return Err(BenchError::Refused(format!(
                    "`outboxd run` did not publish a probe event within 60 s: {}",
                    relay.log_tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until no process reads the slot (a stopped relay's walsender
    /// may linger a moment), ending a reader that stays.
    async fn wait_slot_free(&self) -> Result<(), BenchError> {
        let started = Instant::now();
        loop {
            let active: Option<bool> =
                sqlx::query_scalar("SELECT active FROM pg_replication_slots WHERE slot_name = $1")
                    .bind(&self.slot)
                    .fetch_optional(&self.pool)
                    .await?;
            if active != Some(true) {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(10) {
                sqlx::query(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
                      WHERE slot_name = $1 AND active_pid IS NOT NULL",
                )
                .bind(&self.slot)
                .execute(&self.pool)
                .await?;
            }
            if started.elapsed() > Duration::from_secs(30) {
                return Err(BenchError::Refused(format!(
                    "replication slot `{}` is still in use 30 s after its relay stopped",
                    self.slot
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Moves the slot (when it exists) to the server's current WAL
    /// position, so a WAL run does not replay what the runs before it
    /// wrote (in polling mode nobody reads the slot). The outbox is empty
    /// here, so nothing is skipped that would have to be published.
    async fn skip_slot_to_now(&self) -> Result<(), BenchError> {
        self.wait_slot_free().await?;
        sqlx::query(
            "SELECT pg_replication_slot_advance(slot_name, pg_current_wal_lsn())
               FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&self.slot)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Drops the benchmark's slot, if there is one.
    pub async fn drop_slot(&self) -> Result<(), BenchError> {
        self.wait_slot_free().await?;
        sqlx::query(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&self.slot)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Empties the outbox and what the consumers wrote.
    pub async fn reset(&self) -> Result<(), BenchError> {
        sqlx::query("CREATE TABLE IF NOT EXISTS bench_effects (message_id text PRIMARY KEY)")
            .execute(&self.pool)
            .await?;
        sqlx::query("TRUNCATE outbox, inbox, bench_effects, transport_messages, transport_cursors")
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

fn spawn(exe: &Path, config: &Path, log: &Path) -> Result<tokio::process::Child, BenchError> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| BenchError::Refused(format!("cannot create {}: {e}", log.display())))?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("--config")
        .arg(config)
        .arg("run")
        .env(
            "OUTBOXD_LOG",
            std::env::var("OUTBOXD_BENCH_RELAY_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(out)
        .kill_on_drop(true);
    // The child's configuration is the file alone.
    for (k, _) in std::env::vars() {
        if k.starts_with("OUTBOXD__") {
            cmd.env_remove(k);
        }
    }
    cmd.spawn()
        .map_err(|e| BenchError::Refused(format!("cannot start {}: {e}", exe.display())))
}

/// A running `outboxd run`.
pub(crate) struct RelayProcess {
    child: tokio::process::Child,
    log: PathBuf,
}

impl RelayProcess {
    fn signal(&self, sig: &str) -> Result<(), BenchError> {
        let pid = self.child.id().ok_or_else(|| {
            BenchError::Refused(format!("`outboxd run` has exited: {}", self.log_tail()))
        })?;
        let ok = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        match ok {
            true => Ok(()),
            false => Err(BenchError::Refused(format!(
                "`kill -{sig} {pid}` failed: is `kill` on PATH?"
            ))),
        }
    }

    /// Freezes the process (SIGSTOP): it reads, publishes and marks nothing
    /// until [`resume`](Self::resume).
    pub fn pause(&self) -> Result<(), BenchError> {
        self.signal("STOP")
    }

    pub fn resume(&self) -> Result<(), BenchError> {
        self.signal("CONT")
    }

    /// An error if the process has exited.
    pub fn check_alive(&mut self) -> Result<(), BenchError> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(BenchError::Refused(format!(
                "`outboxd run` exited ({status}): {}",
                self.log_tail()
            ))),
            _ => Ok(()),
        }
    }

    /// SIGTERM, then SIGKILL if it has not stopped within 10 s.
    pub async fn stop(mut self) {
        let _ = self.signal("CONT");
        let _ = self.signal("TERM");
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
    }

    /// The end of the process's log, for an error message.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(8).collect();
        match lines.is_empty() {
            true => format!("(its log {} is empty)", self.log.display()),
            false => lines.into_iter().rev().collect::<Vec<_>>().join("\n"),
        }
    }
}

fn toml_str(s: &str) -> String {
    let escaped = s.replace('\\', "\\\\").replace('"', "\\\"");
    format!("\"{escaped}\"")
}

/// The median of `v` (NaN when empty).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n % 2 {
        1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Modes in run `r`'s order: the first mode alternates between runs, so
/// neither always runs on a machine the other just warmed or loaded.
pub(crate) fn run_order(modes: &[Mode], r: usize) -> Vec<Mode> {
    let mut m = modes.to_vec();
    if r % 2 == 1 {
        m.reverse();
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_are_valid_identifiers() {
        assert_eq!(slot_name("outboxd_bench"), "outboxd_bench");
        assert_eq!(slot_name("Bench-1"), "bench_1");
        assert_eq!(slot_name("1db"), "b_1db");
        assert_eq!(slot_name(&"x".repeat(80)).len(), 63);
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }
}
