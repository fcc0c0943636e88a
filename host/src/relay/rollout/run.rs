//! The rollout's loop: a refresh on every Postgres notification and every
//! poll, and with each refresh this host's shadow counters saved and a
//! clean candidate promoted.

use std::time::Duration;

use tokio::sync::watch;

use super::Rollout;
use crate::plugin::registry::{NOTIFY_CHANNEL, RegistryError};
use crate::store::Db;

impl Rollout {
    /// Stores this host's shadow counters and promotes a candidate whose
    /// `auto_promote_after` clean events have run.
    pub async fn save_stats_and_promote(&self) -> Result<(), RegistryError> {
        let stats: Vec<_> = match self.stats.lock() {
            Ok(s) => s.iter().map(|(k, v)| (k.clone(), v.totals())).collect(),
            Err(_) => Vec::new(),
        };
        let applied = self.applied.lock().ok().and_then(|a| a.clone());
        for ((name, version), totals) in stats {
            if totals == Default::default() {
                continue;
            }
            self.registry
                .save_shadow_stats(&self.host, &name, version, &totals)
                .await?;
            let threshold = applied
                .as_ref()
                .and_then(|d| d.shadow(&name))
                .filter(|(v, _)| *v == version)
                .and_then(|(_, n)| n);
            if let Some(n) = threshold {
                let all = self.registry.get(&name, version).await?.shadow_stats;
                if all.matches >= n && all.mismatches == 0 && all.errors == 0 {
                    tracing::info!(plugin = %name, version, matches = all.matches, "shadow clean: promoting");
                    self.registry
                        .activate(&name, version, "auto-promote")
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// Refreshes on every notification (Postgres) and every `poll`, until
    /// `shutdown` turns true. Errors are logged; the host keeps running the
    /// versions it has.
    pub async fn run(&self, poll: Duration, mut shutdown: watch::Receiver<bool>) {
        let mut notified = match self.registry.db() {
            Db::Postgres(pool) => listen(pool).await,
            Db::Sqlite(_) => None,
        };
        loop {
            if let Err(e) = self.refresh().await {
                tracing::warn!(error = %e, "plugin registry refresh failed; keeping the running versions");
            }
            let wait_notify = async {
                match notified.as_mut() {
                    Some(rx) => {
                        if rx.changed().await.is_err() {
                            std::future::pending::<()>().await
                        }
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(poll) => {}
                _ = wait_notify => {}
                _ = shutdown.changed() => {}
            }
            if *shutdown.borrow() {
                return;
            }
        }
    }
}

/// Ticks on every registry notification; `None` when LISTEN fails (polling
/// still finds every change).
async fn listen(pool: &sqlx::PgPool) -> Option<watch::Receiver<u64>> {
    crate::store::postgres::listen(pool, NOTIFY_CHANNEL)
        .await
        .inspect_err(
            |e| tracing::warn!(error = %e, "cannot LISTEN for plugin changes; polling only"),
        )
        .ok()
}
