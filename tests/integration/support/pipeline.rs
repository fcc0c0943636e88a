//! `outboxd run`'s pipeline in the test process, as the admin-API and
//! daemon tests start and stop it.

use std::net::SocketAddr;

use outboxd::config::Config;
use outboxd::daemon::{Daemon, PipelineHandles};
use outboxd::fault::Faults;
use outboxd::store::Db;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// A running pipeline: its tasks, what it hands out, and its stop signal.
pub struct Pipeline {
    pub stop_tx: watch::Sender<bool>,
    pub set: JoinSet<Result<(), String>>,
    pub handles: PipelineHandles,
}

impl Pipeline {
    /// Starts `config`'s pipeline on `db`, with `daemon`'s handlers and no
    /// fault armed.
    pub async fn start(daemon: Daemon, config: &Config, db: &Db) -> Self {
        let (stop_tx, stop_rx) = watch::channel(false);
        let (set, handles) = daemon
            .spawn_pipeline(config, db, Faults::none(), stop_rx)
            .await
            .expect("pipeline");
        Self {
            stop_tx,
            set,
            handles,
        }
    }

    /// The admin API's address.
    pub fn addr(&self) -> SocketAddr {
        self.handles.admin_addr.expect("admin enabled")
    }

    /// SIGTERM's path: every task stops, without an error.
    pub async fn stop(self) {
        self.stop_tx.send(true).expect("stop");
        outboxd::daemon::join_all_workers(self.set)
            .await
            .expect("clean stop");
    }
}
