//! The processes the soak runs and kills: two relays, two consumers and
//! the broker, each restartable; and the config files they read.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

/// One `outboxd run` process, started again after each kill, in the
/// network namespace named after it.
pub struct Proc {
    pub name: String,
    netns: String,
    outboxd: PathBuf,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    /// The highest resident set (VmHWM) any of its runs reached, in KiB.
    pub peak_rss_kib: u64,
    /// `OUTBOXD_INSTANCE_ID` for every run: a Kafka group consumer's
    /// static-membership id, the same after each restart.
    pub instance_id: Option<String>,
}

impl Proc {
    pub fn new(name: &str, netns: String, outboxd: &Path, config: &Path, dir: &Path) -> Self {
        Self {
            name: name.to_string(),
            netns,
            outboxd: outboxd.to_path_buf(),
            config: config.to_path_buf(),
            log: dir.join(format!("{name}.log")),
            child: None,
            peak_rss_kib: 0,
            instance_id: None,
        }
    }

    pub fn start(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("open {}", self.log.display()))?;
        let mut cmd = Command::new("ip");
        if let Some(id) = &self.instance_id {
            cmd.env("OUTBOXD_INSTANCE_ID", id);
        }
        let child = cmd
            .args(["netns", "exec", &self.netns])
            .arg(&self.outboxd)
            .arg("--config")
            .arg(&self.config)
            .arg("run")
            // CHAOS_OUTBOXD_LOG=FILTER raises the processes' logging for a
            // post-mortem (with --keep), e.g. warn,outboxd::broker=debug.
            .env(
                "OUTBOXD_LOG",
                std::env::var("CHAOS_OUTBOXD_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "start {} ({} in netns {})",
                    self.name,
                    self.outboxd.display(),
                    self.netns
                )
            })?;
        self.child = Some(child);
        Ok(())
    }

    /// Reads the running process's peak resident set.
    pub fn sample_rss(&mut self) {
        let Some(pid) = self.child.as_ref().and_then(Child::id) else {
            return;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            return;
        };
        let hwm = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
        if let Some(kib) = hwm {
            self.peak_rss_kib = self.peak_rss_kib.max(kib);
        }
    }

    /// SIGKILL: no drain, no goodbye, whatever was in flight is cut.
    pub async fn kill(&mut self) {
        self.sample_rss();
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Whether the process exited on its own, and how.
    pub fn exited(&mut self) -> anyhow::Result<Option<std::process::ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => Ok(child.try_wait()?),
            None => Ok(None),
        }
    }

    /// Fails when the process exited on its own: the soak must not hide a
    /// crash behind its own kills.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.exited()? {
            bail!(
                "{} exited by itself ({status}); last lines of {}:\n{}",
                self.name,
                self.log.display(),
                self.tail(8)
            );
        }
        Ok(())
    }

    /// The last `n` lines of the process's log.
    pub fn tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// The broker, driven through its script (tests/tansu.sh for Kafka,
/// tests/broker-node.sh for NATS and RabbitMQ) with durable storage.
#[derive(Clone)]
pub struct Broker {
    pub script: PathBuf,
    /// The broker's log, and how much of it has been read.
    pub log: PathBuf,
    pub read: u64,
    /// tansu, whose panics and hangs the soak's supervisor restarts (see
    /// [`Broker::crashed`] and [`Broker::storage_idle`]); nats-server and
    /// RabbitMQ get no such help: a broker that fails on its own fails the
    /// drain.
    pub tansu: bool,
}

impl Broker {
    /// Whether tansu logged a panic since the last look. tansu 0.6.0's
    /// libsql engine can panic in `update_group` ("more or less than one
    /// row", lite.rs:503) when consumer-group members churn; its storage
    /// task is then gone and the broker fails every request while its port
    /// stays open. The soak restarts it, like a supervisor would, and
    /// reports those restarts apart from its own kills. Always false for
    /// the other brokers.
    pub fn crashed(&mut self) -> bool {
        use std::io::{Read, Seek, SeekFrom};
        if !self.tansu {
            return false;
        }
        let Ok(mut file) = std::fs::File::open(&self.log) else {
            return false;
        };
        // Only what was appended since the last look.
        let mut new = Vec::new();
        if file.seek(SeekFrom::Start(self.read)).is_err() || file.read_to_end(&mut new).is_err() {
            return false;
        }
        self.read += new.len() as u64;
        new.windows(9).any(|w| w == b"panicked ")
    }

