//! What a WAL reader knows between two stream messages, without any I/O:
//! the committed events waiting to be published, the transactions whose
//! position it may not confirm yet, and the aggregates it handed to
//! polling. [`super::WalRelay`] feeds it the stream and runs the queries
//! and batches it asks for.
//!
//! The rules, each with the reason:
//! - A batch holds at most one event per aggregate, and an aggregate's later
//!   event waits in the queue while an earlier one is queued or in flight:
//!   events of one batch are published concurrently.
//! - The slot's position moves past a transaction only when each of its
//!   events is settled: marked (published, filtered or failed), found
//!   already done, or left in the table for polling. Then a crash replays
//!   nothing that is not durable in the table.
//! - A handed aggregate's events are left to polling, which publishes the
//!   aggregate's rows oldest first and honours backoff and the dead state.
//!   Its streamed events are kept (the newest [`SKIP_KEEP`]) so that when
//!   the aggregate is taken back, any the table does not show as done are
//!   published: one may have committed while polling's last read could not
//!   see it yet.
//! - When a reader starts, rows that are unpublished but will not stream
//!   again (they committed before the slot's position) must go to polling;
//!   and a replayed event may already be done. [`Seed`] holds the
//!   unpublished rows per aggregate; an event older than the oldest of them
//!   is checked against the table before it is published.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::event::OutboxEvent;

/// Streamed events kept per handed aggregate.
pub const SKIP_KEEP: usize = 1000;

/// One event waiting to be published.
#[derive(Debug, Clone)]
pub struct Pending {
    pub ev: OutboxEvent,
    /// The transaction it settles; `None` for an event taken back from
    /// polling, whose transaction was settled when it was handed over.
    txn: Option<u64>,
    /// Check the table before publishing: the event may already be done.
    pub verify: bool,
}

#[derive(Debug)]
struct Txn {
    id: u64,
    end_lsn: u64,
    outstanding: usize,
}

/// The unpublished rows a reader found when it started.
#[derive(Debug, Default)]
pub struct Seed {
    /// Per aggregate, the seqs of its unpublished rows without a failed
    /// attempt, oldest first.
    pub fresh: HashMap<String, Vec<i64>>,
    /// Aggregates with a failed or dead unpublished row: polling's already.
    pub stuck: HashSet<String>,
    /// The server's WAL position read after the rows: every row seen
    /// committed before it.
    pub fence: u64,
    /// The slot's confirmed position when the reader took it: the stream
    /// starts there, so the lag counts from it (not from the start of
    /// the server's WAL) until the reader confirms further.
    pub start: u64,
}

#[derive(Debug, Default)]
pub struct StreamState {
    queue: VecDeque<Pending>,
    txns: VecDeque<Txn>,
    open: Option<Vec<OutboxEvent>>,
    next_txn: u64,
    handed: HashMap<String, VecDeque<OutboxEvent>>,
    releasing: HashMap<String, u64>,
    seed: HashMap<String, VecDeque<i64>>,
    /// Until the stream passes it, `seed` is live.
    seed_fence: Option<u64>,
    /// Events committed before this may already be done.
    verify_below: u64,
    confirmed: u64,
    /// The newest position the stream has delivered all of.
    received: u64,
    /// The server's WAL end, as the stream last reported it.
    server_end: u64,
}

impl StreamState {
    /// The state of a reader that just took the slot, with the unpublished
    /// rows it read.
    pub fn new(seed: Seed) -> Self {
        let mut s = StreamState {
            verify_below: seed.fence,
            seed_fence: Some(seed.fence),
            confirmed: seed.start,
            ..StreamState::default()
        };
        for aggregate in seed.stuck {
            s.handed.entry(aggregate).or_default();
        }
        for (aggregate, seqs) in seed.fresh {
            if !s.handed.contains_key(&aggregate) {
                s.seed.insert(aggregate, seqs.into());
            }
        }
        s
    }

    /// A reader that found too many unpublished rows to hold: each of
    /// their aggregates goes to polling at once.
    pub fn with_all_handed(aggregates: HashSet<String>, fence: u64, start: u64) -> Self {
        StreamState::new(Seed {
            stuck: aggregates,
            fence,
            start,
            ..Seed::default()
        })
    }

    pub fn begin(&mut self) {
        self.open = Some(Vec::new());
    }

    /// An outbox insert of the open transaction.
    pub fn insert(&mut self, ev: OutboxEvent) {
        self.open.get_or_insert_with(Vec::new).push(ev);
    }

