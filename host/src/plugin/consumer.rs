//! One consumer plugin version: compiled and pre-instantiated once, then
//! called per message in a sandboxed Store that is reused until it fails.
//! During the call the plugin borrows the host's transaction (see
//! [`super::transaction`]); it never holds a connection.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use wasmtime::Store;
use wasmtime::component::Resource;

use super::bindings::consumer::{Consumer, ConsumerPre};
use super::bindings::transformer::outbox::plugin::types::{Message, PluginError as WitError};
use super::engine::{EPOCH_TICK, PluginEngine};
use super::error::PluginError;
use super::host::HostState;
use super::limits::Limits;
use super::log::{LineBudget, drain};
use super::metrics::PluginMetrics;
use super::transaction::{ActiveTransaction, TxnPolicy, TxnServer, link, next_request};
use super::transformer::{PluginSpec, classify};
use super::{cache, validate};
use crate::store::InboxTx;

struct Slot {
    store: Store<HostState>,
    bindings: Consumer,
}

/// A loaded consumer plugin. Share it with `Arc`; calls may overlap.
pub struct ConsumerPlugin {
    name: String,
    version: String,
    limits: Limits,
    engine: PluginEngine,
    pre: ConsumerPre<HostState>,
    config: Arc<BTreeMap<String, String>>,
    idle: Mutex<Vec<Slot>>,
    log_budget: Mutex<LineBudget>,
    metrics: PluginMetrics,
}

impl std::fmt::Debug for ConsumerPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerPlugin")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

const MAX_IDLE: usize = 8;

impl ConsumerPlugin {
    /// Reads, checks, compiles (or loads from the cache) and pre-instantiates
    /// the component once per version.
    pub fn load(engine: &PluginEngine, spec: &PluginSpec) -> Result<Self, PluginError> {
        let wasm = std::fs::read(&spec.path).map_err(|e| {
            PluginError::Invalid(format!(
                "plugin `{}` ({}): cannot read: {e}",
                spec.name,
                spec.path.display()
            ))
        })?;
        Self::from_bytes(engine, spec, &wasm)
    }

    /// The same as [`load`](Self::load) from bytes already read (a registry
    /// version); `spec.path` only names the source in errors.
    pub fn from_bytes(
        engine: &PluginEngine,
        spec: &PluginSpec,
        wasm: &[u8],
    ) -> Result<Self, PluginError> {
        let invalid = |what: String| {
            PluginError::Invalid(format!(
                "plugin `{}` ({}): {what}",
                spec.name,
                spec.path.display()
            ))
        };
        validate::check_is_component(wasm).map_err(invalid)?;
        let sha256 = hex::encode(Sha256::digest(wasm));
        let component = cache::load_or_compile(
            &engine.engine,
            engine.config.cache_dir.as_deref(),
            &sha256,
            wasm,
        )
        .map_err(|e| invalid(format!("does not compile: {e}")))?;
        let instance_pre = engine.linker.instantiate_pre(&component).map_err(|e| {
            invalid(format!(
                "imports something outboxd does not provide ({e}); a consumer may import only WASI p2, outbox:plugin/config and outbox:plugin/transaction@0.1.0"
            ))
        })?;
        let pre = ConsumerPre::new(instance_pre).map_err(|e| {
            invalid(format!(
                "is not an outbox:plugin/consumer@0.1.0 component ({e}); build it with export_consumer!"
            ))
        })?;
        Ok(Self {
            name: spec.name.clone(),
            version: spec
                .version
                .clone()
                .unwrap_or_else(|| format!("sha256:{}", &sha256[..12])),
            limits: spec.limits,
            engine: engine.clone(),
            pre,
            config: Arc::new(spec.config.clone()),
            idle: Mutex::new(Vec::new()),
            log_budget: Mutex::new(LineBudget::new(20.0, 100.0)),
            metrics: PluginMetrics::default(),
        })
    }

