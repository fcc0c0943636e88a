//! `[telemetry]`: where outboxd sends its OpenTelemetry traces, and the CA
//! that signs an https collector's certificate. Off unless an endpoint is
//! set here or in `OTEL_EXPORTER_OTLP_ENDPOINT`.

use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP base URL of a collector, for example
    /// `http://127.0.0.1:4318` or `https://otel.example.com:4318`; spans are
    /// posted to `/v1/traces` under it. An https endpoint's certificate and
    /// host name are verified against Mozilla's roots and `ca_file`.
    /// Unset, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is used; with none of them, no spans
    /// are made.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of every span; unset, `OTEL_SERVICE_NAME`, or
    /// `outboxd`.
    #[serde(default)]
    pub service_name: Option<String>,
    /// A PEM file of CA certificates added to the roots an https
    /// collector's certificate is verified against (a private CA); unset,
    /// `OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE` or
    /// `OTEL_EXPORTER_OTLP_CERTIFICATE`, or Mozilla's roots alone. Read at
    /// start: a missing file, or one without a certificate, stops it.
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
}

/// Why an OTLP endpoint cannot be used; `None` when it can. The exporter
/// speaks HTTP/1.1 (protobuf bodies), in the clear for `http://` and over
/// TLS for `https://`.
pub fn endpoint_problem(url: &str) -> Option<String> {
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return Some(format!(
            "`{url}` is not an http:// or https:// URL; write it like http://127.0.0.1:4318 \
             or https://otel.example.com:4318"
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
    fn only_http_or_https_endpoints_with_a_host_are_accepted() {
        assert_eq!(endpoint_problem("http://127.0.0.1:4318"), None);
        assert_eq!(endpoint_problem("http://collector:4318/base"), None);
        assert_eq!(endpoint_problem("https://otel.example.com"), None);
        assert!(endpoint_problem("127.0.0.1:4318").is_some_and(|m| m.contains("http://")));
        assert!(endpoint_problem("http://").is_some());
        assert!(endpoint_problem("https://").is_some());
        assert!(endpoint_problem("grpc://collector:4317").is_some());
    }
}
