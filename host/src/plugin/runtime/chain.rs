//! A route's chain of transformers. Each message a plugin returns becomes
//! the event the next plugin sees (same id, type and time; new payload,
//! headers and key); the last plugin's messages are what the relay sends.
//! A chain built for a route also checks every topic a plugin names against
//! that route's [`TopicPolicy`], and names the plugin that broke it.

use std::sync::Arc;

use crate::plugin::bindings::{GuestEvent, GuestMessage};
use crate::plugin::error::PluginError;
use crate::plugin::runtime::transformer::TransformerPlugin;

/// Which plugin of a chain failed, and how.
#[derive(Debug, Clone, thiserror::Error)]
#[error("plugin {plugin}: {error}")]
pub struct ChainError {
    /// `name@version`.
    pub plugin: String,
    pub error: PluginError,
}

/// The topics a route's plugins may send to: the route's own topic and its
/// `allowed_topics`. A plugin that names any other topic fails the event
/// permanently (it is dead-lettered with the reason), so a compromised or
/// buggy plugin cannot publish into another service's topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicPolicy {
    /// The config key of the route, for example `routes[0]`.
    pub route_key: String,
    pub route_topic: String,
    pub allowed: Vec<String>,
}

impl TopicPolicy {
    /// The topics `route`'s plugins may name; `index` is the route's
    /// position in the config, for error messages.
    pub fn for_route(route: &outboxd_core::route::Route, index: usize) -> Self {
        Self {
            route_key: format!("routes[{index}]"),
            route_topic: route.destination().to_string(),
            allowed: route.allowed_topics.clone(),
        }
    }

    pub fn allows(&self, topic: &str) -> bool {
        topic == self.route_topic || self.allowed.iter().any(|t| t == topic)
    }

    fn refuse(&self, topic: String) -> PluginError {
        PluginError::TopicNotAllowed {
            topic,
            route_key: self.route_key.clone(),
            route_topic: self.route_topic.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Chain {
    plugins: Vec<Arc<TransformerPlugin>>,
    /// `a@1,b@2`, computed once: it is recorded with every event.
    label: String,
    /// Set when a registry plugin of the chain has no active version: every
    /// event fails with this (retryable) reason until one is activated.
    unavailable: Option<ChainError>,
    /// `None` (a chain run outside a route, as by `outboxd plugin test`)
    /// lets outputs name any topic.
    topics: Option<Arc<TopicPolicy>>,
}

impl Chain {
    pub fn new(plugins: Vec<Arc<TransformerPlugin>>) -> Self {
        let label = plugins
            .iter()
            .map(|p| p.label())
            .collect::<Vec<_>>()
            .join(",");
        Self {
            plugins,
            label,
            unavailable: None,
            topics: None,
        }
    }

    /// Restricts the topics this chain's plugins may name to `policy`.
    pub fn with_topics(mut self, policy: TopicPolicy) -> Self {
        self.topics = Some(Arc::new(policy));
        self
    }

    /// A chain that cannot run yet: `plugin` (a registry name) has no
    /// active version.
    pub fn unavailable(plugin: &str) -> Self {
        Self {
            plugins: Vec::new(),
            label: String::new(),
            unavailable: Some(ChainError {
                plugin: plugin.to_string(),
                error: PluginError::Guest {
                    retryable: true,
                    message:
                        "no version is active in the plugin registry; run `outboxd plugin activate`"
                            .into(),
                },
            }),
            topics: None,
        }
    }

    pub fn plugins(&self) -> &[Arc<TransformerPlugin>] {
        &self.plugins
    }

    /// The same chain (same topics) with the plugin named like `plugin` in
    /// its place; `None` when no plugin of the chain has that name. An
    /// unavailable chain stays unavailable.
    pub fn with_plugin_replaced(&self, plugin: Arc<TransformerPlugin>) -> Option<Chain> {
        if self.unavailable.is_some() {
            return Some(self.clone());
        }
        let at = self
            .plugins
            .iter()
            .position(|p| p.name() == plugin.name())?;
        let mut plugins = self.plugins.clone();
        plugins[at] = plugin;
        let mut chain = Chain::new(plugins);
        chain.topics = self.topics.clone();
        Some(chain)
    }

    /// Whether a registry plugin of this chain has no active version.
    pub fn is_unavailable(&self) -> bool {
        self.unavailable.is_some()
    }

    /// `a@1,b@2`: what the outbox records as `transformed_by`.
    pub fn label(&self) -> String {
        self.label.clone()
    }

    /// Runs every plugin in order. An empty result means the event was
    /// filtered. The fan-out cap of the last plugin also caps the chain's
    /// total, so two splitting plugins cannot multiply past it.
    pub async fn run(&self, event: GuestEvent) -> Result<Vec<GuestMessage>, ChainError> {
        if let Some(e) = &self.unavailable {
            return Err(e.clone());
        }
        let mut current: Vec<(GuestEvent, Option<String>)> = vec![(event, None)];
        for plugin in &self.plugins {
            let mut next = Vec::with_capacity(current.len());
            for (event, topic) in current {
                let span = crate::telemetry::Span::in_current(
                    "plugin.transform",
                    opentelemetry::trace::SpanKind::Internal,
                );
                span.attr("outboxd.plugin.name", || plugin.name().to_string());
                span.attr("outboxd.plugin.version", || plugin.version().to_string());
                let outputs = plugin.transform(&event).await;
                span.record(&outputs);
                drop(span);
                let outputs = outputs.map_err(|error| ChainError {
                    plugin: plugin.label(),
                    error,
                })?;
                for m in outputs {
                    if let (Some(policy), Some(t)) = (&self.topics, &m.topic)
                        && !policy.allows(t)
                    {
                        let error = policy.refuse(t.clone());
                        plugin.metrics().error(error.kind());
                        return Err(ChainError {
                            plugin: plugin.label(),
                            error,
                        });
                    }
                    let topic = m.topic.or_else(|| topic.clone());
                    next.push((
                        GuestEvent {
                            id: event.id.clone(),
                            aggregate_id: event.aggregate_id.clone(),
                            event_type: event.event_type.clone(),
                            created_at: event.created_at.clone(),
                            attempt: event.attempt,
                            payload: m.payload,
                            headers: m.headers,
                            key: m.key,
                        },
                        topic,
                    ));
                }
                if let Some(last) = self.plugins.last() {
                    let cap = last.limits().max_outputs;
                    if next.len() > cap {
                        return Err(ChainError {
                            plugin: plugin.label(),
                            error: PluginError::TooManyOutputs {
                                count: next.len(),
                                cap,
                            },
                        });
                    }
                }
            }
            current = next;
            if current.is_empty() {
                break;
            }
        }
        Ok(current
            .into_iter()
            .map(|(e, topic)| GuestMessage {
                topic,
                key: e.key,
                payload: e.payload,
                headers: e.headers,
            })
            .collect())
    }
}
