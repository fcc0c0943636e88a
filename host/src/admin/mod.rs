//! outboxd's HTTP listeners. The admin API and dashboard: off by default,
//! bound to loopback by default, and every route but the probes, `/metrics`
//! and the (data-free) dashboard page needs `Authorization: Bearer
//! <admin.token>`; `/metrics` takes that token or the read-only
//! `admin.metrics_token`. The metrics listener (`[metrics] listen`) serves
//! the probes and `/metrics` alone, without a token.

mod auth;
mod consumer_dead;
mod consumers;
mod error;
mod history;
mod plugins;
mod probes;
mod routes;

use std::net::SocketAddr;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use tokio::sync::watch;

pub use history::{History, Sample, SlotSampler, run_sampler};
pub use probes::{CheckOutcome, Probes, ReadinessReport};

use crate::metrics::Metrics;
use crate::store::Db;

/// Checks the broker for `/readyz`; the embedded transport lives in the
/// database, so it needs none. The error says why (it is logged and shown
/// in `/api/stats`, never by the probe).
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
    /// `admin.metrics_token`: reaches `/metrics` and no other route.
    pub metrics_token: Option<Arc<str>>,
    pub metrics: Arc<Metrics>,
    pub history: Arc<History>,
    /// The probes and `/metrics`, shared with the metrics listener.
    pub probes: Probes,
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
    #[error("the {what} cannot listen on {addr}: {source}; pick a free address in {key}")]
    Bind {
        what: &'static str,
        key: &'static str,
        addr: String,
        source: std::io::Error,
    },
    #[error("the {what} stopped: {source}")]
    Serve {
        what: &'static str,
        source: std::io::Error,
    },
}

/// A bound listener's address and the future that serves it.
pub type Bound = (SocketAddr, BoxFuture<'static, Result<(), AdminError>>);

/// Binds the admin API on `addr` (`admin.listen`).
pub async fn bind(
    addr: &str,
    state: AdminState,
    shutdown: watch::Receiver<bool>,
) -> Result<Bound, AdminError> {
    let app = routes::router(state);
    serve("admin API", "admin.listen", addr, app, shutdown).await
}

/// Binds the metrics listener on `addr` (`metrics.listen`): the probes and
/// `/metrics`, without a token.
pub async fn bind_metrics(
    addr: &str,
    probes: Probes,
    shutdown: watch::Receiver<bool>,
) -> Result<Bound, AdminError> {
    let app = probes::router(probes);
    serve("metrics listener", "metrics.listen", addr, app, shutdown).await
}

async fn serve(
    what: &'static str,
    key: &'static str,
    addr: &str,
    app: axum::Router,
    mut shutdown: watch::Receiver<bool>,
) -> Result<Bound, AdminError> {
    let bind_error = |source| AdminError::Bind {
        what,
        key,
        addr: addr.to_string(),
        source,
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
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
            .map_err(|source| AdminError::Serve { what, source })
    };
    Ok((local, Box::pin(serve)))
}
