//! TLS to Postgres, libpq's way: `sslmode`, `sslrootcert`, `sslcert` and
//! `sslkey` from `database.url` (else `PGSSLMODE`, `PGSSLROOTCERT`,
//! `PGSSLCERT`, `PGSSLKEY`), read once for every connection outboxd opens:
//! the sqlx pools and the WAL relay's replication connection. The files are
//! checked before the first connection, so a missing or mismatched one is
//! named, and a handshake that fails is explained with its fix.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls;

/// libpq's `sslmode`: what a connection encrypts and what it verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plaintext only.
    Disable,
    /// Plaintext, TLS only if the server demands it (sqlx connects in
    /// plaintext).
    Allow,
    /// TLS when the server offers it, with no verification; plaintext
    /// otherwise. libpq's and outboxd's default.
    Prefer,
    /// TLS or no connection; the certificate is not verified unless
    /// `sslrootcert` is given, which makes it `verify-ca` (as in libpq).
    Require,
    /// TLS, and the server's certificate chains to a trusted CA.
    VerifyCa,
    /// `verify-ca`, and the certificate names the host connected to.
    VerifyFull,
}

impl SslMode {
    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether a connection in this mode verifies the server's chain.
    pub fn verifies(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyFull)
    }
}

/// The TLS settings of one `database.url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTls {
    /// The effective mode: `require` with an `sslrootcert` is `verify-ca`.
    pub mode: SslMode,
    pub root_cert: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// A TLS setting or handshake that cannot work, with the URL (password
/// hidden), the reason and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("database.url `{url}`: {reason}; {fix}")]
pub struct TlsProblem {
    pub url: String,
    pub reason: String,
    pub fix: String,
}

impl TlsProblem {
    fn new(url: &str, reason: impl Into<String>, fix: impl Into<String>) -> Self {
        TlsProblem {
            url: crate::db_url::redact_url(url),
            reason: reason.into(),
            fix: fix.into(),
        }
    }
}

impl PgTls {
    /// Reads the TLS parameters of a `postgres://` URL (the environment
    /// fills what the URL leaves out). An unknown `sslmode` is refused.
    pub fn from_url(url: &str) -> Result<Self, TlsProblem> {
        let parsed = url::Url::parse(url).ok();
        let param = |key: &str, env: &str| {
            parsed
                .as_ref()
                .and_then(|u| u.query_pairs().find(|(k, _)| k == key))
                .map(|(_, v)| v.into_owned())
                .or_else(|| std::env::var(env).ok())
                .filter(|v| !v.is_empty())
        };
        let mode = match param("sslmode", "PGSSLMODE") {
            None => SslMode::Prefer,
            Some(text) => SslMode::parse(&text).ok_or_else(|| {
                TlsProblem::new(
                    url,
                    format!("sslmode `{text}` is unknown"),
                    "use disable, allow, prefer, require, verify-ca or verify-full",
                )
            })?,
        };
        let root_cert = param("sslrootcert", "PGSSLROOTCERT").map(PathBuf::from);
        let mode = match (mode, &root_cert) {
            (SslMode::Require, Some(_)) => SslMode::VerifyCa,
            (mode, _) => mode,
        };
        Ok(PgTls {
            mode,
            root_cert,
            cert: param("sslcert", "PGSSLCERT").map(PathBuf::from),
            key: param("sslkey", "PGSSLKEY").map(PathBuf::from),
        })
    }

    /// Checks the files the URL names before any connection uses them:
    /// each exists and holds PEM of the right kind, `sslcert` and `sslkey`
    /// come together, and the key belongs to the certificate.
    pub fn check_files(&self, url: &str) -> Result<(), TlsProblem> {
        if self.mode == SslMode::Disable {
            return Ok(());
        }
        if let Some(path) = &self.root_cert {
            let certs = read_certs(url, "sslrootcert", path)?;
            let mut roots = rustls::RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(TlsProblem::new(
                    url,
                    format!(
                        "sslrootcert {} holds no CA certificate rustls can use",
                        path.display()
                    ),
                    "point sslrootcert at the PEM file of the CA that signed the server's certificate",
                ));
            }
        }
        match (&self.cert, &self.key) {
            (None, None) => Ok(()),
            (Some(_), None) | (None, Some(_)) => Err(TlsProblem::new(
                url,
                "sslcert and sslkey must be given together",
                "add the missing one to database.url (the client certificate and its private key)",
            )),
            (Some(cert), Some(key)) => {
                let chain = read_certs(url, "sslcert", cert)?;
                let key_der = read_key(url, key)?;
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                rustls::sign::CertifiedKey::from_der(chain, key_der, &provider)
                    .map(|_| ())
                    .map_err(|e| match e {
                        rustls::Error::InconsistentKeys(_) => TlsProblem::new(
                            url,
                            format!(
                                "sslkey {} does not belong to sslcert {} ({e})",
                                key.display(),
                                cert.display()
                            ),
                            "give the private key the client certificate was issued for",
                        ),
                        e => TlsProblem::new(
                            url,
                            format!(
                                "sslcert {} with sslkey {} cannot be used ({e})",
                                cert.display(),
                                key.display()
                            ),
                            "give an X.509 v3 client certificate in PEM and its private key",
                        ),
                    })
            }
        }
    }

    /// The replication client's TLS settings, the same as the pools'.
    pub fn replication(&self) -> pgwire_replication::TlsConfig {
        use pgwire_replication::config::SslMode as Wire;
        let mode = match self.mode {
            SslMode::Disable | SslMode::Allow => Wire::Disable,
            SslMode::Prefer => Wire::Prefer,
            SslMode::Require => Wire::Require,
            SslMode::VerifyCa => Wire::VerifyCa,
            SslMode::VerifyFull => Wire::VerifyFull,
        };
        let mut tls = pgwire_replication::TlsConfig {
            mode,
            ..pgwire_replication::TlsConfig::disabled()
        };
        tls.ca_pem_path = self.root_cert.clone();
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            tls = tls.with_client_cert(cert.clone(), key.clone());
        }
        tls
    }
}

