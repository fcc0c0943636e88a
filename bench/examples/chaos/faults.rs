//! The soak's faults: what is injected and when (a seeded plan), what was
//! counted, and the broker supervisor that restarts tansu after a panic or
//! a hang.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::cluster::Broker;
use crate::net::{NetFault, Target};
use crate::rng::Rng;

/// How many faults of each kind were injected.
#[derive(Debug, Default, serde::Serialize)]
pub struct Kills {
    pub relay: u32,
    pub consumer: u32,
    pub broker: u32,
    pub pg_backends: u32,
    pub swaps: u32,
    /// Restarts after tansu itself panicked (not counted in `broker`).
    pub broker_crashes: u32,
    /// Restarts after tansu stopped answering without a panic (see
    /// [`broker_hung`]).
    pub broker_hangs: u32,
    /// Network faults by kind (see [`NetKind::label`]).
    pub net: BTreeMap<String, u32>,
    /// Processes that exited by themselves with an error while faults ran,
    /// and were started again (a supervisor's job).
    pub self_exits: u32,
}

impl Kills {
    pub fn net_total(&self) -> u32 {
        self.net.values().sum()
    }
}

/// tansu counts as hung when events have waited to be published for over
/// `HANG` and its storage has not been written for as long, while its last
/// (re)start is older than that too. Restarting it is what a supervisor's
/// liveness probe would do; the restarts are reported as `broker_hangs`.
/// tansu only: nats-server and RabbitMQ are never restarted for a hang.
const HANG: Duration = Duration::from_secs(30);

pub fn broker_hung(broker: &Broker, backlog_ms: i64, since_restart: Duration) -> bool {
    broker.tansu
        && backlog_ms > HANG.as_millis() as i64
        && broker.storage_idle() > HANG
        && since_restart > HANG
}

#[derive(Debug, Clone, Copy)]
pub enum Fault {
    KillProc(usize),
    StartProc(usize),
    Broker,
    BrokerBack,
    PgTerminate,
    SwapTransformer,
    SwapConsumer,
    /// A network fault on process `proc`'s link to `target`, healed by the
    /// matching `Heal` scheduled `length` later.
    Net {
        proc: usize,
        target: Target,
        fault: NetFault,
        kind: NetKind,
        length: Duration,
    },
    Heal {
        proc: usize,
        target: Target,
        fault: NetFault,
    },
}

/// The kinds of network fault each run must cover (at least ten of each in
/// a long run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetKind {
    /// A full partition of a relay, a consumer or any process from the
    /// service, shorter (`long == false`) or longer than `publish_timeout`.
    Partition {
        link: Link,
        long: bool,
    },
    Loss,
    Delay,
    Stall,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    RelayBroker,
    ConsumerBroker,
    AnyPg,
}

impl NetKind {
    pub fn label(self) -> String {
        match self {
            NetKind::Partition { link, long } => format!(
                "partition_{}_{}",
                match link {
                    Link::RelayBroker => "relay_broker",
                    Link::ConsumerBroker => "consumer_broker",
                    Link::AnyPg => "pg",
                },
                if long { "long" } else { "short" }
            ),
            NetKind::Loss => "loss".into(),
            NetKind::Delay => "delay".into(),
            NetKind::Stall => "hang".into(),
        }
    }
}

/// The network fault kinds for a soak with (`broker`) or without a broker.
fn net_kinds(broker: bool) -> Vec<NetKind> {
    let mut links = vec![Link::AnyPg];
    if broker {
        links.extend([Link::RelayBroker, Link::ConsumerBroker]);
    }
    let mut kinds = Vec::new();
    for link in links {
        for long in [false, true] {
            kinds.push(NetKind::Partition { link, long });
        }
    }
    kinds.extend([NetKind::Loss, NetKind::Delay, NetKind::Stall]);
    kinds
}