    /// How long tansu's storage files (`tansu.db` and its WAL, beside the
    /// log) have gone without a write. tansu 0.6.0 sometimes comes back from
    /// a restart with its port open and answers nothing, forever; a relay
    /// with events to publish then writes nothing to it. Zero for the other
    /// brokers (never hung).
    pub fn storage_idle(&self) -> Duration {
        if !self.tansu {
            return Duration::ZERO;
        }
        let dir = self.log.parent().unwrap_or(Path::new("."));
        ["tansu.db", "tansu.db-wal"]
            .iter()
            .filter_map(|f| std::fs::metadata(dir.join(f)).ok()?.modified().ok())
            .filter_map(|t| t.elapsed().ok())
            .min()
            .unwrap_or_default()
    }

    async fn run(&self, verb: &str) -> anyhow::Result<()> {
        let out = Command::new("bash")
            .arg(&self.script)
            .arg(verb)
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("run {} {verb}", self.script.display()))?;
        if !out.status.success() {
            bail!(
                "{} {verb} failed: {}",
                self.script.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    pub async fn kill(&self) -> anyhow::Result<()> {
        self.run("kill").await
    }

    /// Starts it again on the same port and storage (both scripts keep
    /// them); returns once the port accepts.
    pub async fn restart(&self) -> anyhow::Result<()> {
        self.run("restart").await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(())
    }
}

pub const TOPIC: &str = "chaos.events";

/// What a soak runs: the transport, the relay's source and how consumers
/// share the topic. The summary line prints the variant's name in lower
/// case (`transport=kafka`, `embedded`, `nats`, `rabbitmq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// tansu (Kafka's protocol), tests/tansu.sh.
    Kafka,
    /// The SQL transport in the soak's Postgres: no broker.
    Embedded,
    /// nats-server with JetStream, tests/broker-node.sh.
    Nats,
    /// A RabbitMQ node (quorum queues), tests/broker-node.sh.
    Rabbitmq,
}

impl Transport {
    /// Whether a broker process runs beside the outboxd processes.
    pub fn has_broker(self) -> bool {
        self != Transport::Embedded
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RelaySource {
    Poll,
    Wal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Consumers {
    /// Kafka only: each process reads fixed partitions, offsets in Postgres.
    Static,
    /// Members of one consumer group (Kafka's; the embedded transport's
    /// and NATS's leases in Postgres; RabbitMQ's single-active-consumer
    /// queues).
    Group,
}

pub struct Setup<'a> {
    /// The database as the processes reach it (through the delay proxy).
    pub url: &'a str,
    pub transport: Transport,
    /// The broker as the processes reach it (`host:port` of the driver's
    /// proxy); None on the embedded transport.
    pub broker: Option<&'a str>,
    pub relay_source: RelaySource,
    pub consumers: Consumers,
    /// The file plugin on the order route.
    pub file_plugin: &'a Path,
    pub publish_timeout: std::time::Duration,
}

/// The file plugin's name: a second transformer on the order route, loaded
/// from its file rather than the registry.
pub const FILE_PLUGIN: &str = "orders-mask";

/// Settings both process kinds share: the store, the transport, the plugins.
fn common(setup: &Setup<'_>, cache: &Path) -> String {
    let transport = match (setup.transport, setup.broker) {
        (Transport::Kafka, Some(bootstrap)) => format!(
            r#"[transport]
kind = "kafka"
[transport.kafka]
"bootstrap.servers" = "{bootstrap}"
"enable.auto.commit" = "false"
"enable.auto.offset.store" = "false""#
        ),
        // Streams (NATS) or exchanges and quorum queues (RabbitMQ), four
        // partitions each, one replica: the driver creates them before the
        // processes start, and every process would create what is missing.
        (Transport::Nats, Some(server)) => format!(
            r#"[transport]
kind = "nats"
partitions = 4
[transport.nats]
url = "nats://{server}"
[transport.topics]
create = true"#
        ),
        (Transport::Rabbitmq, Some(server)) => format!(
            r#"[transport]
kind = "rabbitmq"
partitions = 4
[transport.rabbitmq]
url = "{}"
[transport.topics]
create = true"#,
            rabbitmq_url(server)
        ),
        _ => "[transport]\nkind = \"embedded\"\npartitions = 4".to_string(),
    };
    format!(
        r#"[database]
url = "{url}"
max_connections = 6
migrate_on_start = false

{transport}

[[plugins]]
name = "shape"
source = "registry"
config = {{ mask = "email" }}

[[plugins]]
name = "{FILE_PLUGIN}"
path = "{file}"
config = {{ mask = "customer_id" }}

[[plugins]]
name = "ledger"
source = "registry"
limits = {{ timeout = "2s" }}

[plugin_runtime]
cache_dir = "{cache}"
registry_poll = "500ms"

[[routes]]
event_type = "order.*"
topic = "{TOPIC}"
transformers = ["shape", "{FILE_PLUGIN}"]

[[routes]]
event_type = "*"
topic = "{TOPIC}"
transformers = ["shape"]
"#,
        url = setup.url,
        file = setup.file_plugin.display(),
        cache = cache.display()
    )
}

/// The soak's RabbitMQ URL for a server at `host:port`: the default
/// `guest` user (the soak's node allows it from other hosts).
pub fn rabbitmq_url(server: &str) -> String {
    format!("amqp://guest:guest@{server}/%2f")
}

/// Writes relay.toml (relay only) and consumer-N.toml (consumers only).
/// Static consumers split the topic's four partitions
/// (`kafka_partitions`), with offsets in Postgres: they join no consumer
/// group, so a broker restart cannot stall them in a rebalance (tansu
/// 0.6.0's group coordinator stopped answering after restarts, and its
/// libsql engine panicked in `UpdateGroup`; see RELIABILITY.md).
/// Both consumer processes run the same one consumer, `ledger` (one
/// group on the one topic), so RabbitMQ's rule that a topic's queues serve
/// one consumer group holds on every transport without a second topic.
pub fn write_configs(dir: &Path, setup: &Setup<'_>) -> anyhow::Result<(PathBuf, [PathBuf; 2])> {
    let cache = dir.join("cache");
    let base = common(setup, &cache);
    let source = match setup.relay_source {
        RelaySource::Poll => "",
        RelaySource::Wal => "source = \"wal\"\n",
    };
    let relay = format!(
        "{base}
[relay]
{source}workers = 2
batch_size = 100
poll_interval = \"100ms\"
publish_timeout = \"{publish_timeout}ms\"
max_attempts = 40
[relay.backoff]
base_seconds = 0.2
max_seconds = 5
",
        publish_timeout = setup.publish_timeout.as_millis()
    );
    let consumer = |n: usize| {
        let partitions = match setup.consumers {
            Consumers::Static if n == 1 => "kafka_partitions = [0, 1]\n",
            Consumers::Static => "kafka_partitions = [2, 3]\n",
            Consumers::Group => "",
        };
        format!(
            "{base}
[relay]
workers = 0

[[consumers]]
name = \"ledger\"
topics = [\"{TOPIC}\"]
handler = \"plugin:ledger\"
tables = {{ write = [\"ledger\"] }}
db_role = \"{role}\"
batch_in_transaction = 10
max_attempts = 20
{partitions}",
            role = plugin_role(setup.url)
        )
    };
    let relay_path = dir.join("relay.toml");
    std::fs::write(&relay_path, relay)?;
    let consumers = [1, 2].map(|n| dir.join(format!("consumer-{n}.toml")));
    for (i, path) in consumers.iter().enumerate() {
        std::fs::write(path, consumer(i + 1))?;
    }
    Ok((relay_path, consumers))
}

/// The ledger plugin's Postgres role: roles belong to the cluster, so it is
/// named after the soak's database.
pub fn plugin_role(url: &str) -> String {
    let database = url.rsplit('/').next().unwrap_or("outboxd_chaos");
    format!("{database}_ledger")
}

/// `outboxd plugin-roles`, as an operator would before the first start:
/// the consumer plugin's role, holding exactly its tables.
pub async fn plugin_roles(outboxd: &Path, config: &Path) -> anyhow::Result<()> {
    let out = Command::new(outboxd)
        .arg("--config")
        .arg(config)
        .arg("plugin-roles")
        .env("OUTBOXD_LOG", "warn")
        .output()
        .await
        .context("outboxd plugin-roles")?;
    if !out.status.success() {
        bail!(
            "outboxd plugin-roles failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// `outboxd plugin deploy FILE --name NAME [--activate]`, as an operator would.
pub async fn deploy(
    outboxd: &Path,
    config: &Path,
    wasm: &Path,
    name: &str,
) -> anyhow::Result<String> {
    let out = Command::new(outboxd)
        .arg("--config")
        .arg(config)
        .args(["plugin", "deploy"])
        .arg(wasm)
        .args(["--name", name, "--by", "chaos", "--activate"])
        .env("OUTBOXD_LOG", "warn")
        .output()
        .await
        .with_context(|| format!("deploy {}", wasm.display()))?;
    if !out.status.success() {
        bail!(
            "deploying {} as {name} failed: {}{}",
            wasm.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .trim()
        .replace('\n', "; "))
}
