//! One consumer plugin version: compiled and pre-instantiated once, then
//! called per message in a sandboxed Store that is reused until it fails.
//! During the call the plugin borrows the host's transaction (see
//! [`crate::plugin::host::transaction`]); it never holds a connection.

use std::time::Instant;

use crate::config::TxnPolicy;
use crate::plugin::bindings::consumer::{Consumer, ConsumerPre};
use crate::plugin::bindings::transformer::outbox::plugin::types::{
    Message, PluginError as WitError,
};
use crate::plugin::error::{PluginError, classify};
use crate::plugin::host::http::{HttpCall, HttpRecord, Transport};
use crate::plugin::host::transaction::PluginStatement;
use crate::plugin::host::transaction::Recording;
use crate::plugin::host::transaction::link;
use crate::plugin::host::transaction::next_request;
use crate::plugin::host::transaction::server::TxnServer;
use crate::plugin::host::{ConsumerState, StoreState};
use crate::plugin::runtime::loaded::Loaded;
use crate::store::InboxTx;
use crate::store::inbox::outbound;

/// A loaded consumer plugin. Share it with `Arc`; calls may overlap.
#[derive(Debug)]
pub struct ConsumerPlugin {
    loaded: Loaded<Consumer>,
}

crate::plugin::runtime::loaded::plugin_world!(
    Consumer,
    ConsumerPre,
    ConsumerPlugin,
    data: ConsumerState,
    linker: consumers,
    world: "consumer",
    name: "outbox:plugin/consumer@0.1.0",
    imports: "a consumer may import only WASI p2, outbox:plugin/config and outbox:plugin/transaction@0.1.0",
    build: "build it with outboxd-guest-consumer's export_consumer!",
);

impl ConsumerPlugin {
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
    /// at the wall deadline is cancelled on the server through `cancel` (the
    /// database the transaction runs on), not only abandoned by the host.
    pub async fn handle_cancellable(
        &self,
        tx: &mut InboxTx,
        message: &Message,
        policy: &TxnPolicy,
        cancel: Option<&crate::store::Db>,
    ) -> Result<(), PluginError> {
        self.measured(tx, message, policy, cancel, None, Transport::Live)
            .await
    }

    /// [`handle_cancellable`](Self::handle_cancellable), also returning
    /// every statement the plugin sent, in order. With
    /// [`Recording::TextOnly`] (a dry run of a real message) each is its
    /// kind, text and outcome, never a parameter value; with
    /// [`Recording::WithValues`] also its parameters, rows and emitted
    /// event. Every HTTP request is refused, as in a shadow run: a dry run
    /// has no external effect ([`handle_traced`](Self::handle_traced)
    /// chooses its transport).
    pub async fn handle_recorded(
        &self,
        tx: &mut InboxTx,
        message: &Message,
        policy: &TxnPolicy,
        cancel: Option<&crate::store::Db>,
        mode: Recording,
    ) -> (Result<(), PluginError>, Vec<PluginStatement>) {
        let mut statements = Vec::new();
        // A recorded run is a dry run: it must have no effect outside its
        // rolled-back transaction, so every HTTP request is refused.
        let result = self
            .measured(
                tx,
                message,
                policy,
                cancel,
                Some((mode, &mut statements)),
                Transport::Shadow,
            )
            .await;
        (result, statements)
    }

    /// [`handle_recorded`](Self::handle_recorded) with
    /// [`Recording::WithValues`] and the HTTP requests going to
    /// `transport`, also returning every request the plugin made (what
    /// `outboxd plugin test` shows). With [`Transport::Live`] and a
    /// `cancel` database, intents are audited as in a real run.
    pub async fn handle_traced(
        &self,
        tx: &mut InboxTx,
        message: &Message,
        policy: &TxnPolicy,
        cancel: Option<&crate::store::Db>,
        transport: Transport,
    ) -> Traced {
        let mut statements = Vec::new();
        let start = Instant::now();
        let (result, http) = self
            .call(
                tx,
                message,
                policy,
                cancel,
                Some((Recording::WithValues, &mut statements)),
                transport,
            )
            .await;
        self.loaded.metrics.record(
            start.elapsed(),
            result.as_ref().err().map(PluginError::kind),
        );
        Traced {
            result,
            statements,
            http,
        }
    }

    /// A shadow run: [`handle_cancellable`](Self::handle_cancellable) with
    /// every HTTP request refused, so a candidate has no external effect.
    pub async fn handle_shadow(
        &self,
        tx: &mut InboxTx,
        message: &Message,
        policy: &TxnPolicy,
        cancel: Option<&crate::store::Db>,
    ) -> Result<(), PluginError> {
        self.measured(tx, message, policy, cancel, None, Transport::Shadow)
            .await
    }

