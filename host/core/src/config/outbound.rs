//! Outbound HTTP for consumer plugins: `[[plugins]] allowed_outbound_hosts`
//! (who a plugin may call) and `[plugins.http]` (how much). Pure parsing;
//! the host enforces it in `plugin/host/http`.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use serde::Deserialize;

/// The scheme of an allowed host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutboundScheme {
    Http,
    Https,
}

impl OutboundScheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
        }
    }

    pub fn default_port(self) -> u16 {
        match self {
            Self::Http => 80,
            Self::Https => 443,
        }
    }
}

/// One `allowed_outbound_hosts` entry: `scheme://host[:port]`, the port
/// defaulting to the scheme's. The host is lowercase, an IPv6 literal
/// without its brackets.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OutboundHost {
    pub scheme: OutboundScheme,
    pub host: String,
    pub port: u16,
}

/// The shape every entry must have, for error messages.
pub const OUTBOUND_HOST_SHAPE: &str = "\"http://HOST[:PORT]\" or \"https://HOST[:PORT]\" (no path, query, user or wildcard), e.g. \"https://api.example.com\"";

impl OutboundHost {
    /// Parses one entry; the error says what is wrong (not which key).
    pub fn parse(s: &str) -> Result<Self, String> {
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| format!("`{s}` has no scheme"))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => OutboundScheme::Http,
            "https" => OutboundScheme::Https,
            other => return Err(format!("scheme `{other}` is not http or https")),
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#']) {
            return Err(format!("`{s}` has a path, query or fragment"));
        }
        if authority.contains('@') {
            return Err(format!("`{s}` has user information"));
        }
        if authority.contains('*') {
            return Err(format!("`{s}` has a wildcard; list each host"));
        }
        let (host, port) =
            split_host_port(authority).ok_or_else(|| format!("`{s}` has a bad host or port"))?;
        if host.is_empty() {
            return Err(format!("`{s}` has no host"));
        }
        let host = host.to_ascii_lowercase();
        if host.parse::<IpAddr>().is_err()
            && !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        {
            return Err(format!("`{host}` is not a host name or an IP address"));
        }
        Ok(Self {
            scheme,
            port: port.unwrap_or(scheme.default_port()),
            host,
        })
    }

    /// `host[:port]` as a Host header carries it: the port only when it
    /// is not the scheme's default, an IPv6 literal in brackets.
    pub fn authority(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == self.scheme.default_port() {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }

    /// The host as an IP address, when the entry names one literally.
    pub fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`; `None` on a bad port.
pub fn split_host_port(authority: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after {
            "" => Some((host, None)),
            p => Some((host, Some(p.strip_prefix(':')?.parse().ok()?))),
        };
    }
    match authority.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Some((h, Some(p.parse().ok()?))),
        Some(_) => None,
        None => Some((authority, None)),
    }
}

impl fmt::Display for OutboundHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        write!(f, "{}://{host}:{}", self.scheme.as_str(), self.port)
    }
}

/// `[plugins.http]`: the limits of a consumer plugin's outbound requests.
/// The call deadline (`limits.timeout`) still bounds the whole `handle`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpLimits {
    /// The header the host sets to the message id on every request.
    pub idempotency_header: String,
    /// Per request: connect, first byte, and between bytes.
    #[serde(deserialize_with = "super::duration::keys::http_request_timeout")]
    pub request_timeout: Duration,
    /// Largest request body the plugin may send.
    pub max_request_bytes: u64,
    /// Largest response body the host reads; a larger one fails the request.
    pub max_response_bytes: u64,
    /// Requests one message (one `handle` call) may send.
    pub max_requests_per_message: u32,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            idempotency_header: "Idempotency-Key".into(),
            request_timeout: Duration::from_secs(5),
            max_request_bytes: 1 << 20,
            max_response_bytes: 4 << 20,
            max_requests_per_message: 8,
        }
    }
}

impl HttpLimits {
    /// What is wrong with these limits, as (key under `[plugins.http]`, reason).
    pub fn problem(&self) -> Option<(&'static str, String)> {
        let h = &self.idempotency_header;
        if h.is_empty()
            || !h
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
        {
            return Some((
                "idempotency_header",
                format!(
                    "`{h}` is not a header name; use letters, digits, - and _ (default \"Idempotency-Key\")"
                ),
            ));
        }
        if self.request_timeout.is_zero() || self.request_timeout > Duration::from_secs(300) {
            return Some((
                "request_timeout",
                "is out of range; use \"1ms\" to \"300s\" (default \"5s\")".into(),
            ));
        }
        if self.max_request_bytes == 0 || self.max_response_bytes == 0 {
            return Some((
                "max_request_bytes",
                "max_request_bytes and max_response_bytes must be at least 1".into(),
            ));
        }
        if self.max_requests_per_message == 0 {
            return Some((
                "max_requests_per_message",
                "must be at least 1; to give a plugin no network, leave allowed_outbound_hosts empty".into(),
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_shapes() {
        let h = OutboundHost::parse("https://API.example.com").expect("parses");
        assert_eq!(
            (h.scheme, h.host.as_str(), h.port),
            (OutboundScheme::Https, "api.example.com", 443)
        );
        let h = OutboundHost::parse("http://127.0.0.1:8080/").expect("parses");
        assert_eq!((h.host.as_str(), h.port), ("127.0.0.1", 8080));
        let h = OutboundHost::parse("http://[::1]:9000").expect("parses");
        assert_eq!((h.host.as_str(), h.port), ("::1", 9000));
        assert_eq!(h.to_string(), "http://[::1]:9000");
    }

    #[test]
    fn refuses_everything_else() {
        for bad in [
            "api.example.com",
            "ftp://api.example.com",
            "https://api.example.com/charges",
            "https://api.example.com?x=1",
            "https://user@api.example.com",
            "https://*.example.com",
            "https://api.example.com:99999",
            "https://:443",
            "https://exa mple.com",
        ] {
            assert!(OutboundHost::parse(bad).is_err(), "{bad} was accepted");
        }
    }
}
