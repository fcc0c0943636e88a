//! Webhook metrics: `outboxd_webhook_requests_total{route, class}` (the
//! answer's status class, or `timeout` / `error` when none came) and
//! `outboxd_webhook_paused{route}` (1 while an endpoint's 410 Gone holds
//! the route: the alert to page on).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    class: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteLabel {
    route: String,
}

#[derive(Debug, Clone, Default)]
pub struct WebhookMetrics {
    requests: Family<RequestLabels, Counter>,
    paused: Family<RouteLabel, Gauge>,
}

impl WebhookMetrics {
    /// Registers `outboxd_webhook_*` into `registry` (prefix `outboxd`).
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("webhook");
        r.register(
            "requests",
            "Webhook requests by route and answer class (2xx, 3xx, 4xx, 5xx, timeout, error)",
            self.requests.clone(),
        );
        r.register(
            "paused",
            "1 while the route's endpoint answered 410 Gone and it waits for `outboxd route resume`",
            self.paused.clone(),
        );
    }

    pub fn request(&self, route: &str, class: &'static str) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.to_string(),
                class,
            })
            .inc();
    }

    /// Requests of `route` answered with `class` so far.
    pub fn requests(&self, route: &str, class: &'static str) -> u64 {
        self.requests
            .get(&RequestLabels {
                route: route.to_string(),
                class,
            })
            .map_or(0, |c| c.get())
    }

    pub fn set_paused(&self, route: &str, paused: bool) {
        self.paused
            .get_or_create(&RouteLabel {
                route: route.to_string(),
            })
            .set(i64::from(paused));
    }

    /// Whether `route` is paused, as this process last saw it.
    pub fn is_paused(&self, route: &str) -> bool {
        self.paused
            .get(&RouteLabel {
                route: route.to_string(),
            })
            .is_some_and(|g| g.get() == 1)
    }
}
