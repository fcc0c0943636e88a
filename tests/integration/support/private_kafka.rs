//! Brokers a test owns: a private tansu on a free port (with SASL when
//! asked, and users for SCRAM), and a TLS-terminating proxy in front of it,
//! with a CA and a server certificate made for the test by the `openssl`
//! CLI. tansu 0.6.0 serves no TLS of its own (its `--cert`/`--key` are read
//! and not used), so TLS is proven through the proxy, which tansu
//! advertises as its address. Nothing here touches the shared broker of
//! `tests/tansu.sh`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use super::eventually::eventually;
use super::tls::TestCa;

/// The tansu binary `tests/tansu.sh` installs (or `OUTBOXD_TEST_TANSU`).
pub fn tansu_binary() -> String {
    if let Ok(b) = std::env::var("OUTBOXD_TEST_TANSU") {
        return b;
    }
    let home = std::env::var("HOME").unwrap_or_default();
    // Where tests/tansu.sh installs it (TANSU_ROOT).
    let installed = format!("{home}/.cache/outboxd/tansu-0.6.0/bin/tansu");
    if Path::new(&installed).exists() {
        return installed;
    }
    panic!(
        "no tansu binary: run `tests/tansu.sh install` once (it installs tansu 0.6.0) or set OUTBOXD_TEST_TANSU"
    );
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// How a private tansu starts.
#[derive(Debug, Clone)]
pub struct TansuOptions {
    pub port: u16,
    /// The address clients are told to use (a proxy's); the broker's own
    /// when `None`.
    pub advertise: Option<String>,
    /// `--authentication`: every client must log in with SASL.
    pub authentication: bool,
    /// `memory://tansu/` when `None`, else a `sqlite://` file in this
    /// directory (kept across a restart).
    pub sqlite_dir: Option<PathBuf>,
}

impl TansuOptions {
    pub fn on(port: u16) -> Self {
        Self {
            port,
            advertise: None,
            authentication: false,
            sqlite_dir: None,
        }
    }
}

/// A private tansu, killed on drop.
pub struct Tansu {
    child: std::process::Child,
    pub port: u16,
}

impl Tansu {
    pub async fn start(opts: TansuOptions) -> Self {
        let port = opts.port;
        let listen = format!("tcp://127.0.0.1:{port}");
        let advertise = format!(
            "tcp://{}",
            opts.advertise
                .clone()
                .unwrap_or_else(|| format!("127.0.0.1:{port}"))
        );
        let mut cmd = std::process::Command::new(tansu_binary());
        // tansu reads a sqlite:// path relative to its working directory.
        let storage = match &opts.sqlite_dir {
            Some(dir) => {
                cmd.current_dir(dir);
                "sqlite://tansu.db".to_string()
            }
            None => "memory://tansu/".to_string(),
        };
        cmd.args([
            "broker",
            "--listener-url",
            &listen,
            "--advertised-listener-url",
            &advertise,
            "--storage-engine",
            &storage,
            "--silent",
        ]);
        if opts.authentication {
            cmd.arg("--authentication");
        }
        let log = std::env::temp_dir().join(format!("outboxd-tansu-{port}.log"));
        let child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .map(std::process::Stdio::from)
                    .unwrap_or_else(|_| std::process::Stdio::null()),
            )
            .spawn()
            .expect("start tansu");
        let mut this = Self { child, port };
        let what = format!("tansu did not listen on {port}; see {}", log.display());
        eventually(Duration::from_secs(20), what, async || {
            let Err(refused) = TcpStream::connect(("127.0.0.1", port)).await else {
                return Ok(());
            };
            if let Ok(Some(status)) = this.child.try_wait() {
                panic!("tansu exited ({status}); see {}", log.display());
            }
            Err(refused)
        })
        .await;
        this
    }

    /// `tansu user create` of a SCRAM user (`scram256` or `scram512`).
    pub fn create_user(&self, mechanism: &str, name: &str, password: &str) {
        let out = std::process::Command::new(tansu_binary())
            .args([
                "user",
                "create",
                "--broker",
                &format!("tcp://127.0.0.1:{}", self.port),
                "--mechanism",
                mechanism,
                name,
                password,
            ])
            .output()
            .expect("run tansu user create");
        assert!(
            out.status.success(),
            "tansu user create {name} ({mechanism}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Accepts TLS on a loopback port and forwards the plain bytes to
/// `upstream`; counts the handshakes that completed.
pub struct TlsProxy {
    pub port: u16,
    pub handshakes: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsProxy {
    /// Binds now (so the port can be advertised before the upstream
    /// starts) and forwards to `127.0.0.1:upstream`.
    pub async fn start(ca: &TestCa, upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let acceptor = ca.acceptor();
        let handshakes = Arc::new(AtomicUsize::new(0));
        let counted = handshakes.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let counted = counted.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(client).await else {
                        return;
                    };
                    counted.fetch_add(1, Ordering::SeqCst);
                    let Ok(mut plain) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        Self {
            port,
            handshakes,
            task,
        }
    }

    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
