//! Which database a URL names, and the URL as errors and logs may show it
//! (its password masked).

/// The database kinds outboxd runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DbKind {
    Postgres,
    Sqlite,
}

/// A URL that names neither database; it holds the URL already redacted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsupported database URL `{0}`: use postgres://USER@HOST/DB or sqlite://PATH (sqlite::memory: for a throwaway store)"
)]
pub struct UnsupportedUrl(pub String);

impl DbKind {
    /// The database's name in traces (OpenTelemetry's `db.system.name`).
    pub fn system_name(self) -> &'static str {
        match self {
            DbKind::Postgres => "postgresql",
            DbKind::Sqlite => "sqlite",
        }
    }

    pub fn from_url(url: &str) -> Result<Self, UnsupportedUrl> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(DbKind::Postgres)
        } else if url.starts_with("sqlite:") {
            Ok(DbKind::Sqlite)
        } else {
            Err(UnsupportedUrl(redact_url(url)))
        }
    }
}

/// The URL with its password (if any) replaced by `***`, for errors and
/// logs: `postgres://user:***@host/db`, and `?password=***` (or any query
/// parameter whose name says password, secret or token).
pub fn redact_url(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut out = match (base.find("://"), base.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &base[scheme + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &base[..scheme + 3], &base[at..]),
                None => base.to_string(),
            }
        }
        _ => base.to_string(),
    };
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _)) if crate::config::is_secret(k) => format!("{k}=***"),
                _ => p.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}