    async fn measured(
        &self,
        tx: &mut InboxTx,
        message: &Message,
        policy: &TxnPolicy,
        cancel: Option<&crate::store::Db>,
        record: Option<(Recording, &mut Vec<PluginStatement>)>,
        transport: Transport,
    ) -> Result<(), PluginError> {
        let start = Instant::now();
        let (result, _) = self
            .call(tx, message, policy, cancel, record, transport)
            .await;
        self.loaded.metrics.record(
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
        cancel: Option<&crate::store::Db>,
        record: Option<(Recording, &mut Vec<PluginStatement>)>,
        transport: Transport,
    ) -> (Result<(), PluginError>, Vec<HttpRecord>) {
        let mut slot = match self.loaded.slot().await {
            Ok(slot) => slot,
            Err(e) => return (Err(e), Vec::new()),
        };
        slot.store.data_mut().http().begin(HttpCall {
            policy: self.loaded.outbound.clone(),
            message_id: message.id.clone(),
            consumer: policy.consumer.clone(),
            plugin: self.loaded.label(),
            transport,
            audit: cancel.cloned(),
        });
        let result = self
            .run(&mut slot, tx, message, policy, cancel, record)
            .await;
        let http = slot.store.data_mut().http().finish();
        for r in http.iter() {
            let host = self.loaded.outbound.host_label(&r.url);
            self.loaded
                .http_metrics
                .record(&host, r.outcome(), r.duration);
        }
        let outcomes: Vec<outbound::Outcome> = http
            .iter()
            .filter_map(|r| {
                Some(outbound::Outcome {
                    id: r.audit_id.clone()?,
                    status: r.status,
                    error: r.error.clone(),
                    duration: r.duration,
                })
            })
            .collect();
        let result = match (result, cancel) {
            (Ok(()), _) => match outbound::write_outcomes(tx, &outcomes).await {
                Ok(()) => Ok(()),
                Err(e) => Err(PluginError::Transaction(format!(
                    "recording the outcome of the plugin's HTTP requests in outbound_calls: {e}"
                ))),
            },
            (Err(e), Some(db)) => {
                if let Err(w) = outbound::write_outcomes_alone(db, &outcomes).await {
                    tracing::warn!(error = %w, "recording HTTP outcomes of a rolled-back message failed; the intents stay without outcome");
                }
                Err(e)
            }
            (Err(e), None) => Err(e),
        };
        let reusable = match &result {
            Ok(()) => true,
            Err(e) => matches!(e, PluginError::Guest { .. } | PluginError::Transaction(_)),
        };
        if reusable {
            self.loaded.give_back(slot);
        }
        (result, http)
    }

    /// One guest call in `slot`'s Store, the transaction served meanwhile.
    async fn run(
        &self,
        slot: &mut crate::plugin::runtime::loaded::Slot<Consumer>,
        tx: &mut InboxTx,
        message: &Message,
        policy: &TxnPolicy,
        cancel: Option<&crate::store::Db>,
        record: Option<(Recording, &mut Vec<PluginStatement>)>,
    ) -> Result<(), PluginError> {
        let mailbox = link();
        let handle = slot.store.data_mut().transaction().lend(mailbox.clone())?;
        let mut server = TxnServer::new(tx, policy);
        if let Some((mode, _)) = &record {
            server = server.recording(*mode);
        }
        // The epoch deadline stops guest code; this bounds a host call that
        // hangs (a lock wait on SQLite, say) as well.
        let wall = self
            .loaded
            .limits
            .timeout
            .saturating_mul(2)
            .saturating_add(policy.statement_timeout);
        let result = {
            let call = slot.bindings.call_handle(&mut slot.store, handle, message);
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
        if let Some((_, out)) = record {
            *out = server
                .recorded
                .take()
                .map(|(_, log)| log)
                .unwrap_or_default();
        }
        let Ok(result) = result else {
            // The Store was abandoned mid-call: drop it. A statement may
            // still be running on the server: stop it there too.
            drop(server);
            tx.stop_abandoned_statement(cancel).await;
            return Err(PluginError::Timeout(
                self.loaded.limits.timeout.as_millis() as u64
            ));
        };
        slot.store.data_mut().transaction().end_loan();
        self.loaded.drain_logs(&slot.store);
        match result {
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
                let hit = slot.store.data().sandbox().memory.hit;
                Err(classify(e, hit, &self.loaded.limits))
            }
        }
    }
}

/// What [`ConsumerPlugin::handle_traced`] returns.
#[derive(Debug)]
pub struct Traced {
    pub result: Result<(), PluginError>,
    /// Every statement the plugin sent, in order.
    pub statements: Vec<PluginStatement>,
    /// Every HTTP request the plugin made, in order, refused ones included.
    pub http: Vec<HttpRecord>,
}

fn with_failure(message: String, failure: Option<String>) -> String {
    match failure {
        Some(f) => format!("{message} (after {f})"),
        None => message,
    }
}