    /// The open transaction committed, ending at `end_lsn`.
    pub fn commit(&mut self, end_lsn: u64) {
        let events = self.open.take().unwrap_or_default();
        let id = self.next_txn;
        self.next_txn += 1;
        self.txns.push_back(Txn {
            id,
            end_lsn,
            outstanding: events.len(),
        });
        for ev in events {
            self.arrive(ev, id, end_lsn);
        }
        self.received = self.received.max(end_lsn);
        self.server_end = self.server_end.max(end_lsn);
        self.releasing.retain(|_, fence| *fence > end_lsn);
        self.pass(end_lsn);
    }

    /// A keepalive or data frame: the server's WAL end.
    pub fn server_at(&mut self, wal_end: u64) {
        self.server_end = self.server_end.max(wal_end);
    }

    /// A keepalive: outside a transaction, everything before `wal_end` has
    /// been delivered.
    pub fn keepalive(&mut self, wal_end: u64) {
        self.server_at(wal_end);
        if self.open.is_none() {
            self.received = self.received.max(wal_end);
            self.pass(wal_end);
        }
    }

    /// Past the seed's fence, its aggregates that never streamed have rows
    /// the slot will not replay: polling's.
    fn pass(&mut self, lsn: u64) {
        if self.seed_fence.is_some_and(|f| lsn >= f) {
            self.seed_fence = None;
            for (aggregate, _) in std::mem::take(&mut self.seed) {
                self.handed.entry(aggregate).or_default();
            }
        }
    }

    fn arrive(&mut self, ev: OutboxEvent, txn: u64, lsn: u64) {
        let aggregate = ev.aggregate_id.clone();
        if self.handed.contains_key(&aggregate) {
            self.skip(ev);
            self.settle_txn(Some(txn));
            return;
        }
        if let Some(seqs) = self.seed.get_mut(&aggregate) {
            match seqs.front().copied() {
                Some(oldest) if oldest < ev.seq => {
                    // An older unpublished row of the aggregate did not
                    // stream before this one: it never will.
                    self.seed.remove(&aggregate);
                    self.handed.entry(aggregate).or_default();
                    self.skip(ev);
                    self.settle_txn(Some(txn));
                    return;
                }
                Some(oldest) if oldest == ev.seq => {
                    seqs.pop_front();
                    if seqs.is_empty() {
                        self.seed.remove(&aggregate);
                    }
                    self.queue.push_back(Pending {
                        ev,
                        txn: Some(txn),
                        verify: false,
                    });
                    return;
                }
                _ => {}
            }
        }
        let verify =
            lsn < self.verify_below || self.releasing.get(&aggregate).is_some_and(|f| lsn < *f);
        self.queue.push_back(Pending {
            ev,
            txn: Some(txn),
            verify,
        });
    }

    fn skip(&mut self, ev: OutboxEvent) {
        let kept = self.handed.entry(ev.aggregate_id.clone()).or_default();
        kept.push_back(ev);
        if kept.len() > SKIP_KEEP {
            kept.pop_front();
        }
    }

    fn settle_txn(&mut self, txn: Option<u64>) {
        let Some(id) = txn else { return };
        let Some(first) = self.txns.front().map(|t| t.id) else {
            return;
        };
        if let Some(t) = id
            .checked_sub(first)
            .and_then(|i| self.txns.get_mut(i as usize))
        {
            t.outstanding = t.outstanding.saturating_sub(1);
        }
    }

    /// Up to `limit` queued events, at most one per aggregate; a handed
    /// aggregate's events go to polling instead.
    pub fn next_batch(&mut self, limit: usize) -> Vec<Pending> {
        self.next_batch_excluding(limit, &HashSet::new())
    }

    /// [`StreamState::next_batch`] with `busy` aggregates (in a batch still
    /// in flight) left queued, as if already in this batch.
    pub fn next_batch_excluding(&mut self, limit: usize, busy: &HashSet<String>) -> Vec<Pending> {
        let mut batch = Vec::new();
        let mut seen: HashSet<String> = busy.clone();
        let mut keep = VecDeque::with_capacity(self.queue.len());
        while let Some(p) = self.queue.pop_front() {
            if batch.len() >= limit {
                keep.push_back(p);
                keep.extend(self.queue.drain(..));
                break;
            }
            if self.handed.contains_key(&p.ev.aggregate_id) {
                let txn = p.txn;
                self.skip(p.ev);
                self.settle_txn(txn);
                continue;
            }
            if seen.contains(&p.ev.aggregate_id) {
                keep.push_back(p);
                continue;
            }
            seen.insert(p.ev.aggregate_id.clone());
            batch.push(p);
        }
        self.queue = keep;
        batch
    }

    /// These events are settled: marked, or found done.
    pub fn settle(&mut self, done: &[Pending]) {
        for p in done {
            self.settle_txn(p.txn);
        }
    }

