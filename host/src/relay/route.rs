//! Routing: which topic an event type goes to.

use serde::Deserialize;

/// `event_type` is an exact type, `*`, or a prefix pattern such as `order.*`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    pub event_type: String,
    pub topic: String,
}

#[derive(Debug, Clone, Default)]
pub struct Router {
    routes: Vec<Route>,
}

impl Router {
    pub fn new(routes: Vec<Route>) -> Self {
        Self { routes }
    }

    /// The first matching route's topic, or the event type itself.
    pub fn topic_for<'a>(&'a self, event_type: &'a str) -> &'a str {
        self.routes
            .iter()
            .find(|r| pattern_matches(&r.event_type, event_type))
            .map(|r| r.topic.as_str())
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
            Route {
                event_type: "order.confirmed".into(),
                topic: "billing".into(),
            },
            Route {
                event_type: "order.*".into(),
                topic: "orders".into(),
            },
        ]);
        assert_eq!(r.topic_for("order.confirmed"), "billing");
        assert_eq!(r.topic_for("order.cancelled"), "orders");
        assert_eq!(r.topic_for("invoice.issued"), "invoice.issued");
    }
}
