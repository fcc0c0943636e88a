//! [`eventually`]: the one way a test waits for something to happen.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// What a probe of [`eventually`] returns: whether the awaited condition
/// holds yet (and what it gives back), or what it saw instead.
pub trait Probe<T> {
    /// `Ok` once the condition holds; else what was observed, for the
    /// message on timeout.
    fn settled(self) -> Result<T, String>;
}

impl Probe<()> for bool {
    fn settled(self) -> Result<(), String> {
        if self { Ok(()) } else { Err("false".into()) }
    }
}

impl<T> Probe<T> for Option<T> {
    fn settled(self) -> Result<T, String> {
        self.ok_or_else(|| "None".into())
    }
}

/// `Err(e)`: not yet, and `e` is what was observed.
impl<T, E: Display> Probe<T> for Result<T, E> {
    fn settled(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

/// Runs `probe` until it reports that `what` holds, and returns what it
/// gave; panics after `within` with `what` and the last observation. The
/// probe runs at once, then again after a pause that grows with the time
/// already waited (an eighth of it, from 1 ms up to 20 ms), so a quick
/// condition is seen quickly and a slow one is not polled in a busy loop.
///
/// `probe` is an async closure, so it may keep state between runs (what a
/// consumer received so far) and assert on what it sees.
///
/// ```ignore
/// eventually(Duration::from_secs(60), "every event published", async || {
///     let left = t.count("SELECT count(*) FROM outbox WHERE published_at IS NULL").await;
///     if left == 0 { Ok(()) } else { Err(format!("{left} unpublished")) }
/// })
/// .await;
/// ```
pub async fn eventually<T, P: Probe<T>>(
    within: Duration,
    what: impl Display,
    mut probe: impl AsyncFnMut() -> P,
) -> T {
    let started = Instant::now();
    loop {
        let last = match probe().await.settled() {
            Ok(v) => return v,
            Err(last) => last,
        };
        let waited = started.elapsed();
        if waited >= within {
            panic!("{what}: not within {within:?} (last observed: {last})");
        }
        let pause = (waited / 8).clamp(Duration::from_millis(1), Duration::from_millis(20));
        tokio::time::sleep(pause.min(within - waited)).await;
    }
}
