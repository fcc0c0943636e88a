//! The soak's faults: what is injected and when (a seeded plan), what was
//! counted, and the broker supervisor that restarts tansu after a panic or
//! a hang.

use std::time::Duration;

use crate::cluster::Broker;
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
}

/// tansu counts as hung when events have waited to be published for over
/// `HANG` and its storage has not been written for as long, while its last
/// (re)start is older than that too. Restarting it is what a supervisor's
/// liveness probe would do; the restarts are reported as `broker_hangs`.
const HANG: Duration = Duration::from_secs(30);

pub fn broker_hung(broker: &Broker, backlog_ms: i64, since_restart: Duration) -> bool {
    backlog_ms > HANG.as_millis() as i64 && broker.storage_idle() > HANG && since_restart > HANG
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
