//! Certificates made for a test by the `openssl` CLI: a private CA and a
//! server certificate it signed, and a rustls acceptor that serves it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Runs `openssl` with `args` in `dir`, failing the test with how to get it.
fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run the openssl CLI ({e}); install it (apt-get install openssl) to make the test's certificates")
        });
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`ca.pem`) and a certificate it signed for 127.0.0.1 and localhost
/// (`server.pem`, `server.key`), P-256, valid for two days, in a new
/// directory.
pub struct TestCa {
    pub dir: tempfile::TempDir,
}

impl TestCa {
    pub fn new() -> Self {
        Self::for_names("IP:127.0.0.1,DNS:localhost")
    }

    /// The server certificate names only `names` (its subjectAltName, as
    /// `DNS:localhost`).
    pub fn for_names(names: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=outboxd test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(d, &ca);
        let mut csr = vec!["req"];
        csr.extend(ec);
        csr.extend([
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]);
        openssl(d, &csr);
        std::fs::write(
            d.join("server.ext"),
            format!(
                "subjectAltName={names}\nbasicConstraints=critical,CA:FALSE\n\
                 keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
            ),
        )
        .expect("server.ext");
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "server.ext",
            ],
        );
        Self { dir }
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let pem = std::fs::read(self.dir.path().join("server.pem")).expect("server.pem");
        let chain = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .expect("server.pem certificates");
        let key = std::fs::read(self.dir.path().join("server.key")).expect("server.key");
        let key = PrivateKeyDer::from_pem_slice(&key).expect("server.key");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS 1.2 and 1.3")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("the server certificate and key");
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }
}