    /// Hands `aggregate` to polling: its queued events stay queued until
    /// the next batch skips them.
    pub fn hand(&mut self, aggregate: &str) {
        self.handed.entry(aggregate.to_string()).or_default();
    }

    pub fn handed(&self) -> Vec<String> {
        self.handed.keys().cloned().collect()
    }

    pub fn handed_count(&self) -> usize {
        self.handed.len()
    }

    /// Takes `aggregate` back from polling, which has published all of it
    /// that it could see at `fence`: its kept events are queued first, to
    /// be checked against the table, and so are its streamed events
    /// committed before `fence`.
    pub fn release(&mut self, aggregate: &str, fence: u64) {
        if let Some(kept) = self.handed.remove(aggregate) {
            for ev in kept.into_iter().rev() {
                self.queue.push_front(Pending {
                    ev,
                    txn: None,
                    verify: true,
                });
            }
        }
        if fence > self.received {
            self.releasing.insert(aggregate.to_string(), fence);
        }
    }

    /// The position the slot may confirm: the end of the last transaction
    /// of the settled prefix, or, with nothing pending, everything the
    /// stream delivered.
    pub fn confirmable(&mut self) -> u64 {
        while self.txns.front().is_some_and(|t| t.outstanding == 0) {
            let t = self.txns.pop_front().expect("front");
            self.confirmed = self.confirmed.max(t.end_lsn);
        }
        if self.txns.is_empty() && self.open.is_none() {
            self.confirmed = self.confirmed.max(self.received);
        }
        self.confirmed
    }

