//! A TCP proxy between the soak's processes and a service (Postgres or the
//! broker) that delays or stalls bytes, per client address: the latency,
//! jitter and hung connections that drop rules cannot make (this kernel has
//! no `netem`).
//!
//! - `Delay`: every chunk is forwarded `base + jitter` after it arrived,
//!   never before an earlier chunk of the same direction.
//! - `Stall`: open connections stop forwarding until the episode ends, and a
//!   new connection is accepted and then never forwarded at all, for as long
//!   as the client keeps it: a service that hangs instead of closing.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::rng::Rng;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Delay { base: Duration, jitter: Duration },
    Stall,
}

type Modes = Arc<Mutex<HashMap<IpAddr, Mode>>>;

/// One listening proxy in front of one upstream service.
#[derive(Clone)]
pub struct Proxy {
    modes: Modes,
}

impl Proxy {
    /// Listens on `listen` and forwards every connection to `upstream`.
    pub async fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        seed: u64,
    ) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| anyhow::anyhow!("proxy: bind {listen}: {e}"))?;
        let modes: Modes = Arc::default();
        let proxy = Self {
            modes: modes.clone(),
        };
        tokio::spawn(async move {
            let mut n = 0u64;
            loop {
                let Ok((client, peer)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                n += 1;
                let seed = seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                tokio::spawn(connection(client, peer.ip(), upstream, modes.clone(), seed));
            }
        });
        Ok(proxy)
    }

    pub fn set(&self, client: IpAddr, mode: Mode) {
        set_mode(&self.modes, client, mode);
    }
}

fn set_mode(modes: &Modes, client: IpAddr, mode: Mode) {
    let mut map = modes.lock().unwrap_or_else(|p| p.into_inner());
    if mode == Mode::Pass {
        map.remove(&client);
    } else {
        map.insert(client, mode);
    }
}

fn mode_of(modes: &Modes, client: IpAddr) -> Mode {
    let map = modes.lock().unwrap_or_else(|p| p.into_inner());
    map.get(&client).copied().unwrap_or(Mode::Pass)
}

async fn connection(client: TcpStream, ip: IpAddr, upstream: SocketAddr, modes: Modes, seed: u64) {
    if mode_of(&modes, ip) == Mode::Stall {
        // Accepted, never forwarded: read and discard until the client
        // gives up on it.
        let mut client = client;
        let mut sink = [0u8; 4096];
        while let Ok(n) = client.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
        return;
    }
    let server =
        match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(upstream)).await {
            Ok(Ok(s)) => s,
            // The service is down (a killed broker): the client sees its
            // connection close, as it would without the proxy.
            _ => return,
        };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    // Either side closing ends the connection.
    tokio::select! {
        () = pump(cr, sw, ip, modes.clone(), Rng::new(seed)) => {}
        () = pump(sr, cw, ip, modes, Rng::new(seed.rotate_left(17))) => {}
    }
}

/// One direction: a reader stamps each chunk with when it may go out, a
/// writer sends it then (or after a stall ends).
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    ip: IpAddr,
    modes: Modes,
    mut rng: Rng,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(256);
    let read_modes = modes.clone();
    let reader = async move {
        let mut last_due = Instant::now();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let now = Instant::now();
            let due = match mode_of(&read_modes, ip) {
                Mode::Delay { base, jitter } => {
                    let extra = Duration::from_millis(rng.below(jitter.as_millis() as u64 + 1));
                    (now + base + extra).max(last_due)
                }
                Mode::Pass | Mode::Stall => now.max(last_due),
            };
            last_due = due;
            if tx.send((due, buf[..n].to_vec())).await.is_err() {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            while mode_of(&modes, ip) == Mode::Stall {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}
