//! Guest stdout and stderr: captured into a bounded buffer during a call,
//! then written to the host log, tagged with the plugin name and
//! rate-limited so a chatty plugin cannot flood the log.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// Bytes kept per stream per call; the rest is dropped and counted.
const CAPTURE_BYTES: usize = 16 * 1024;

#[derive(Debug, Default)]
struct Captured {
    bytes: Vec<u8>,
    dropped: usize,
}

/// One guest stream. Writes never block and never fail: output past the
/// buffer is dropped, because a plugin must not stall on its logging.
#[derive(Debug, Clone, Default)]
pub struct GuestLog {
    inner: Arc<Mutex<Captured>>,
}

impl GuestLog {
    fn push(&self, buf: &[u8]) {
        let Ok(mut c) = self.inner.lock() else {
            return;
        };
        let room = CAPTURE_BYTES.saturating_sub(c.bytes.len());
        let take = room.min(buf.len());
        c.bytes.extend_from_slice(&buf[..take]);
        c.dropped += buf.len() - take;
    }

    /// Takes what the guest wrote since the last call.
    fn take(&self) -> (Vec<u8>, usize) {
        match self.inner.lock() {
            Ok(mut c) => (std::mem::take(&mut c.bytes), std::mem::take(&mut c.dropped)),
            Err(_) => (Vec::new(), 0),
        }
    }
}

impl IsTerminal for GuestLog {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestLog {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }

    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl OutputStream for GuestLog {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(CAPTURE_BYTES)
    }
}

#[async_trait::async_trait]
impl Pollable for GuestLog {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for GuestLog {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A token bucket of log lines, shared by every instance of one plugin.
#[derive(Debug)]
pub struct LineBudget {
    per_second: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
    suppressed: u64,
}

impl LineBudget {
    pub fn new(per_second: f64, burst: f64) -> Self {
        Self {
            per_second,
            burst,
            tokens: burst,
            last: Instant::now(),
            suppressed: 0,
        }
    }

    fn allow(&mut self) -> bool {
        let now = Instant::now();
        let elapsed = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.suppressed += 1;
            false
        }
    }
}

/// Writes one call's captured output to the host log.
pub fn drain(plugin: &str, stream: &'static str, log: &GuestLog, budget: &Mutex<LineBudget>) {
    let (bytes, dropped) = log.take();
    if bytes.is_empty() && dropped == 0 {
        return;
    }
    let Ok(mut budget) = budget.lock() else {
        return;
    };
    let text = String::from_utf8_lossy(&bytes);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if budget.allow() {
            if budget.suppressed > 0 {
                tracing::warn!(
                    plugin,
                    suppressed = budget.suppressed,
                    "plugin log lines suppressed by the rate limit"
                );
                budget.suppressed = 0;
            }
            tracing::info!(plugin, stream, "{line}");
        }
    }
    if dropped > 0 {
        tracing::warn!(
            plugin,
            stream,
            dropped,
            "plugin wrote more than {CAPTURE_BYTES} bytes in one call; the rest was dropped"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWrite;

    const MIB: usize = 1024 * 1024;
    const WRITE: usize = 4 * 1024;

    /// A guest writing 1 MiB in one call, half through the WASI p2 stream
    /// and half through the async writer: every write is accepted at once
    /// and in full, only `CAPTURE_BYTES` are kept, and the rest is counted.
    #[test]
    fn guest_output_is_bounded_and_never_blocks() {
        let log = GuestLog::default();
        let mut p2 = log.clone();
        let mut writer = log.clone();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let chunk = vec![b'x'; WRITE];
        for i in 0..MIB / WRITE {
            if i % 2 == 0 {
                assert!(matches!(p2.check_write(), Ok(n) if n > 0), "write {i}");
                assert!(p2.write(Bytes::from(chunk.clone())).is_ok(), "write {i}");
            } else {
                // Ready with the whole length: the guest never waits and
                // never sees a short write or an error.
                match Pin::new(&mut writer).poll_write(&mut cx, &chunk) {
                    Poll::Ready(Ok(n)) => assert_eq!(n, WRITE, "write {i}"),
                    other => panic!("write {i} did not complete at once: {other:?}"),
                }
            }
        }

        let (kept, dropped) = log.take();
        assert_eq!(kept.len(), CAPTURE_BYTES);
        assert!(kept.iter().all(|b| *b == b'x'));
        assert_eq!(dropped, MIB - CAPTURE_BYTES);
        assert_eq!(log.take(), (Vec::new(), 0), "take empties the buffer");
    }

    /// The cap is per call: once a call's output is taken, the next call
    /// may write `CAPTURE_BYTES` again. The two streams are separate.
    #[test]
    fn the_cap_applies_per_call_and_per_stream() {
        let stdout = GuestLog::default();
        let stderr = GuestLog::default();
        stdout.push(&vec![b'o'; CAPTURE_BYTES + 1]);
        stderr.push(&[b'e'; 10]);
        assert_eq!(stdout.take().1, 1);
        assert_eq!(stderr.take(), (vec![b'e'; 10], 0));

        stdout.push(&vec![b'o'; CAPTURE_BYTES]);
        let (kept, dropped) = stdout.take();
        assert_eq!((kept.len(), dropped), (CAPTURE_BYTES, 0));
    }
}
