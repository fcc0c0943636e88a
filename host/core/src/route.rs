//! Routing: which topic (or webhook) an event type goes to, and through
//! which chain of transformer plugins.

use serde::Deserialize;

use crate::config::webhook::WebhookSink;

/// `event_type` is an exact type, `*`, or a prefix pattern such as `order.*`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    pub event_type: String,
    /// The topic to publish to; empty on a webhook route.
    #[serde(default)]
    pub topic: String,
    /// A webhook route's name (metrics, `outboxd dead`, `outboxd route
    /// resume`); it is also the destination its messages carry.
    #[serde(default)]
    pub name: Option<String>,
    /// Send each message as a signed HTTP POST instead of to a topic.
    #[serde(default)]
    pub webhook: Option<WebhookSink>,
    /// Names of `[[plugins]]` to run in order before publishing; empty
    /// publishes the event as it is.
    #[serde(default)]
    pub transformers: Vec<String>,
    /// Topics other than `topic` that the route's transformers may send
    /// to. A plugin output naming any other topic makes the event dead.
    #[serde(default)]
    pub allowed_topics: Vec<String>,
    /// Lets the route's transformers replace or drop the trace context
    /// (`traceparent`, `tracestate`). Off by default: the host puts the
    /// event's own trace context back on every output after the chain.
    #[serde(default)]
    pub plugins_may_set_trace: bool,
}

impl Route {
    pub fn new(event_type: impl Into<String>, topic: impl Into<String>) -> Self {
        Self {
            event_type: event_type.into(),
            topic: topic.into(),
            name: None,
            webhook: None,
            transformers: Vec::new(),
            allowed_topics: Vec::new(),
            plugins_may_set_trace: false,
        }
    }

    /// A route named `name` that sends to `sink` instead of a topic.
    pub fn webhook(
        event_type: impl Into<String>,
        name: impl Into<String>,
        sink: WebhookSink,
    ) -> Self {
        let mut r = Self::new(event_type, "");
        r.name = Some(name.into());
        r.webhook = Some(sink);
        r
    }

    /// Where the route's messages go: its topic, or a webhook route's name.
    pub fn destination(&self) -> &str {
        match (&self.webhook, &self.name) {
            (Some(_), Some(name)) => name,
            _ => &self.topic,
        }
    }

    /// Lets the route's transformers set the trace context themselves.
    pub fn letting_plugins_set_trace(mut self) -> Self {
        self.plugins_may_set_trace = true;
        self
    }

    /// Lets the route's transformers also send to `topics`.
    pub fn allowing_topics(mut self, topics: &[&str]) -> Self {
        self.allowed_topics = topics.iter().map(|t| t.to_string()).collect();
        self
    }

    pub fn with_transformers(mut self, names: &[&str]) -> Self {
        self.transformers = names.iter().map(|n| n.to_string()).collect();
        self
    }
}

#[derive(Debug, Clone, Default)]
pub struct Router {
    routes: Vec<Route>,
}

impl Router {
    pub fn new(routes: Vec<Route>) -> Self {
        Self { routes }
    }

    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The index of the first matching route.
    pub fn route_index(&self, event_type: &str) -> Option<usize> {
        self.routes
            .iter()
            .position(|r| pattern_matches(&r.event_type, event_type))
    }

    /// The first matching route's destination (a topic, or a webhook
    /// route's name), or the event type itself.
    pub fn topic_for<'a>(&'a self, event_type: &'a str) -> &'a str {
        self.route_index(event_type)
            .map(|i| self.routes[i].destination())
            .unwrap_or(event_type)
    }
}

pub fn pattern_matches(pattern: &str, event_type: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => event_type.starts_with(prefix),
        None => pattern == event_type,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_match_wins_and_default_is_the_type() {
        let r = Router::new(vec![
            Route::new("order.confirmed", "billing"),
            Route::new("order.*", "orders"),
        ]);
        assert_eq!(r.topic_for("order.confirmed"), "billing");
        assert_eq!(r.topic_for("order.cancelled"), "orders");
        assert_eq!(r.topic_for("invoice.issued"), "invoice.issued");
    }
}
