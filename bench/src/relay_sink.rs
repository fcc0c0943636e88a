//! The relay benchmark's sinks: where messages go (`--sink`), and
//! [`Verifying`], which wraps one and checks that every event arrives
//! exactly once and in per-aggregate order.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::BenchError;
use outboxd::broker::AnyPublisher;
use outboxd::broker::PublishError;
use outboxd::broker::Publisher;
use outboxd::message::OutgoingMessage;

/// Where the benchmark's messages go.
pub(super) enum Sink {
    Null,
    Broker(Box<AnyPublisher>),
}

impl Publisher for Sink {
    async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        match self {
            Sink::Null => Ok(()),
            Sink::Broker(p) => p.publish(msg).await,
        }
    }
}

/// Acknowledges through an inner sink and checks, per key, that payload
/// counters arrive as 1, 2, 3 … exactly once.
pub(super) struct Verifying<P> {
    inner: Option<P>,
    seen: Mutex<HashMap<Vec<u8>, i64>>,
    errors: Mutex<Vec<String>>,
    pub(super) count: AtomicU64,
}

impl<P: Publisher> Verifying<P> {
    pub(super) fn new(inner: Option<P>) -> Self {
        Self {
            inner,
            seen: Mutex::default(),
            errors: Mutex::default(),
            count: AtomicU64::new(0),
        }
    }
}

impl<P: Publisher> Publisher for Verifying<P> {
    async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        if let Some(inner) = &self.inner {
            inner.publish(msg.clone()).await?;
        }
        let n = counter(&msg.payload).unwrap_or(-1);
        if let Ok(mut seen) = self.seen.lock() {
            let last = seen.entry(msg.key.clone()).or_insert(0);
            if n != *last + 1
                && let Ok(mut e) = self.errors.lock()
            {
                e.push(format!(
                    "{}: got n={n} after n={last}",
                    String::from_utf8_lossy(&msg.key)
                ));
            }
            *last = n;
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The `"n":` counter of a benchmark payload, bare or inside a CloudEvents
/// envelope's `data`: a scan rather than a JSON parse, so checking costs
/// the same whatever the payload's size.
pub(super) fn counter(payload: &[u8]) -> Option<i64> {
    let key = b"\"n\":";
    let at = payload.windows(key.len()).position(|w| w == key)? + key.len();
    let digits: Vec<u8> = payload[at..]
        .iter()
        .copied()
        .skip_while(|b| *b == b' ')
        .take_while(u8::is_ascii_digit)
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

pub(super) fn check<P>(v: &Verifying<P>, events: i64) -> Result<(), BenchError> {
    let errors = v.errors.lock().map(|e| e.clone()).unwrap_or_default();
    if let Some(first) = errors.first() {
        return Err(BenchError::Incorrect(format!(
            "{} order violations, first: {first}",
            errors.len()
        )));
    }
    let got = v.count.load(Ordering::Relaxed) as i64;
    if got != events {
        return Err(BenchError::Incorrect(format!(
            "published {got} messages for {events} events"
        )));
    }
    Ok(())
}