/// Network faults, one at a time, from 4 s to 85 % of the run: every kind
/// in turn (shuffled each round), random processes, lengths and gaps. The
/// first round starts with a partition and then a delay, so even the
/// shortest run has both. Processes 0 and 1 are relays, 2 and 3 consumers.
pub fn net_schedule(
    rng: &mut Rng,
    run: Duration,
    broker: bool,
    publish_timeout: Duration,
) -> Vec<(Duration, Fault)> {
    let kinds = net_kinds(broker);
    let mut plan = Vec::new();
    let mut t = Duration::from_secs(4);
    let mut round: Vec<NetKind> = Vec::new();
    let mut first = true;
    while t < run.mul_f64(0.85) {
        if round.is_empty() {
            round = kinds.clone();
            for i in (1..round.len()).rev() {
                round.swap(i, rng.below(i as u64 + 1) as usize);
            }
            if first {
                // Popped from the end: a partition, then a delay.
                round.retain(|k| *k != NetKind::Delay);
                let p = round
                    .iter()
                    .position(|k| matches!(k, NetKind::Partition { long: false, .. }))
                    .unwrap_or(0);
                let partition = round.remove(p);
                round.push(NetKind::Delay);
                round.push(partition);
                first = false;
            }
        }
        let Some(kind) = round.pop() else { break };
        let any_target = |rng: &mut Rng| {
            if broker && rng.below(2) == 0 {
                Target::Broker
            } else {
                Target::Pg
            }
        };
        let (proc, target, fault, length) = match kind {
            NetKind::Partition { link, long } => {
                let (proc, target) = match link {
                    Link::RelayBroker => (rng.below(2) as usize, Target::Broker),
                    Link::ConsumerBroker => (2 + rng.below(2) as usize, Target::Broker),
                    Link::AnyPg => (rng.below(4) as usize, Target::Pg),
                };
                let length = if long {
                    publish_timeout + rng.millis(1_000, 8_000)
                } else {
                    rng.millis(500, publish_timeout.as_millis() as u64 * 3 / 4)
                };
                (proc, target, NetFault::Partition, length)
            }
            NetKind::Loss => {
                let pct = 1 + rng.below(30) as u8;
                (
                    rng.below(4) as usize,
                    any_target(rng),
                    NetFault::Loss(pct),
                    rng.millis(5_000, 20_000),
                )
            }
            NetKind::Delay => {
                let base = rng.millis(50, 500);
                let fault = NetFault::Delay {
                    base,
                    jitter: base / 2,
                };
                (
                    rng.below(4) as usize,
                    any_target(rng),
                    fault,
                    rng.millis(3_000, 15_000),
                )
            }
            NetKind::Stall => (
                rng.below(4) as usize,
                any_target(rng),
                NetFault::Stall,
                rng.millis(3_000, 15_000),
            ),
        };
        plan.push((
            t,
            Fault::Net {
                proc,
                target,
                fault,
                kind,
                length,
            },
        ));
        plan.push((
            t + length,
            Fault::Heal {
                proc,
                target,
                fault,
            },
        ));
        t += length + rng.millis(1_000, 4_000);
    }
    plan
}

/// The fault plan: the broker three times and each swap once at fixed
/// points, processes and connections at random moments in between.
pub fn schedule(rng: &mut Rng, run: Duration, broker_kills: u32) -> Vec<(Duration, Fault)> {
    let at = |f: f64| run.mul_f64(f);
    let mut plan = vec![
        (at(0.30), Fault::SwapTransformer),
        (at(0.55), Fault::SwapConsumer),
    ];
    // Spread over 15 %–70 % of the run.
    for k in 0..broker_kills {
        let f = 0.15 + 0.55 * f64::from(k) / f64::from(broker_kills.saturating_sub(1).max(1));
        plan.push((at(f), Fault::Broker));
    }
    let mut t = Duration::from_secs(3);
    let mut next_proc = 0usize;
    while t < at(0.9) {
        // Every process is hit in turn; the gaps are random.
        plan.push((t, Fault::KillProc(next_proc % 4)));
        next_proc += 1;
        // Each restarted process gets a few seconds to make progress
        // before the next kill.
        t += rng.millis(4_000, 12_000);
    }
    let mut t = Duration::from_secs(2);
    while t < at(0.9) {
        plan.push((t, Fault::PgTerminate));
        t += rng.millis(3_000, 9_000);
    }
    plan.sort_by_key(|(t, _)| *t);
    plan
}

/// Restarts a broker that crashed by itself.
pub async fn supervise(broker: &mut Broker, kills: &mut Kills) -> anyhow::Result<()> {
    eprintln!("chaos: tansu panicked (see its log); restarting it");
    broker.kill().await?;
    broker.restart().await?;
    kills.broker_crashes += 1;
    Ok(())
}

/// Restarts a broker that stopped answering (see [`broker_hung`]).
pub async fn unhang(broker: &mut Broker, kills: &mut Kills) -> anyhow::Result<()> {
    eprintln!(
        "chaos: tansu wrote nothing for {} s while events waited; restarting it",
        HANG.as_secs()
    );
    broker.kill().await?;
    broker.restart().await?;
    kills.broker_hangs += 1;
    Ok(())
}
