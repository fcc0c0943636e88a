//! The soak's network faults, between an outboxd process and a service
//! (Postgres or the broker), in both directions.
//!
//! Every process and service runs in a network namespace of its own
//! (tests/netns.sh makes them, joined by a bridge in another namespace), and
//! reaches Postgres and the broker only through this driver's delay proxies.
//! - partitions and packet loss are nftables drop rules in the process's
//!   namespace, on its traffic to and from the proxy's port;
//! - delay, jitter and hung connections are the proxy's modes for that
//!   process's address.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::Command;

use crate::proxy::{Mode, Proxy};

/// The subnet tests/netns.sh gives its hosts.
pub const DRV: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 2);
pub const PG_PROXY_PORT: u16 = 15432;
/// The broker's proxy (Kafka, NATS or RabbitMQ: whichever the soak runs).
pub const BROKER_PROXY_PORT: u16 = 19092;

/// A process host's address (tests/netns.sh `hosts`).
pub fn address(host: &str) -> anyhow::Result<Ipv4Addr> {
    let last = match host {
        "relay-1" => 21,
        "relay-2" => 22,
        "consumer-1" => 31,
        "consumer-2" => 32,
        other => bail!("no namespace host named {other}"),
    };
    Ok(Ipv4Addr::new(10, 213, 0, last))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Pg,
    /// The soak's broker; its nftables chains are tests/netns.sh's
    /// `kafka_out`/`kafka_in` whatever the broker.
    Broker,
}

impl Target {
    pub fn label(self) -> &'static str {
        match self {
            Target::Pg => "pg",
            Target::Broker => "broker",
        }
    }
    fn chain(self) -> &'static str {
        match self {
            Target::Pg => "pg",
            Target::Broker => "kafka",
        }
    }
    fn port(self) -> u16 {
        match self {
            Target::Pg => PG_PROXY_PORT,
            Target::Broker => BROKER_PROXY_PORT,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetFault {
    /// Every packet dropped, both ways.
    Partition,
    /// This percentage of packets dropped, both ways.
    Loss(u8),
    Delay {
        base: Duration,
        jitter: Duration,
    },
    /// Bytes stop; new connections are accepted and never answered.
    Stall,
}

/// The namespaces and the proxies.
pub struct Net {
    prefix: String,
    pg: Proxy,
    broker: Option<Proxy>,
}

impl Net {
    /// Starts the proxies: Postgres's always, the broker's when there is one.
    pub async fn start(
        prefix: &str,
        pg_upstream: SocketAddr,
        broker_upstream: Option<SocketAddr>,
        seed: u64,
    ) -> anyhow::Result<Self> {
        let listen = |port| SocketAddr::new(IpAddr::V4(DRV), port);
        let pg = Proxy::start(listen(PG_PROXY_PORT), pg_upstream, seed).await?;
        let broker = match broker_upstream {
            Some(up) => {
                Some(Proxy::start(listen(BROKER_PROXY_PORT), up, seed.rotate_left(7)).await?)
            }
            None => None,
        };
        Ok(Self {
            prefix: prefix.to_string(),
            pg,
            broker,
        })
    }

    /// The namespace a host's processes run in.
    pub fn namespace(&self, host: &str) -> String {
        format!("{}-{host}", self.prefix)
    }

    /// The address processes use for a service: the proxy in front of it.
    pub fn service(target: Target) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(DRV), target.port())
    }

    fn proxy(&self, target: Target) -> anyhow::Result<&Proxy> {
        match target {
            Target::Pg => Ok(&self.pg),
            Target::Broker => self.broker.as_ref().context("no broker in this soak"),
        }
    }

    pub async fn inject(&self, host: &str, target: Target, fault: NetFault) -> anyhow::Result<()> {
        let (c, port) = (target.chain(), target.port());
        let drop = match fault {
            NetFault::Partition => "drop".to_string(),
            NetFault::Loss(pct) => format!("numgen random mod 100 < {pct} drop"),
            NetFault::Delay { base, jitter } => {
                let ip = IpAddr::V4(address(host)?);
                self.proxy(target)?.set(ip, Mode::Delay { base, jitter });
                return Ok(());
            }
            NetFault::Stall => {
                self.proxy(target)?
                    .set(IpAddr::V4(address(host)?), Mode::Stall);
                return Ok(());
            }
        };
        self.nft(
            host,
            &format!(
                "add rule inet chaos {c}_out ip daddr {DRV} tcp dport {port} {drop}\n\
                 add rule inet chaos {c}_in ip saddr {DRV} tcp sport {port} {drop}\n"
            ),
        )
        .await
    }

    pub async fn heal(&self, host: &str, target: Target, fault: NetFault) -> anyhow::Result<()> {
        match fault {
            NetFault::Partition | NetFault::Loss(_) => {
                let c = target.chain();
                self.nft(
                    host,
                    &format!("flush chain inet chaos {c}_out\nflush chain inet chaos {c}_in\n"),
                )
                .await
            }
            NetFault::Delay { .. } | NetFault::Stall => {
                self.proxy(target)?
                    .set(IpAddr::V4(address(host)?), Mode::Pass);
                Ok(())
            }
        }
    }

    async fn nft(&self, host: &str, script: &str) -> anyhow::Result<()> {
        use tokio::io::AsyncWriteExt;
        let ns = self.namespace(host);
        let mut child = Command::new("ip")
            .args(["netns", "exec", &ns, "nft", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("run ip netns exec … nft")?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(script.as_bytes()).await?;
        }
        let out = child.wait_with_output().await?;
        if !out.status.success() {
            bail!(
                "nft in {ns} failed: {}\n{script}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }
}
