//! The WAL relay (`relay.source = "wal"`, Postgres): reads committed outbox
//! inserts from a logical replication slot with the built-in `pgoutput`
//! plugin, instead of claiming them with a query.
//!
//! - Events arrive in commit order, so per-aggregate order holds without
//!   the claim query. They take the polling relay's own path: a
//!   [`Relay`] over [`WalFeed`], so the same plugin chains, routes,
//!   publisher, marks and metrics apply.
//! - The slot's flush position is confirmed only past transactions whose
//!   every event is settled ([`state`]). After a crash the stream replays
//!   from there: at least once, never lost.
//! - A failed event is marked as polling marks it and its aggregate is
//!   handed to polling ([`HandedStore`]) until polling has published all
//!   of it; other aggregates keep streaming.
//! - One process reads a slot at a time; the others are hot standbys that
//!   try to take it every `relay.wal.standby_retry`.
//! - Past `relay.wal.max_lag_bytes` of lag the process falls back to
//!   polling the whole outbox, and keeps confirming the stream so the slot
//!   retains no WAL.

pub mod metrics;
pub mod pgoutput;
pub mod state;

use std::collections::HashSet;
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use outboxd_core::config::WalSection;
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent};
use tokio::sync::watch;

use super::worker::{self, WorkerConfig};
use super::{Relay, RelayError, StepOutcome};
use crate::broker::Publisher;
use crate::fault::{FaultPoint, Faults};
use crate::store::outbox::wal::{self as wal_store, HandedStore, WalFeed};
use crate::store::{AnyStore, StoreError};
use pgoutput::{Message, Relations};
use state::{Pending, Seed, StreamState};

/// More unpublished rows than this when a reader starts, and their
/// aggregates go to polling whole rather than being held row by row.
const SEED_LIMIT: i64 = 1_000_000;

/// The longest pause between two reads of the handed aggregates while
/// nothing changes for them (a dead event waits for an operator).
const MAX_HANDED_PAUSE: Duration = Duration::from_secs(5);

/// Batches of the handed aggregates published per round.
const HANDED_STEPS: usize = 4;

/// What a round over the handed aggregates did.
#[derive(Debug, Default)]
struct HandedRound {
    /// Something was published or taken back.
    changed: bool,
    /// It published every batch it could: more may be due at once.
    busy: bool,
}

/// Stream messages read before publishing what they committed: a burst of
/// transactions becomes one batch rather than one each.
const READ_AHEAD: usize = 512;

/// The WAL relay of one process.
pub struct WalRelay<P> {
    wal: WalSection,
    replication: ReplicationConfig,
    /// database.url with its password hidden, for errors.
    shown_url: String,
    batch_size: usize,
    poll_interval: Duration,
    /// Batches published and marked at once: `relay.workers`, twice that
    /// with `relay.pipeline`.
    in_flight: usize,
    feed: WalFeed,
    relay: Relay<WalFeed, P>,
    handed_store: HandedStore,
    handed_relay: Relay<HandedStore, P>,
    /// The relays the process falls back to (relay.workers of them).
    fallback: Vec<Relay<AnyStore, P>>,
    fallback_worker: WorkerConfig,
    wake: Option<watch::Receiver<u64>>,
    metrics: metrics::WalMetrics,
    faults: Faults,
}

/// A batch from the stream, published and marked: what its events became.
struct Flown {
    /// Found already done in the table: not sent again.
    already: Vec<Pending>,
    /// Sent and marked.
    go: Vec<Pending>,
    /// Seqs of `go` that failed (retry or dead).
    failed: Vec<i64>,
}

/// Why a reading session ended.
enum SessionEnd {
    Shutdown,
    Fallback(ReplicationClient),
}

#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error(transparent)]
    Fault(crate::fault::InjectedFault),
    #[error("{0}")]
    Lost(String),
}

impl From<StoreError> for SessionError {
    fn from(e: StoreError) -> Self {
        SessionError::Lost(e.to_string())
    }
}

impl From<RelayError> for SessionError {
    fn from(e: RelayError) -> Self {
        match e {
            RelayError::Fault(f) => SessionError::Fault(f),
            RelayError::Store(e) => e.into(),
        }
    }
}

