//! The relay's plugin path: run the route's transformer chain on an event,
//! then publish what it returned. No output marks the event filtered; each
//! of several outputs gets a deterministic message id, so a republish after
//! a crash produces the same ids and consumers still deduplicate.

use std::time::Instant;

use futures_util::future::join_all;
use opentelemetry::Context;

use super::EventResult;
use super::FailureCause;
use super::Relay;
use crate::broker::Publisher;
use crate::event::OutboxEvent;
use crate::message::OutgoingMessage;
use crate::message::{keep_event_trace, plugin_message};
use crate::plugin::lifecycle::chains::{PinError, RouteChain, Shadow};
use crate::plugin::lifecycle::shadow;
use crate::plugin::{Chain, GuestEvent, GuestMessage};
use crate::route::Router;
use crate::store::OutboxStore;
use crate::telemetry::{FutureExt, Span};

/// The event as a guest sees it.
pub fn guest_event(ev: &OutboxEvent) -> GuestEvent {
    GuestEvent {
        id: ev.id.0.to_string(),
        aggregate_id: ev.aggregate_id.clone(),
        event_type: ev.event_type.clone(),
        payload: ev.payload.clone().into_bytes(),
        headers: ev
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        created_at: ev.created_at.to_rfc3339(),
        key: ev.aggregate_id.clone().into_bytes(),
        attempt: u32::try_from(ev.attempts).unwrap_or(0),
    }
}

/// What a chain made of one event: its outputs or its error, or the text of
/// a chain task that stopped.
pub(super) type ChainOutput = Result<Result<Vec<GuestMessage>, crate::plugin::ChainError>, String>;

/// One event's chain, ready to run on a task.
enum Job {
    Plain(GuestEvent),
    Shadowed(Box<OutboxEvent>),
}

async fn run_job(
    route: &RouteChain,
    job: Job,
) -> Result<Vec<GuestMessage>, crate::plugin::ChainError> {
    match (job, &route.shadow) {
        (Job::Plain(event), _) => route.active.run(event).await,
        (Job::Shadowed(ev), Some(shadow)) => run_with_shadow(&ev, &route.active, shadow).await,
        (Job::Shadowed(ev), None) => route.active.run(guest_event(&ev)).await,
    }
}

/// The chain an event redriven through a chosen version runs (`Some`
/// only for such events), or why it cannot.
pub(super) type PinnedChain = Option<Result<RouteChain, PinError>>;

impl<S: OutboxStore, P: Publisher> Relay<S, P> {
    /// The pinned chain of every event of a batch that an operator redrove
    /// through a chosen version (`redrive_with`), loading that version on
    /// first use; aligned with `events`, `None` for every other event.
    pub(super) async fn pinned_chains(&self, events: &[OutboxEvent]) -> Vec<PinnedChain> {
        let mut out = Vec::with_capacity(events.len());
        for ev in events {
            out.push(match &ev.redrive_with {
                Some(label) => Some(
                    self.chains
                        .pinned_for_event(&self.router, &ev.event_type, label)
                        .await,
                ),
                None => None,
            });
        }
        out
    }

    /// Runs the chain of every event of a batch that has one, before any of
    /// them is published. Plugin calls are CPU work: the events are split
    /// into one contiguous run per runtime worker thread, each on its own
    /// task, so a batch's calls use every core while costing a task spawn
    /// (and its cross-thread wake) per thread rather than per event. Each
    /// event reads the chain table once here and runs entirely on that
    /// snapshot, except an event redriven through a chosen version, which
    /// runs its `pinned` chain (and one whose pinned chain failed runs
    /// nothing). The result is aligned with `events`; `None` for an event
    /// whose route has no chain.
    pub(super) async fn run_chains(
        &self,
        events: &[OutboxEvent],
        pinned: &[PinnedChain],
        claims: &[Span],
    ) -> Vec<Option<(RouteChain, ChainOutput)>> {
        let mut out: Vec<Option<(RouteChain, ChainOutput)>> = events.iter().map(|_| None).collect();
        let jobs: Vec<(usize, RouteChain, Job)> = events
            .iter()
            .enumerate()
            .filter_map(|(i, ev)| {
                let route = match pinned.get(i) {
                    Some(Some(Ok(route))) => route.clone(),
                    Some(Some(Err(_))) => return None,
                    _ => self.chains.for_event(&self.router, &ev.event_type)?,
                };
                let job = if route.shadow.is_some() {
                    Job::Shadowed(Box::new(ev.clone()))
                } else {
                    Job::Plain(guest_event(ev))
                };
                Some((i, route, job))
            })
            .collect();
        if jobs.is_empty() {
            return out;
        }
        let threads = tokio::runtime::Handle::current()
            .metrics()
            .num_workers()
            .clamp(1, 16);
        let per_task = jobs.len().div_ceil(threads);
        let mut jobs = jobs.into_iter();
        let mut tasks = Vec::with_capacity(threads);
        loop {
            let chunk: Vec<(usize, RouteChain, Job, Option<Context>)> = jobs
                .by_ref()
                .take(per_task)
                .map(|(i, r, job)| (i, r, job, claims.get(i).and_then(Span::context).cloned()))
                .collect();
            if chunk.is_empty() {
                break;
            }
            let routes: Vec<(usize, RouteChain)> =
                chunk.iter().map(|(i, r, _, _)| (*i, r.clone())).collect();
            let task = tokio::spawn(async move {
                let mut results = Vec::with_capacity(chunk.len());
                for (_, route, job, trace) in chunk {
                    // The chain's plugin calls are spans under the claim.
                    let result = match trace {
                        Some(cx) => run_job(&route, job).with_context(cx).await,
                        None => run_job(&route, job).await,
                    };
                    results.push(result);
                }
                results
            });
            tasks.push((routes, task));
        }
        for (routes, task) in tasks {
            match task.await {
                Ok(results) => {
                    for ((i, route), result) in routes.into_iter().zip(results) {
                        out[i] = Some((route, Ok(result)));
                    }
                }
                Err(join) => {
                    for (i, route) in routes {
                        let text = format!("plugin chain {} stopped: {join}", route.active.label());
                        out[i] = Some((route, Err(text)));
                    }
                }
            }
        }
        out
    }

