//! The admin HTTP API and dashboard. Off by default, bound to loopback by
//! default, and every route but the probes and the (data-free) dashboard
//! page needs `Authorization: Bearer <token>`.

mod auth;
mod consumer_dead;
mod consumers;
mod history;
mod plugins;
mod routes;

use std::net::SocketAddr;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use tokio::sync::watch;

pub use history::{History, Sample, SlotSampler, run_sampler};

use crate::metrics::Metrics;
use crate::store::Db;

/// Checks the broker for `/readyz`; the embedded transport lives in the
/// database, so it needs none.
pub type BrokerCheck = Arc<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// Reads how many messages each Kafka consumer group is behind, by
/// consumer name (an error says why one could not be read); the embedded
/// transport's backlog is in the database instead.
pub type ConsumerLag = Arc<
    dyn Fn() -> BoxFuture<'static, std::collections::BTreeMap<String, Result<i64, String>>>
        + Send
        + Sync,
>;

#[derive(Clone)]
pub struct AdminState {
    pub db: Db,
    pub token: Arc<str>,
    pub metrics: Arc<Metrics>,
    pub history: Arc<History>,
    pub broker_check: Option<BrokerCheck>,
    /// The Kafka consumer groups' lag, on Kafka.
    pub consumer_lag: Option<ConsumerLag>,
    /// The config's routes and plugins: a redrive through a chosen version
    /// is checked against them.
    pub routes: Arc<Vec<outboxd_core::route::Route>>,
    pub plugins: Arc<Vec<outboxd_core::config::PluginSpec>>,
    /// The configured consumers, each with its plugin's name when its
    /// handler is a plugin (for a fix-forward redrive's check).
    pub consumers: Arc<std::collections::BTreeMap<String, Option<String>>>,
}

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("admin API cannot listen on {addr}: {source}; pick a free address in admin.listen")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("admin API stopped: {0}")]
    Serve(std::io::Error),
}

/// Binds `addr` and returns the bound address and the serving future.
pub async fn bind(
    addr: &str,
    state: AdminState,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(SocketAddr, BoxFuture<'static, Result<(), AdminError>>), AdminError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError::Bind {
            addr: addr.to_string(),
            source,
        })?;
    let local = listener.local_addr().map_err(|source| AdminError::Bind {
        addr: addr.to_string(),
        source,
    })?;
    let app = routes::router(state);
    let serve = async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                while !*shutdown.borrow() {
                    if shutdown.changed().await.is_err() {
                        break;
                    }
                }
            })
            .await
            .map_err(AdminError::Serve)
    };
    Ok((local, Box::pin(serve)))
}