    pub fn metrics(&self) -> &PluginMetrics {
        &self.metrics
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `name@version`, as dead letters record it.
    pub fn label(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }

    fn deadline_ticks(&self, ms: u64) -> u64 {
        ms.div_ceil(EPOCH_TICK.as_millis() as u64).max(1)
    }

    async fn instantiate(&self) -> Result<Slot, PluginError> {
        let mut store = Store::new(
            &self.engine.engine,
            HostState::new(self.limits.memory_bytes(), self.config.clone()),
        );
        store.limiter(|s| &mut s.memory);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(self.deadline_ticks(self.limits.timeout_ms.saturating_mul(10)));
        self.metrics.instantiated();
        match self.pre.instantiate_async(&mut store).await {
            Ok(bindings) => Ok(Slot { store, bindings }),
            Err(e) => {
                let hit = store.data().memory.hit;
                self.drain_logs(&store);
                Err(match classify(e, hit, &self.limits) {
                    PluginError::Trap(m) => PluginError::Instantiate(m),
                    other => other,
                })
            }
        }
    }

    /// Runs the plugin on one message inside `tx`. The caller rolls back on
    /// any error. Never panics; after a trap or a timeout the Store is dropped.
    pub async fn handle(
        &self,
        tx: &mut InboxTx,
        message: &Message,
        policy: &TxnPolicy,
    ) -> Result<(), PluginError> {
        self.handle_cancellable(tx, message, policy, None).await
    }

    /// [`handle`](Self::handle), where a Postgres statement still running
    /// at the wall deadline is cancelled on the server through `cancel` (a
    /// pool on the same server), not only abandoned by the host.
    pub async fn handle_cancellable(
        &self,
        tx: &mut InboxTx,
        message: &Message,
        policy: &TxnPolicy,
        cancel: Option<&sqlx::PgPool>,
    ) -> Result<(), PluginError> {
        let start = Instant::now();
        let result = self.call(tx, message, policy, cancel).await;
        self.metrics.record(
            start.elapsed(),
            result.as_ref().err().map(PluginError::kind),
        );
        result
    }

    async fn call(
        &self,
        tx: &mut InboxTx,
        message: &Message,
        policy: &TxnPolicy,
        cancel: Option<&sqlx::PgPool>,
    ) -> Result<(), PluginError> {
        let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
        let mut slot = match idle {
            Some(slot) => slot,
            None => self.instantiate().await?,
        };
        slot.store.data_mut().memory.hit = false;
        slot.store
            .set_epoch_deadline(self.deadline_ticks(self.limits.timeout_ms));
        let mailbox = link();
        slot.store.data_mut().txn = Some(mailbox.clone());
        let resource = slot
            .store
            .data_mut()
            .table
            .push(ActiveTransaction)
            .map_err(|e| PluginError::Trap(format!("cannot create the transaction handle: {e}")))?;
        let borrowed = Resource::<ActiveTransaction>::new_borrow(resource.rep());
        let mut server = TxnServer::new(tx, policy);
        // The epoch deadline stops guest code; this bounds a host call that
        // hangs (a lock wait on SQLite, say) as well.
        let wall = Duration::from_millis(
            self.limits
                .timeout_ms
                .saturating_mul(2)
                .saturating_add(policy.statement_timeout_ms),
        );
        let result = {
            let call = slot
                .bindings
                .call_handle(&mut slot.store, borrowed, message);
            tokio::pin!(call);
            let serve = async {
                loop {
                    tokio::select! {
                        biased;
                        r = &mut call => break r,
                        op = next_request(&mailbox) => server.serve(&mailbox, op).await,
                    }
                }
            };
            tokio::time::timeout(wall, serve).await
        };
        let Ok(result) = result else {
            // The Store was abandoned mid-call: drop it. A statement may
            // still be running on the server: stop it there too.
            let pid = server.backend_pid();
            drop(server);
            stop_abandoned_statement(tx, pid, cancel).await;
            return Err(PluginError::Timeout(self.limits.timeout_ms));
        };
        slot.store.data_mut().txn = None;
        let _ = slot.store.data_mut().table.delete(resource);
        self.drain_logs(&slot.store);
        let outcome = match result {
            Ok(Ok(())) => match server.failure.take() {
                Some(failure) => Err(PluginError::Transaction(format!(
                    "{failure}; the plugin returned ok after the error, the message is rolled back"
                ))),
                None => Ok(()),
            },
            Ok(Err(WitError::Retryable(message))) => Err(PluginError::Guest {
                retryable: true,
                message: with_failure(message, server.failure.take()),
            }),
            Ok(Err(WitError::Permanent(message))) => Err(PluginError::Guest {
                retryable: false,
                message: with_failure(message, server.failure.take()),
            }),
            Err(e) => {
                let hit = slot.store.data().memory.hit;
                return Err(classify(e, hit, &self.limits));
            }
        };
        if self.limits.reuse_instances
            && let Ok(mut idle) = self.idle.lock()
            && idle.len() < MAX_IDLE
        {
            idle.push(slot);
        }
        outcome
    }

    fn drain_logs(&self, store: &Store<HostState>) {
        let data = store.data();
        drain(&self.name, "stdout", &data.stdout, &self.log_budget);
        drain(&self.name, "stderr", &data.stderr, &self.log_budget);
    }
}

/// After the wall deadline: on Postgres, `pg_cancel_backend` from another
/// connection (the transaction is rolled back by the caller, and the
/// rollback would otherwise wait for the statement); on SQLite, the
/// statement is interrupted by the guard's progress handler and the
/// connection reset.
async fn stop_abandoned_statement(
    tx: &mut InboxTx,
    pid: Option<i32>,
    cancel: Option<&sqlx::PgPool>,
) {
    match tx {
        InboxTx::Postgres(t) => {
            if let (Some(pid), Some(pool)) = (pid, cancel) {
                let cancelled = sqlx::query("SELECT pg_cancel_backend($1)")
                    .bind(pid)
                    .execute(pool)
                    .await;
                if let Err(e) = cancelled {
                    tracing::warn!(pid, error = %e, "cannot cancel a plugin statement past its deadline");
                }
                // The abandoned statement's answer (now `canceling
                // statement due to user request`) is still on the wire:
                // read it here, so the caller's rollback gets its own.
                let _drained = sqlx::Executor::execute(&mut **t, "SELECT 1").await;
            }
        }
        InboxTx::Sqlite(t) => {
            if let Err(e) = crate::store::sqlite_plugin_guard::reset(t).await {
                tracing::warn!(error = %e, "cannot reset a SQLite connection after a plugin deadline");
            }
        }
    }
}

fn with_failure(message: String, failure: Option<String>) -> String {
    match failure {
        Some(f) => format!("{message} (after {f})"),
        None => message,
    }
}
