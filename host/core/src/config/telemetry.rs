//! `[telemetry]`: where outboxd sends its OpenTelemetry traces. Off unless
//! an endpoint is set here or in `OTEL_EXPORTER_OTLP_ENDPOINT`.

use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP base URL of a collector, for example
    /// `http://127.0.0.1:4318`; spans are posted to `/v1/traces` under it.
    /// Unset, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is used; with none of them, no spans
    /// are made.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of every span; unset, `OTEL_SERVICE_NAME`, or
    /// `outboxd`.
    #[serde(default)]
    pub service_name: Option<String>,
}

/// Why an OTLP endpoint cannot be used; `None` when it can. The exporter
/// speaks plain HTTP/1.1 (protobuf bodies): a collector next to outboxd
/// forwards over TLS if the backend needs it.
pub fn endpoint_problem(url: &str) -> Option<String> {
    let Some(rest) = url.strip_prefix("http://") else {
        if url.starts_with("https://") {
            return Some(format!(
                "`{url}`: outboxd exports over plain http only; run an OpenTelemetry Collector \
                 next to it (http://127.0.0.1:4318) and let the collector forward over TLS"
            ));
        }
        return Some(format!(
            "`{url}` is not an http:// URL; write it like http://127.0.0.1:4318"
        ));
    };
    let authority = rest.split('/').next().unwrap_or("");
    if authority.is_empty() || authority.contains('@') {
        return Some(format!(
            "`{url}` names no host (or has credentials in it); write it like http://127.0.0.1:4318"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_endpoints_with_a_host_are_accepted() {
        assert_eq!(endpoint_problem("http://127.0.0.1:4318"), None);
        assert_eq!(endpoint_problem("http://collector:4318/base"), None);
        assert!(
            endpoint_problem("https://otel.example.com").is_some_and(|m| m.contains("Collector"))
        );
        assert!(endpoint_problem("127.0.0.1:4318").is_some_and(|m| m.contains("http://")));
        assert!(endpoint_problem("http://").is_some());
    }
}