impl From<pgwire_replication::PgWireError> for SessionError {
    fn from(e: pgwire_replication::PgWireError) -> Self {
        SessionError::Lost(format!("replication stream: {e}"))
    }
}

impl From<pgoutput::DecodeError> for SessionError {
    fn from(e: pgoutput::DecodeError) -> Self {
        SessionError::Lost(e.to_string())
    }
}

/// What a [`WalRelay`] is made of; see `daemon/relays.rs`.
pub struct WalParts<P> {
    pub database_url: String,
    pub wal: WalSection,
    pub batch_size: usize,
    pub poll_interval: Duration,
    pub pipeline: bool,
    pub feed: WalFeed,
    /// Makes a relay over a store, with the process's router, config,
    /// chains, faults and metrics.
    pub relay: Relay<WalFeed, P>,
    pub handed_relay: Relay<HandedStore, P>,
    pub handed_store: HandedStore,
    pub fallback: Vec<Relay<AnyStore, P>>,
    pub fallback_worker: WorkerConfig,
    pub wake: Option<watch::Receiver<u64>>,
    /// This process's WAL relay metrics (`Metrics::wal`).
    pub metrics: metrics::WalMetrics,
    pub faults: Faults,
}

impl<P: Publisher> WalRelay<P> {
    pub fn new(parts: WalParts<P>) -> Result<Self, String> {
        let replication = replication_config(&parts.database_url, &parts.wal)?;
        Ok(Self {
            shown_url: crate::db_url::redact_url(&parts.database_url),
            wal: parts.wal,
            replication,
            batch_size: parts.batch_size,
            poll_interval: parts.poll_interval,
            in_flight: parts.fallback.len().max(1) * if parts.pipeline { 2 } else { 1 },
            feed: parts.feed,
            relay: parts.relay,
            handed_store: parts.handed_store,
            handed_relay: parts.handed_relay,
            fallback: parts.fallback,
            fallback_worker: parts.fallback_worker,
            wake: parts.wake,
            metrics: parts.metrics,
            faults: parts.faults,
        })
    }

