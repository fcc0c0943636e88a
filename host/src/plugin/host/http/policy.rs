//! Who a consumer plugin may call: the allow-list check (scheme, host,
//! port) made before anything else, and the address check made on every
//! address the host resolved, before it connects.

use std::net::IpAddr;

use http::Uri;
use http::header::HeaderName;
use outboxd_core::config::{HttpLimits, OutboundHost, OutboundScheme, PluginSpec};

use crate::plugin::error::PluginError;

/// A consumer plugin's outbound policy, from its `[[plugins]]` entry.
#[derive(Debug, Clone)]
pub struct OutboundPolicy {
    /// `plugins[NAME].allowed_outbound_hosts`, for refusals.
    pub(crate) key: String,
    pub(crate) hosts: Vec<OutboundHost>,
    pub(crate) limits: HttpLimits,
    pub(crate) header: HeaderName,
    /// Roots trusted besides Mozilla's webpki roots (a webhook's
    /// `ca_file`); a plugin's policy has none.
    pub(crate) extra_roots: Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>>,
}

/// Where an allowed request goes: the listed entry it matched.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) entry: OutboundHost,
    /// The path and query, `/` when the guest sent none.
    pub(crate) path: String,
}

impl OutboundPolicy {
    /// `spec`'s policy; an entry that does not parse is refused (the config
    /// check refuses it first, this covers specs built in code).
    pub fn from_spec(spec: &PluginSpec) -> Result<Self, PluginError> {
        let key = format!("plugins[{}].allowed_outbound_hosts", spec.name);
        let hosts = spec
            .allowed_outbound_hosts
            .iter()
            .map(|h| {
                OutboundHost::parse(h).map_err(|e| PluginError::Invalid(format!("{key}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let header =
            HeaderName::from_bytes(spec.http.idempotency_header.as_bytes()).map_err(|_| {
                PluginError::Invalid(format!(
                    "plugins[{}].http.idempotency_header: `{}` is not a header name",
                    spec.name, spec.http.idempotency_header
                ))
            })?;
        Ok(Self {
            key,
            hosts,
            limits: spec.http.clone(),
            header,
            extra_roots: Vec::new(),
        })
    }

    /// The policy of a webhook route: its one URL's scheme, host and port,
    /// with the same address rules as a plugin's (a private or loopback
    /// address only when the URL names it literally), its timeout and
    /// response cap, and its extra roots.
    pub(crate) fn for_webhook(
        key: String,
        entry: OutboundHost,
        limits: HttpLimits,
        extra_roots: Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>>,
    ) -> Self {
        Self {
            key,
            hosts: vec![entry],
            limits,
            header: HeaderName::from_static("webhook-id"),
            extra_roots,
        }
    }

    /// Whether the plugin may call out at all.
    pub fn is_enabled(&self) -> bool {
        !self.hosts.is_empty()
    }

    pub fn limits(&self) -> &HttpLimits {
        &self.limits
    }

    /// The listed entry `uri` falls under, or why not: checked before any
    /// name is resolved or connection opened.
    pub(crate) fn admit(&self, uri: &Uri) -> Result<Target, String> {
        let scheme = match uri.scheme_str().map(str::to_ascii_lowercase).as_deref() {
            Some("http") => OutboundScheme::Http,
            Some("https") => OutboundScheme::Https,
            other => {
                return Err(format!(
                    "{uri}: scheme {other:?} is not http or https; {} lists the hosts this plugin may call",
                    self.key
                ));
            }
        };
        let authority = uri.authority().map(|a| a.as_str()).unwrap_or("");
        if authority.contains('@') {
            return Err(format!("{uri}: user information in a URL is refused"));
        }
        let host = uri
            .host()
            .unwrap_or("")
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        let port = uri.port_u16().unwrap_or(scheme.default_port());
        let found = self
            .hosts
            .iter()
            .find(|h| h.scheme == scheme && h.host == host && h.port == port);
        let Some(entry) = found else {
            return Err(format!(
                "{uri} ({}://{host}:{port}) is not in {}; add \"{}://{host}:{port}\" there to allow it",
                scheme.as_str(),
                self.key,
                scheme.as_str()
            ));
        };
        Ok(Target {
            entry: entry.clone(),
            path: uri
                .path_and_query()
                .map(|p| p.as_str().to_string())
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "/".into()),
        })
    }

    /// The metrics' host label of `url`: the listed entry it falls under,
    /// or `unlisted` (never a name the plugin chose).
    pub(crate) fn host_label(&self, url: &str) -> String {
        url.parse::<Uri>()
            .ok()
            .and_then(|u| self.admit(&u).ok())
            .map(|t| t.entry.to_string())
            .unwrap_or_else(|| "unlisted".into())
    }

    /// Whether the host may connect to `ip` for `entry`: a loopback,
    /// private, link-local, unspecified, multicast or otherwise special
    /// address only when the entry names that very address.
    pub(crate) fn check_address(&self, entry: &OutboundHost, ip: IpAddr) -> Result<(), String> {
        if !is_special(ip) || entry.ip().map(canonical) == Some(canonical(ip)) {
            return Ok(());
        }
        Err(format!(
            "{entry} resolved to {ip}, a loopback, private, link-local or reserved address; the host connects to such an address only when {} names it literally (e.g. \"{}://{}:{}\")",
            self.key,
            entry.scheme.as_str(),
            match ip {
                IpAddr::V6(_) => format!("[{ip}]"),
                IpAddr::V4(_) => ip.to_string(),
            },
            entry.port
        ))
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// Addresses a plugin may reach only when listed literally.
pub(crate) fn is_special(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
                || (a == 192 && b == 0 && v4.octets()[2] == 0) // IETF protocol assignments
                || (a == 198 && (18..20).contains(&b)) // benchmarking
                || a >= 240 // reserved
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link-local
                || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
                || (s[0] == 0x64 && s[1] == 0xff9b) // NAT64: an IPv4 address inside
                || s[0] == 0x2002 // 6to4: an IPv4 address inside
                || (s[0] == 0x2001 && s[1] == 0xdb8) // documentation
                || (s[..6] == [0; 6]) // IPv4-compatible and other ::/96
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_addresses_in_every_spelling() {
        for ip in [
            "127.0.0.1",
            "127.1.2.3",
            "10.0.0.1",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "100.64.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "::127.0.0.1",
        ] {
            assert!(
                is_special(ip.parse().expect("parses")),
                "{ip} is not special"
            );
        }
        for ip in ["93.184.216.34", "2606:2800:220:1::1", "8.8.8.8"] {
            assert!(!is_special(ip.parse().expect("parses")), "{ip} is special");
        }
    }

    #[test]
    fn a_mapped_address_matches_its_literal_entry() {
        let mut spec = PluginSpec::new("p", "p.wasm");
        spec.allowed_outbound_hosts = vec![
            "http://127.0.0.1:8080".into(),
            "http://localhost:8080".into(),
        ];
        let policy = OutboundPolicy::from_spec(&spec).expect("parses");
        let literal = &policy.hosts[0];
        let name = &policy.hosts[1];
        assert!(
            policy
                .check_address(literal, "::ffff:127.0.0.1".parse().expect("parses"))
                .is_ok()
        );
        let e = policy
            .check_address(name, "127.0.0.1".parse().expect("parses"))
            .expect_err("refused");
        assert!(e.contains("plugins[p].allowed_outbound_hosts"), "{e}");
    }

    #[test]
    fn admits_only_the_listed_scheme_host_and_port() {
        let mut spec = PluginSpec::new("p", "p.wasm");
        spec.allowed_outbound_hosts = vec!["https://api.example.com".into()];
        let policy = OutboundPolicy::from_spec(&spec).expect("parses");
        let ok: Uri = "https://API.example.com/charges?x=1"
            .parse()
            .expect("parses");
        assert_eq!(policy.admit(&ok).expect("admitted").path, "/charges?x=1");
        for bad in [
            "http://api.example.com/",
            "https://api.example.com:8443/",
            "https://api.example.com.evil.test/",
            "https://evil.test/",
            "https://user@api.example.com/",
        ] {
            let e = policy
                .admit(&bad.parse().expect("parses"))
                .expect_err("refused");
            assert!(
                e.contains(bad.trim_end_matches('/')) || e.contains("user information"),
                "{e}"
            );
        }
    }
}