    /// Server WAL end minus the confirmed position.
    pub fn lag(&self) -> u64 {
        self.server_end.saturating_sub(self.confirmed)
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Nothing is queued and no transaction waits: the stream is idle.
    pub fn idle(&self) -> bool {
        self.queue.is_empty() && self.txns.iter().all(|t| t.outstanding == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventId;

    fn ev(seq: i64, aggregate: &str) -> OutboxEvent {
        OutboxEvent {
            seq,
            id: EventId(uuid::Uuid::new_v4()),
            aggregate_id: aggregate.into(),
            event_type: "t".into(),
            payload: "{}".into(),
            headers: Default::default(),
            created_at: chrono::Utc::now(),
            attempts: 0,
            redrive_with: None,
        }
    }

    fn txn(s: &mut StreamState, end: u64, events: &[(i64, &str)]) {
        s.begin();
        for (seq, a) in events {
            s.insert(ev(*seq, a));
        }
        s.commit(end);
    }

    fn seqs(batch: &[Pending]) -> Vec<i64> {
        batch.iter().map(|p| p.ev.seq).collect()
    }

    #[test]
    fn a_batch_holds_one_event_per_aggregate_and_keeps_each_aggregates_order() {
        let mut s = StreamState::new(Seed::default());
        txn(&mut s, 10, &[(1, "a"), (2, "a"), (3, "b")]);
        txn(&mut s, 20, &[(4, "a"), (5, "c")]);
        assert_eq!(seqs(&s.next_batch(100)), vec![1, 3, 5]);
        assert_eq!(seqs(&s.next_batch(100)), vec![2]);
        assert_eq!(seqs(&s.next_batch(100)), vec![4]);
        assert!(s.next_batch(100).is_empty());
    }

    #[test]
    fn a_pipelined_batch_leaves_the_aggregates_in_flight_queued() {
        let mut s = StreamState::new(Seed::default());
        txn(&mut s, 10, &[(1, "a"), (2, "b"), (3, "a"), (4, "c")]);
        let first = s.next_batch(100);
        assert_eq!(seqs(&first), vec![1, 2, 4]);
        txn(&mut s, 20, &[(5, "b"), (6, "d")]);
        let busy: HashSet<String> = ["a".to_string(), "b".to_string()].into();
        assert_eq!(seqs(&s.next_batch_excluding(100, &busy)), vec![6]);
        s.settle(&first);
        assert_eq!(seqs(&s.next_batch(100)), vec![3, 5]);
    }

    #[test]
    fn the_position_moves_only_past_transactions_whose_events_all_settled() {
        let mut s = StreamState::new(Seed::default());
        txn(&mut s, 10, &[(1, "a"), (2, "a")]);
        txn(&mut s, 20, &[(3, "b")]);
        let first = s.next_batch(100);
        assert_eq!(seqs(&first), vec![1, 3]);
        s.settle(&first);
        // Transaction 10 still has event 2 outstanding; 20 is settled but
        // comes after it.
        assert_eq!(s.confirmable(), 0);
        let second = s.next_batch(100);
        s.settle(&second);
        assert_eq!(s.confirmable(), 20);
        // Idle: a keepalive's position is confirmable.
        s.keepalive(35);
        assert_eq!(s.confirmable(), 35);
    }

    #[test]
    fn a_handed_aggregate_waits_for_polling_and_comes_back_checked() {
        let mut s = StreamState::new(Seed::default());
        txn(&mut s, 10, &[(1, "a"), (2, "b")]);
        let b = s.next_batch(100);
        s.settle(&b);
        // Event 1 failed: "a" goes to polling.
        s.hand("a");
        txn(&mut s, 20, &[(3, "a"), (4, "b")]);
        let b = s.next_batch(100);
        assert_eq!(seqs(&b), vec![4], "a's event 3 is left to polling");
        s.settle(&b);
        assert_eq!(s.confirmable(), 20, "a handed event is settled");
        // Polling drained "a" as of position 25; event 3 is checked.
        s.release("a", 25);
        let b = s.next_batch(100);
        assert_eq!(seqs(&b), vec![3]);
        assert!(b[0].verify);
        // An event of "a" committed before 25 is checked too; after, not.
        txn(&mut s, 24, &[(5, "a")]);
        txn(&mut s, 30, &[(6, "a")]);
        let b = s.next_batch(100);
        assert_eq!((seqs(&b), b[0].verify), (vec![5], true));
        let b = s.next_batch(100);
        assert_eq!((seqs(&b), b[0].verify), (vec![6], false));
    }

    #[test]
    fn a_handed_aggregates_queued_events_are_skipped_at_the_next_batch() {
        let mut s = StreamState::new(Seed::default());
        txn(&mut s, 10, &[(1, "a"), (2, "a")]);
        let b = s.next_batch(100);
        assert_eq!(seqs(&b), vec![1]);
        s.settle(&b);
        s.hand("a");
        assert!(s.next_batch(100).is_empty());
        assert_eq!(s.confirmable(), 10);
        assert_eq!(s.handed(), vec!["a".to_string()]);
    }

    #[test]
    fn at_start_rows_the_slot_will_not_replay_go_to_polling() {
        // "a" has unpublished rows 1 and 5; only 5 streams (1 committed
        // before the slot's position). "b" has 2, which streams. "c" has a
        // failed row: polling's from the start. "d" has 9, which never
        // streams before the fence.
        let seed = Seed {
            fresh: [
                ("a".to_string(), vec![1, 5]),
                ("b".to_string(), vec![2]),
                ("d".to_string(), vec![9]),
            ]
            .into(),
            stuck: ["c".to_string()].into(),
            fence: 100,
            start: 0,
        };
        let mut s = StreamState::new(seed);
        txn(&mut s, 50, &[(2, "b"), (5, "a"), (7, "c"), (0, "e")]);
        let b = s.next_batch(100);
        // b's row 2 is known unpublished (no check); e's row 0 is older
        // than the fence and not known: checked.
        assert_eq!(seqs(&b), vec![2, 0]);
        assert_eq!(
            b.iter().map(|p| p.verify).collect::<Vec<_>>(),
            vec![false, true]
        );
        let mut handed = s.handed();
        handed.sort();
        assert_eq!(handed, vec!["a", "c"]);
        // Past the fence, "d" goes to polling too.
        s.keepalive(120);
        let mut handed = s.handed();
        handed.sort();
        assert_eq!(handed, vec!["a", "c", "d"]);
        // After the fence nothing is checked.
        txn(&mut s, 130, &[(11, "f")]);
        let b = s.next_batch(100);
        assert_eq!((seqs(&b), b[0].verify), (vec![11], false));
    }

    #[test]
    fn a_handed_aggregate_keeps_only_its_newest_streamed_events() {
        let mut s = StreamState::new(Seed::default());
        s.hand("a");
        for i in 0..(SKIP_KEEP as i64 + 10) {
            txn(&mut s, 10 + i as u64, &[(i, "a")]);
        }
        s.release("a", 0);
        let b = s.next_batch(1);
        assert_eq!(seqs(&b), vec![10]);
        assert_eq!(s.queued(), SKIP_KEEP - 1);
    }

    /// The lag counts from where the slot was confirmed when the reader took
    /// it, not from the start of the server's WAL: on a cluster that has
    /// written more than `max_lag_bytes` in its life, a fresh reader is not
    /// "behind" before it has read anything.
    #[test]
    fn the_lag_counts_from_the_slots_confirmed_position() {
        let mut s = StreamState::new(Seed {
            fence: 5_000_000_000,
            start: 4_999_999_000,
            ..Seed::default()
        });
        s.server_at(5_000_000_000);
        assert_eq!(s.lag(), 1_000);
        assert_eq!(s.confirmable(), 4_999_999_000, "never behind the slot");
    }
}