fn read_certs(
    url: &str,
    param: &str,
    path: &Path,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, TlsProblem> {
    use rustls::pki_types::pem::PemObject;
    let unreadable = |e: &dyn std::fmt::Display| {
        TlsProblem::new(
            url,
            format!("{param} {} cannot be read ({e})", path.display()),
            format!("point {param} at a readable PEM file (or remove it)"),
        )
    };
    let bytes = std::fs::read(path).map_err(|e| unreadable(&e))?;
    let certs = rustls::pki_types::CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| unreadable(&e))?;
    if certs.is_empty() {
        return Err(TlsProblem::new(
            url,
            format!("{param} {} holds no PEM certificate", path.display()),
            format!("point {param} at a file with -----BEGIN CERTIFICATE----- blocks"),
        ));
    }
    Ok(certs)
}

fn read_key(
    url: &str,
    path: &Path,
) -> Result<rustls::pki_types::PrivateKeyDer<'static>, TlsProblem> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::PrivateKeyDer::from_pem_file(path).map_err(|e| {
        TlsProblem::new(
            url,
            format!(
                "sslkey {} holds no usable private key ({e})",
                path.display()
            ),
            "point sslkey at the client certificate's private key in PEM (PKCS#8, PKCS#1 or SEC1)",
        )
    })
}

/// Explains a failed connection whose cause is TLS: the server's
/// certificate failed verification, the server refused TLS, or a client
/// certificate could not be used. `None` for every other error.
pub fn explain(url: &str, e: &sqlx::Error) -> Option<TlsProblem> {
    let rustls_error = match e {
        sqlx::Error::Tls(inner) => inner.downcast_ref::<rustls::Error>(),
        sqlx::Error::Io(io) => io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>()),
        _ => None,
    };
    if let Some(err) = rustls_error {
        return Some(explain_rustls(url, err));
    }
    match e {
        sqlx::Error::Tls(inner) if inner.to_string().contains("does not support TLS") => {
            Some(refused_tls(url))
        }
        sqlx::Error::Tls(inner) => Some(TlsProblem::new(
            url,
            format!("TLS set-up failed ({inner})"),
            "check sslmode, sslrootcert, sslcert and sslkey in database.url",
        )),
        _ => None,
    }
}

/// The same, for the replication client's error text.
pub fn explain_text(url: &str, text: &str) -> TlsProblem {
    if text.contains("SSLRequest rejected") {
        return refused_tls(url);
    }
    let fix = if text.contains("not valid for name") || text.contains("NotValidForName") {
        NAME_FIX
    } else if text.contains("UnknownIssuer") || text.contains("unknown issuer") {
        ISSUER_FIX
    } else if text.contains("xpired") {
        EXPIRED_FIX
    } else if text.contains("is an IP address") {
        "sslmode=verify-full checks the host name: write the host as the name in the server's certificate, or use verify-ca"
    } else {
        "check sslmode, sslrootcert, sslcert and sslkey in database.url"
    };
    TlsProblem::new(url, format!("TLS failed ({text})"), fix)
}

fn refused_tls(url: &str) -> TlsProblem {
    TlsProblem::new(
        url,
        "the server does not accept TLS",
        "turn ssl on in the server's postgresql.conf, or lower sslmode to prefer (TLS when offered) or disable",
    )
}

const NAME_FIX: &str = "connect with a host name the certificate lists, or use sslmode=verify-ca, which checks the CA but not the name";
const ISSUER_FIX: &str = "set sslrootcert to the CA that signed the server's certificate (verify-ca and verify-full trust Mozilla's roots and sslrootcert)";
const EXPIRED_FIX: &str =
    "renew the server's certificate (its ssl_cert_file), or check this machine's clock";