    /// Reads the slot whenever this process can hold it, until `shutdown`.
    /// Returns an error only for an injected fault (a simulated crash).
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) -> Result<(), String> {
        let mut standby_since: Option<std::time::Instant> = None;
        let mut error_streak: u32 = 0;
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            let client = match self.take_slot().await {
                Ok(c) => c,
                Err(e) if e.contains("55006") => {
                    if standby_since.is_none() {
                        tracing::info!(
                            slot = %self.wal.slot,
                            retry = ?self.wal.standby_retry,
                            "WAL relay on standby: another process reads the replication slot; this one takes over when it stops"
                        );
                        standby_since = Some(std::time::Instant::now());
                    }
                    if sleep_or_shutdown(self.wal.standby_retry, &mut shutdown).await {
                        return Ok(());
                    }
                    continue;
                }
                Err(e) => {
                    error_streak = error_streak.saturating_add(1);
                    let pause = backoff(error_streak);
                    tracing::error!(slot = %self.wal.slot, error = %e, retry_in = ?pause, "WAL relay cannot read the replication slot");
                    if sleep_or_shutdown(pause, &mut shutdown).await {
                        return Ok(());
                    }
                    continue;
                }
            };
            error_streak = 0;
            if let Some(since) = standby_since.take() {
                tracing::warn!(slot = %self.wal.slot, after = ?since.elapsed(), "WAL relay took over the replication slot");
            } else {
                tracing::info!(slot = %self.wal.slot, "WAL relay reads the replication slot");
            }
            self.metrics.takeovers.inc();
            self.metrics.active.set(1);
            let ended = self.session(client, &mut shutdown).await;
            self.metrics.active.set(0);
            match ended {
                Ok(SessionEnd::Shutdown) => return Ok(()),
                Ok(SessionEnd::Fallback(client)) => return self.fall_back(client, shutdown).await,
                Err(SessionError::Fault(f)) => return Err(f.to_string()),
                Err(SessionError::Lost(e)) => {
                    error_streak = error_streak.saturating_add(1);
                    let pause = backoff(error_streak);
                    tracing::error!(slot = %self.wal.slot, error = %e, retry_in = ?pause, "WAL relay lost its session; unsettled events are read again from the slot");
                    if sleep_or_shutdown(pause, &mut shutdown).await {
                        return Ok(());
                    }
                }
            }
        }
    }

    async fn take_slot(&self) -> Result<ReplicationClient, String> {
        let mut client = ReplicationClient::connect(self.replication.clone())
            .await
            .map_err(|e| match e {
                // Named with its fix, as the pools' TLS failures are.
                pgwire_replication::PgWireError::Tls(text) => format!(
                    "replication connection: {}",
                    crate::store::backend::pg_tls::explain_text(&self.shown_url, &text)
                ),
                e => e.to_string(),
            })?;
        client.wait_started().await.map_err(|e| e.to_string())?;
        Ok(client)
    }

    /// What the reader must know of the table before it trusts the stream.
    async fn seed(&self) -> Result<StreamState, SessionError> {
        let pool = self.feed.pool();
        let found = wal_store::unpublished(pool, SEED_LIMIT).await?;
        // Read after the rows: every row they saw committed before it.
        let fence = wal_store::current_lsn(pool).await?;
        let start = wal_store::slot_confirmed_lsn(pool, &self.wal.slot).await?;
        Ok(match found {
            Some(u) => StreamState::new(Seed {
                fresh: u.fresh,
                stuck: u.stuck,
                fence,
                start,
            }),
            None => {
                let all = wal_store::aggregates_with_unpublished(pool).await?;
                tracing::warn!(
                    aggregates = all.len(),
                    "WAL relay: over {SEED_LIMIT} unpublished rows at start; their aggregates are published by polling first"
                );
                StreamState::with_all_handed(all, fence, start)
            }
        })
    }

    async fn session(
        &self,
        mut client: ReplicationClient,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<SessionEnd, SessionError> {
        let mut st = self.seed().await?;
        let mut relations = Relations::default();
        let mut confirmed = 0u64;
        let mut handed_pause = self.poll_interval;
        let mut next_handed = tokio::time::Instant::now();
        let mut last_wal_end_read = std::time::Instant::now();
        // Batches being published and marked while the stream is read on:
        // up to `self.in_flight`, never two holding the same aggregate.
        let mut flying = FuturesUnordered::new();
        let mut busy: HashSet<String> = HashSet::new();
        // Read no further ahead than this while batches are queued: the
        // stream waits in the slot, not in memory.
        let queue_cap = READ_AHEAD.max(self.batch_size * self.in_flight * 4);
        loop {
            // Events to publish: the reader is busy. A position that moves
            // with nothing queued comes from keepalives (WAL written
            // elsewhere on the server) and needs no query.
            let working = st.queued() > 0 || !flying.is_empty();
            while flying.len() < self.in_flight {
                let batch = st.next_batch_excluding(self.batch_size, &busy);
                if batch.is_empty() {
                    break;
                }
                busy.extend(batch.iter().map(|p| p.ev.aggregate_id.clone()));
                flying.push(self.fly(batch).boxed());
            }
            let position = st.confirmable();
            if position > confirmed {
                confirmed = position;
                client.update_applied_lsn(Lsn::from_u64(position));
                // The stream only shows the server's WAL end as far as it
                // has been read, and a reader that is behind reads it late.
                // While it is busy, ask the server (never when idle: an
                // idle reader makes no query, also when other databases'
                // writes move the server's WAL and with it the position).
                if working && last_wal_end_read.elapsed() >= self.wal.status_interval {
                    last_wal_end_read = std::time::Instant::now();
                    st.server_at(wal_store::current_lsn(self.feed.pool()).await?);
                }
            }
            let lag = st.lag();
            self.metrics.lag_bytes.set(lag);
            self.metrics.handed_aggregates.set(st.handed_count() as u64);
            if lag > self.wal.max_lag_bytes {
                tracing::error!(
                    slot = %self.wal.slot,
                    lag_bytes = lag,
                    max_lag_bytes = self.wal.max_lag_bytes,
                    "WAL RELAY FELL BACK TO POLLING: the replication slot is further behind than relay.wal.max_lag_bytes; \
                     this process now polls the outbox and discards the stream so the slot retains no WAL. \
                     Restart the process to read the WAL again, and find what slowed it (broker, database, plugins)"
                );
                // What is in flight was published; unmarked, polling
                // publishes it again (at least once).
                return Ok(SessionEnd::Fallback(client));
            }

            let handed_due = st.handed_count() > 0;
            let may_read = st.queued() < queue_cap;
            tokio::select! {
                biased;
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        // Let what is in flight be marked: a restart then
                        // has nothing of it to publish again.
                        while let Some(flown) = flying.next().await {
                            self.landed(&mut st, &mut busy, flown?).await?;
                        }
                        let _ = client.shutdown().await;
                        return Ok(SessionEnd::Shutdown);
                    }
                }
                Some(flown) = flying.next(), if !flying.is_empty() => {
                    if self.landed(&mut st, &mut busy, flown?).await? {
                        handed_pause = self.poll_interval;
                        next_handed = tokio::time::Instant::now() + handed_pause;
                    }
                }
                _ = tokio::time::sleep_until(next_handed), if handed_due => {
                    let round = self.poll_handed(&mut st).await?;
                    handed_pause = if round.changed { self.poll_interval } else { (handed_pause * 2).min(MAX_HANDED_PAUSE) };
                    // Full batches: more is due now; go on after a look at
                    // the stream.
                    next_handed = tokio::time::Instant::now()
                        + if round.busy { Duration::ZERO } else { handed_pause };
                }
                received = client.recv(), if may_read => {
                    let Some(ev) = received? else {
                        return Err(SessionError::Lost("the server ended the replication stream".into()));
                    };
                    self.on_message(&mut st, &mut relations, ev)?;
                    // Whatever else has arrived joins the same batches.
                    for _ in 0..READ_AHEAD {
                        match client.recv().now_or_never() {
                            Some(Ok(Some(ev))) => self.on_message(&mut st, &mut relations, ev)?,
                            Some(Ok(None)) => return Err(SessionError::Lost("the server ended the replication stream".into())),
                            Some(Err(e)) => return Err(e.into()),
                            None => break,
                        }
                    }
                }
            }
        }
    }

    fn on_message(
        &self,
        st: &mut StreamState,
        relations: &mut Relations,
        ev: ReplicationEvent,
    ) -> Result<(), SessionError> {
        match ev {
            ReplicationEvent::Begin { .. } => st.begin(),
            ReplicationEvent::Commit { end_lsn, .. } => st.commit(end_lsn.as_u64()),
            ReplicationEvent::KeepAlive { wal_end, .. } => st.keepalive(wal_end.as_u64()),
            ReplicationEvent::XLogData { wal_end, data, .. } => {
                st.server_at(wal_end.as_u64());
                match pgoutput::decode(&data)? {
                    Message::Relation(r) => relations.learn(&r)?,
                    Message::Insert { relation, row } => {
                        if let Some(event) = relations.event(relation, &row)? {
                            st.insert(event);
                        }
                    }
                    Message::Other(_) => {}
                }
            }
            ReplicationEvent::Message { .. } | ReplicationEvent::StoppedAt { .. } => {}
        }
        Ok(())
    }

    /// Publishes one batch and marks it: drops what the table shows as
    /// done, sends the rest (plugin chains, publish, every acknowledgement
    /// awaited), then marks it in a transaction of its own. Several run at
    /// once; none touches the stream's state.
    async fn fly(&self, batch: Vec<Pending>) -> Result<Flown, SessionError> {
        let check: Vec<i64> = batch
            .iter()
            .filter(|p| p.verify)
            .map(|p| p.ev.seq)
            .collect();
        let done = wal_store::done_among(self.feed.pool(), &check).await?;
        let (already, go): (Vec<Pending>, Vec<Pending>) =
            batch.into_iter().partition(|p| done.contains(&p.ev.seq));
        if go.is_empty() {
            return Ok(Flown {
                already,
                go,
                failed: Vec::new(),
            });
        }
        let seqs: Vec<i64> = go.iter().map(|p| p.ev.seq).collect();
        // Offered and claimed within one poll (the feed's claim does not
        // wait), so a batch started beside this one cannot take it.
        self.feed.offer(go.iter().map(|p| p.ev.clone()).collect());
        if let Some(sent) = self.relay.send().await? {
            self.relay.settle(sent).await?;
        }
        Ok(Flown {
            already,
            go,
            failed: self.feed.take_failed_among(&seqs),
        })
    }

    /// A batch came back: failed events hand their aggregates to polling,
    /// every event of it is settled, and its aggregates may fly again.
    /// Returns whether an aggregate was handed to polling.
    async fn landed(
        &self,
        st: &mut StreamState,
        busy: &mut HashSet<String>,
        flown: Flown,
    ) -> Result<bool, SessionError> {
        for p in flown.already.iter().chain(&flown.go) {
            busy.remove(&p.ev.aggregate_id);
        }
        st.settle(&flown.already);
        for p in flown.go.iter().filter(|p| flown.failed.contains(&p.ev.seq)) {
            st.hand(&p.ev.aggregate_id);
        }
        // The gauge moves when an aggregate is handed, not only at the next
        // status update, so it is never behind what polling already retries.
        self.metrics.handed_aggregates.set(st.handed_count() as u64);
        st.settle(&flown.go);
        self.faults
            .check(FaultPoint::WalAfterMarkBeforeConfirm)
            .await
            .map_err(SessionError::Fault)?;
        Ok(!flown.failed.is_empty())
    }

    /// One round of polling over the handed aggregates (a few batches, so
    /// the stream is not starved), then takes back those it has fully
    /// published.
    async fn poll_handed(&self, st: &mut StreamState) -> Result<HandedRound, SessionError> {
        let handed = st.handed();
        self.handed_store.set(handed.clone());
        let mut round = HandedRound::default();
        let mut drained = false;
        for _ in 0..HANDED_STEPS {
            match self.handed_relay.step().await? {
                StepOutcome::Published(_) => round.changed = true,
                StepOutcome::Idle => {
                    drained = true;
                    break;
                }
            }
        }
        if !drained {
            // Still draining: the release check waits for a round that
            // finds nothing left to claim.
            round.busy = true;
            return Ok(round);
        }
        let (still, fence) = wal_store::still_unpublished(self.feed.pool(), &handed).await?;
        for aggregate in handed.iter().filter(|a| !still.contains(*a)) {
            st.release(aggregate, fence);
            round.changed = true;
        }
        Ok(round)
    }

    /// Polls the whole outbox from now on, while the stream is read and
    /// confirmed as it arrives: the slot keeps its reader (standbys stay
    /// standbys) and retains no WAL.
    async fn fall_back(
        self,
        mut client: ReplicationClient,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), String> {
        self.metrics.fallback.set(1);
        self.metrics.active.set(1);
        let workers = self.fallback.iter().map(|relay| {
            let wake = self.wake.clone();
            let shutdown = shutdown.clone();
            let cfg = self.fallback_worker.clone();
            async move { worker::run(relay, &cfg, wake, shutdown).await }
        });
        let mut stream_shutdown = shutdown.clone();
        let drain = async {
            let mut open = false;
            loop {
                tokio::select! {
                    changed = stream_shutdown.changed() => {
                        if changed.is_err() || *stream_shutdown.borrow() {
                            let _ = client.shutdown().await;
                            return Ok::<(), String>(());
                        }
                    }
                    received = client.recv() => {
                        let ev = match received {
                            Ok(Some(ev)) => ev,
                            Ok(None) => return Ok(()),
                            // Polling carries on; the slot is free for a
                            // standby, which reads it from where it stands.
                            Err(e) => {
                                tracing::error!(error = %e, "WAL relay (fallen back to polling): the stream ended");
                                self.metrics.active.set(0);
                                return Ok(());
                            }
                        };
                        let confirm = match ev {
                            ReplicationEvent::Begin { .. } => { open = true; None }
                            ReplicationEvent::Commit { end_lsn, .. } => { open = false; Some(end_lsn) }
                            ReplicationEvent::KeepAlive { wal_end, .. } if !open => Some(wal_end),
                            _ => None,
                        };
                        if let Some(lsn) = confirm {
                            client.update_applied_lsn(lsn);
                        }
                    }
                }
            }
        };
        let (results, _) = tokio::join!(futures_util::future::join_all(workers), drain);
        self.metrics.active.set(0);
        for r in results {
            r.map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

fn backoff(streak: u32) -> Duration {
    Duration::from_millis(200)
        .saturating_mul(2u32.saturating_pow(streak.min(8)))
        .min(Duration::from_secs(30))
}

/// Sleeps `d`; true when shutdown came first.
async fn sleep_or_shutdown(d: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => *shutdown.borrow(),
        changed = shutdown.changed() => changed.is_err() || *shutdown.borrow(),
    }
}

/// The replication connection for `database.url`: the same server, user,
/// password, database and TLS mode, with the session settings the decoder
/// relies on (ISO dates in UTC) and the configured `wal_sender_timeout`.
pub fn replication_config(url: &str, wal: &WalSection) -> Result<ReplicationConfig, String> {
    let bad = |why: &str| {
        format!(
            "database.url: {why}; relay.source = \"wal\" opens a replication connection from it (postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?sslmode=...])"
        )
    };
    let parsed = url::Url::parse(url).map_err(|e| bad(&format!("not a URL ({e})")))?;
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let query = |key: &str| {
        parsed
            .query_pairs()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.into_owned())
    };
    let host = query("host")
        .or_else(|| parsed.host_str().map(str::to_string))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    let port = query("port")
        .and_then(|p| p.parse().ok())
        .or(parsed.port())
        .unwrap_or(5432);
    let user = Some(decode(parsed.username()))
        .filter(|u| !u.is_empty())
        .or_else(|| query("user"))
        .or_else(|| std::env::var("PGUSER").ok())
        .or_else(|| std::env::var("USER").ok())
        .ok_or_else(|| bad("no user name"))?;
    let password = parsed
        .password()
        .map(decode)
        .or_else(|| query("password"))
        .or_else(|| std::env::var("PGPASSWORD").ok())
        .unwrap_or_default();
    let database = decode(parsed.path().trim_start_matches('/'));
    let database = if database.is_empty() {
        user.clone()
    } else {
        database
    };
    // The same TLS settings as the pools' (store/backend/pg_tls.rs): the mode, the
    // root certificate and the client certificate, checked the same way.
    let tls = crate::store::backend::pg_tls::PgTls::from_url(url).map_err(|e| e.to_string())?;
    tls.check_files(url).map_err(|e| e.to_string())?;
    let tls = tls.replication();
    let options = format!(
        "-c datestyle=ISO -c timezone=UTC -c wal_sender_timeout={}",
        wal.sender_timeout.as_millis()
    );
    Ok(ReplicationConfig::new(
        host,
        user,
        password,
        database,
        wal.slot.clone(),
        wal.publication.clone(),
    )
    .with_port(port)
    .with_tls(tls)
    .with_options(options)
    .with_status_interval(wal.status_interval)
    .with_wakeup_interval(wal.status_interval)
    .with_application_name(format!("outboxd-relay {}", wal.slot)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replication_connection_comes_from_database_url() {
        let wal = WalSection::default();
        let c = replication_config(
            "postgres://relay:p%40ss@db.example:6543/orders?sslmode=prefer",
            &wal,
        )
        .expect("test value");
        assert_eq!(
            (
                c.host.as_str(),
                c.port,
                c.user.as_str(),
                c.password.as_str(),
                c.database.as_str()
            ),
            ("db.example", 6543, "relay", "p@ss", "orders")
        );
        assert!(!c.tls.mode.requires_tls());
        // The replication connection does TLS as the pools do.
        let full = replication_config("postgres://u@h/d?sslmode=verify-full", &wal)
            .expect("verify-full is accepted");
        assert!(full.tls.mode.verifies_hostname());
        let opts = c.options.clone().expect("test value");
        assert!(
            opts.contains("timezone=UTC") && opts.contains("wal_sender_timeout=10000"),
            "{opts}"
        );
        let err =
            replication_config("postgres://u@h/d?sslmode=sometimes", &wal).expect_err("an error");
        assert!(
            err.contains("sslmode `sometimes`") && err.contains("database.url"),
            "{err}"
        );
    }
}