    /// Publishes what an event's chain returned.
    pub(super) async fn publish_outputs(
        &self,
        ev: &OutboxEvent,
        route: &RouteChain,
        output: ChainOutput,
        claim: Option<&Context>,
    ) -> EventResult {
        let chain = &route.active;
        let outputs = match output {
            Ok(Ok(outputs)) => outputs,
            Ok(Err(e)) => {
                return EventResult::Failed {
                    permanent: e.error.is_permanent(),
                    error: e.to_string(),
                    cause: FailureCause::Plugin,
                    retry_after: None,
                };
            }
            Err(stopped) => {
                return EventResult::Failed {
                    permanent: false,
                    error: stopped,
                    cause: FailureCause::Plugin,
                    retry_after: None,
                };
            }
        };
        if outputs.is_empty() {
            return EventResult::Filtered(chain.label());
        }
        let count = outputs.len();
        let topic = self.router.topic_for(&ev.event_type).to_string();
        let may_set_trace = self
            .router
            .route_index(&ev.event_type)
            .is_some_and(|i| self.router.routes()[i].plugins_may_set_trace);
        let messages = outputs.into_iter().enumerate().map(|(i, m)| {
            let mut m = plain(m);
            if !may_set_trace {
                keep_event_trace(&ev.headers, &mut m.headers);
            }
            // A trace context the route let a plugin set is the parent of
            // the publish; otherwise the claim is.
            let own = may_set_trace
                .then(|| crate::telemetry::from_headers(&m.headers))
                .flatten()
                .filter(|_| {
                    m.headers
                        .iter()
                        .find(|(k, _)| k == crate::telemetry::TRACEPARENT)
                        .map(|(_, v)| v)
                        != ev.headers.get(crate::telemetry::TRACEPARENT)
                });
            (plugin_message(ev, &topic, m, i, count), own)
        });
        let results = join_all(
            messages.map(|(m, own)| async move { self.publish(m, own.as_ref().or(claim)).await }),
        )
        .await;
        let mut failure = None;
        for (i, r) in results.into_iter().enumerate() {
            if let Err(e) = r {
                // A permanent failure of any output makes the event dead;
                // otherwise the whole event is retried (acked outputs are
                // republished with the same ids).
                let permanent = e.is_permanent();
                if failure.is_none() || permanent {
                    let error = format!("output {i} of {count} (after {}): {e}", chain.label());
                    failure = Some(EventResult::send_failed(e, error));
                }
            }
        }
        failure.unwrap_or_else(|| EventResult::Published(Some(chain.label())))
    }
}

/// What the relay would publish for `ev` through `route`'s chain, without
/// publishing: the broker messages exactly as they would be sent (ids,
/// topic, key, headers, payload); none when the chain drops the event. A
/// dry run of a redrive shows this.
pub async fn preview(
    router: &Router,
    route: &RouteChain,
    ev: &OutboxEvent,
) -> Result<Vec<OutgoingMessage>, crate::plugin::ChainError> {
    let outputs = route.active.run(guest_event(ev)).await?;
    let count = outputs.len();
    let topic = router.topic_for(&ev.event_type).to_string();
    Ok(outputs
        .into_iter()
        .enumerate()
        .map(|(i, m)| plugin_message(ev, &topic, plain(m), i, count))
        .collect())
}

/// Runs the active and the shadow chain side by side on the same event and
/// counts how they compared; only the active result is returned.
async fn run_with_shadow(
    ev: &OutboxEvent,
    chain: &Chain,
    shadow: &Shadow,
) -> Result<Vec<GuestMessage>, crate::plugin::ChainError> {
    let timed = |c: &Chain| {
        let event = guest_event(ev);
        let c = c.clone();
        async move {
            let start = Instant::now();
            let r = c.run(event).await;
            (r, start.elapsed())
        }
    };
    let ((active, active_time), (candidate, shadow_time)) =
        tokio::join!(timed(chain), timed(&shadow.chain));
    let comparison = shadow::compare(&active, &candidate);
    shadow
        .stats
        .record(&ev.id.0.to_string(), &comparison, active_time, shadow_time);
    active
}

/// A guest's output as core's plain mirror of it.
fn plain(m: GuestMessage) -> outboxd_core::message::GuestMessage {
    outboxd_core::message::GuestMessage {
        topic: m.topic,
        key: m.key,
        payload: m.payload,
        headers: m.headers,
    }
}