fn explain_rustls(url: &str, err: &rustls::Error) -> TlsProblem {
    use rustls::CertificateError as C;
    let reason = format!("the TLS handshake failed: {err}");
    let fix = match err {
        rustls::Error::InvalidCertificate(cert) => match cert {
            C::NotValidForName | C::NotValidForNameContext { .. } => NAME_FIX,
            C::UnknownIssuer => ISSUER_FIX,
            C::Expired
            | C::ExpiredContext { .. }
            | C::NotValidYet
            | C::NotValidYetContext { .. } => EXPIRED_FIX,
            _ => "the server's certificate is not acceptable: check it, or the CA in sslrootcert",
        },
        rustls::Error::InconsistentKeys(_) => {
            "give the private key (sslkey) the client certificate (sslcert) was issued for"
        }
        rustls::Error::AlertReceived(_) => {
            "the server refused the handshake: check the client certificate (sslcert, sslkey) and the server's log"
        }
        _ => "check sslmode, sslrootcert, sslcert and sslkey in database.url",
    };
    TlsProblem::new(url, reason, fix)
}

/// The application name of outboxd's pool connections, unless the URL
/// sets its own; the replication connection's is `outboxd-relay SLOT`.
pub const APPLICATION_NAME: &str = "outboxd";

/// outboxd's connections to one database with the same TLS state, as
/// `pg_stat_ssl` shows them: every process's pools and WAL readers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConnectionTls {
    /// `outboxd` (pools) or `outboxd-relay SLOT` (a WAL relay's
    /// replication connection), or the URL's own `application_name`.
    pub application_name: String,
    pub encrypted: bool,
    /// The TLS version (`TLSv1.3`), when encrypted.
    pub version: Option<String>,
    pub connections: i64,
}

/// [`connection_tls`] for either database: `None` on SQLite, which has no
/// connections to encrypt.
pub async fn connections(db: &crate::store::Db) -> Result<Option<Vec<ConnectionTls>>, sqlx::Error> {
    match db {
        crate::store::Db::Postgres(pool) => connection_tls(pool).await.map(Some),
        crate::store::Db::Sqlite(_) => Ok(None),
    }
}

/// outboxd's connections to the current database, by application name and
/// TLS state: every `outboxd*` one, and those with the asking connection's
/// own name when the URL sets one (Postgres only).
pub async fn connection_tls(pool: &sqlx::PgPool) -> Result<Vec<ConnectionTls>, sqlx::Error> {
    use sqlx::Row;
    let rows = sqlx::query(
        "SELECT a.application_name, coalesce(s.ssl, false), s.version, count(*) \
           FROM pg_stat_activity a LEFT JOIN pg_stat_ssl s ON s.pid = a.pid \
          WHERE a.datname = current_database() \
            AND (a.application_name LIKE 'outboxd%' \
                 OR a.application_name = current_setting('application_name')) \
          GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(ConnectionTls {
                application_name: r.try_get(0)?,
                encrypted: r.try_get(1)?,
                version: r.try_get(2)?,
                connections: r.try_get(3)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_files_come_from_the_url() {
        let t = PgTls::from_url(
            "postgres://u@db/x?sslmode=verify-full&sslrootcert=/ca.pem&sslcert=/c.pem&sslkey=/k.pem",
        )
        .expect("parses");
        assert_eq!(t.mode, SslMode::VerifyFull);
        assert_eq!(t.root_cert.as_deref(), Some(Path::new("/ca.pem")));
        let wire = t.replication();
        assert!(wire.mode.verifies_hostname());
        assert!(wire.is_mtls());
        // libpq: require with a root certificate verifies the chain.
        let t = PgTls::from_url("postgres://u@db/x?sslmode=require&sslrootcert=/ca.pem")
            .expect("parses");
        assert_eq!(t.mode, SslMode::VerifyCa);
        let e = PgTls::from_url("postgres://u:secret@db/x?sslmode=sometimes").expect_err("refused");
        assert!(e.to_string().contains("sslmode `sometimes`"), "{e}");
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    #[test]
    fn missing_and_mismatched_files_are_named() {
        let url = "postgres://u:pw@db/x?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem";
        let e = PgTls::from_url(url)
            .expect("parses")
            .check_files(url)
            .expect_err("missing file");
        let text = e.to_string();
        assert!(
            text.contains("sslrootcert /nonexistent/ca.pem cannot be read")
                && text.contains("u:***@db"),
            "{text}"
        );
        let url = "postgres://u@db/x?sslmode=require&sslcert=/c.pem";
        let e = PgTls::from_url(url)
            .expect("parses")
            .check_files(url)
            .expect_err("cert without key");
        assert!(e.to_string().contains("together"), "{e}");
    }
}
