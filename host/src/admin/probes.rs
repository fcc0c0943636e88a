//! The probes and the scrape: `/healthz` (the process answers), `/readyz`
//! (the database and the broker answer) and `/metrics`, on the admin
//! listener and on the metrics listener (`[metrics] listen`). A probe
//! answers a status word and nothing else, since whoever can reach the port
//! may call it: why a check failed goes to the log, when it changes, and to
//! `/api/stats` behind the admin token.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{FromRef, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;

use super::{AdminState, BrokerCheck};
use crate::metrics::Metrics;
use crate::store::{AnyStore, Db, OutboxStore};

/// How long a readiness check waits for the database or the broker.
const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// What the probes and `/metrics` read: the database, the counters and the
/// readiness checks. Both listeners share one.
#[derive(Clone)]
pub struct Probes {
    db: Db,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
}

impl Probes {
    /// `broker`: how to check the broker; `None` on the embedded transport,
    /// which lives in the database.
    pub fn new(db: Db, metrics: Arc<Metrics>, broker: Option<BrokerCheck>) -> Self {
        Self {
            readiness: Arc::new(Readiness {
                db: db.clone(),
                broker,
                last: Mutex::new(None),
            }),
            db,
            metrics,
        }
    }

    /// Runs the readiness checks now (and logs a change).
    pub async fn readiness(&self) -> ReadinessReport {
        self.readiness.check().await
    }
}

impl FromRef<AdminState> for Probes {
    fn from_ref(state: &AdminState) -> Self {
        state.probes.clone()
    }
}

/// The metrics listener's routes: the probes and `/metrics`, no token.
pub(super) fn router(probes: Probes) -> Router {
    probe_routes()
        .route("/metrics", get(metrics))
        .with_state(probes)
}

/// `/healthz` and `/readyz`, which never need a token.
pub(super) fn probe_routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Probes: FromRef<S>,
{
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
}

async fn readyz(State(p): State<Probes>) -> Response {
    if p.readiness().await.ready {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

/// The scrape: the outbox gauges read from the database now (left out when
/// it does not answer), then everything the process counts, encoded by
/// prometheus-client in the Prometheus text format.
pub(super) async fn metrics(State(p): State<Probes>) -> Response {
    let stats = AnyStore::new(&p.db, Duration::from_secs(30))
        .stats(chrono::Utc::now())
        .await
        .ok();
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        p.metrics.render(stats.as_ref()),
    )
        .into_response()
}

/// Whether the database (and the broker, on Kafka) answer, with the
/// reasons of the last failures kept to log only a change.
struct Readiness {
    db: Db,
    broker: Option<BrokerCheck>,
    /// The failing checks and their reasons at the last check; `None`
    /// before the first.
    last: Mutex<Option<BTreeMap<&'static str, String>>>,
}

/// `readiness` in `/api/stats`: each check, and why it failed.
#[derive(Debug, Clone, Serialize)]
pub struct ReadinessReport {
    pub ready: bool,
    /// `database`, and `broker` on Kafka.
    pub checks: BTreeMap<&'static str, CheckOutcome>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckOutcome {
    pub ok: bool,
    /// Why the check failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Readiness {
    async fn check(&self) -> ReadinessReport {
        let database = async {
            match tokio::time::timeout(CHECK_TIMEOUT, self.db.ping()).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {CHECK_TIMEOUT:?}")),
            }
        };
        let broker = async {
            let check = self.broker.as_ref()?;
            Some(match tokio::time::timeout(CHECK_TIMEOUT, check()).await {
                Ok(r) => r,
                Err(_) => Err(format!("no answer within {CHECK_TIMEOUT:?}")),
            })
        };
        let (database, broker) = tokio::join!(database, broker);
        let mut checks = BTreeMap::from([("database", database)]);
        if let Some(broker) = broker {
            checks.insert("broker", broker);
        }
        let failing: BTreeMap<&'static str, String> = checks
            .iter()
            .filter_map(|(name, r)| Some((*name, r.as_ref().err()?.clone())))
            .collect();
        self.log_change(&failing);
        ReadinessReport {
            ready: failing.is_empty(),
            checks: checks
                .into_iter()
                .map(|(name, r)| {
                    let outcome = CheckOutcome {
                        ok: r.is_ok(),
                        reason: r.err(),
                    };
                    (name, outcome)
                })
                .collect(),
        }
    }

    /// Logs the failing checks when they (or their reasons) differ from the
    /// last check's, so a probe every second does not repeat one warning.
    fn log_change(&self, failing: &BTreeMap<&'static str, String>) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_ref() == Some(failing) {
            return;
        }
        let before = last.replace(failing.clone());
        drop(last);
        if failing.is_empty() {
            if before.is_some() {
                tracing::info!("ready: the database and the broker answer again");
            }
            return;
        }
        for (check, reason) in failing {
            tracing::warn!(check, reason = %reason, "not ready: the {check} does not answer; /readyz answers 503 until it does");
        }
    }
}
