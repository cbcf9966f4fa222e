//! TLS for the S3 and admin listeners (rustls), with certificates reloaded in place.
//!
//! A [`Tls`] holds the certificate chain and key a listener presents. [`Tls::reload`] reads the
//! files again and swaps them in: handshakes after it present the new certificate, connections
//! already open keep the one they agreed on (nothing is dropped). A reload that fails (missing
//! file, bad PEM, a key that does not match the certificate) leaves the old certificate in
//! place and says why.
//!
//! `--tls self-signed` makes a certificate on first start, kept in `<data-dir>/tls/` (the key
//! mode 0600, the certificate 0644) and reused afterwards, for `localhost`, `127.0.0.1`, `::1` and the names given.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// How long a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a listener's certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsSource {
    /// PEM files: the certificate chain (leaf first) and its private key.
    Files {
        /// Certificate chain.
        cert: PathBuf,
        /// Private key (PKCS#8, PKCS#1 or SEC1).
        key: PathBuf,
    },
    /// A self-signed certificate made on first use in `dir` (`cert.pem`, `key.pem`).
    SelfSigned {
        /// Where it is kept.
        dir: PathBuf,
        /// Extra DNS names or IP addresses it is for (besides localhost and loopback).
        names: Vec<String>,
    },
}

impl TlsSource {
    /// The certificate and key files this source reads.
    pub fn files(&self) -> (PathBuf, PathBuf) {
        match self {
            Self::Files { cert, key } => (cert.clone(), key.clone()),
            Self::SelfSigned { dir, .. } => (dir.join("cert.pem"), dir.join("key.pem")),
        }
    }
}

/// Errors of loading a certificate.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The files do not hold a usable certificate and key.
    #[error("{0}")]
    Invalid(String),
}

struct Resolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Resolver")
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.current.read()))
    }
}

/// A listener's TLS configuration, reloadable.
#[derive(Clone)]
pub struct Tls {
    source: TlsSource,
    resolver: Arc<Resolver>,
    acceptor: tokio_rustls::TlsAcceptor,
    provider: Arc<CryptoProvider>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("source", &self.source).finish()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

impl Tls {
    /// Loads (for `SelfSigned`, first makes if missing) the certificate and key.
    pub fn load(source: TlsSource) -> Result<Self, TlsError> {
        if let TlsSource::SelfSigned { dir, names } = &source {
            ensure_self_signed(dir, names)?;
        }
        let provider = provider();
        let key = read_certified(&source, &provider)?;
        let resolver = Arc::new(Resolver { current: RwLock::new(Arc::new(key)) });
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Invalid(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&resolver) as Arc<dyn ResolvesServerCert>);
        // S3 clients speak HTTP/1.1.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        Ok(Self { source, resolver, acceptor, provider })
    }

    /// Reads the files again and presents the new certificate to new connections. On error
    /// the old certificate stays.
    pub fn reload(&self) -> Result<String, TlsError> {
        let key = read_certified(&self.source, &self.provider)?;
        let fp = fingerprint(&key.cert[0]);
        *self.resolver.current.write() = Arc::new(key);
        Ok(fp)
    }

    /// SHA-256 fingerprint of the certificate presented now (`AB:CD:…`).
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.resolver.current.read().cert[0])
    }

    /// End of validity (notAfter) of the certificate presented now, unix seconds; `None` if
    /// it cannot be parsed (rustls accepted it, so this is not expected).
    pub fn not_after(&self) -> Option<i64> {
        let current = Arc::clone(&self.resolver.current.read());
        let (_, cert) = x509_parser::parse_x509_certificate(current.cert[0].as_ref()).ok()?;
        Some(cert.validity().not_after.timestamp())
    }

    /// Where the certificate comes from.
    pub fn source(&self) -> &TlsSource {
        &self.source
    }

    /// The acceptor for incoming connections.
    pub fn acceptor(&self) -> &tokio_rustls::TlsAcceptor {
        &self.acceptor
    }
}

/// SHA-256 of a certificate's DER, as colon-separated upper-case hex (what `openssl x509
/// -fingerprint -sha256` prints).
pub fn fingerprint(cert: &CertificateDer<'_>) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, cert.as_ref());
    d.as_ref().iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(":")
}

fn read_certified(source: &TlsSource, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let (cert_path, key_path) = source.files();
    let read = |p: &Path| std::fs::read(p).map_err(|e| TlsError::Io { path: p.into(), source: e });
    let cert_pem = read(&cert_path)?;
    let key_pem = read(&key_path)?;
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&cert_pem).collect::<Result<_, _>>().map_err(|e| {
            TlsError::Invalid(format!("{}: not a PEM certificate chain: {e}", cert_path.display()))
        })?;
    if certs.is_empty() {
        return Err(TlsError::Invalid(format!(
            "{}: no certificate in it (expected -----BEGIN CERTIFICATE-----)",
            cert_path.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        TlsError::Invalid(format!(
            "{}: no private key in it (PKCS#8, PKCS#1 or SEC1 PEM): {e}",
            key_path.display()
        ))
    })?;
    let certified = CertifiedKey::from_der(certs, key, provider).map_err(|e| {
        TlsError::Invalid(format!(
            "{} and {}: {e} (is the key the certificate's?)",
            cert_path.display(),
            key_path.display()
        ))
    })?;
    Ok(certified)
}

/// Makes `dir/cert.pem` and `dir/key.pem` (a self-signed certificate for localhost, the
/// loopback addresses and `names`) unless both exist. The key is written mode 0600, the
/// certificate last, so a crash in between leaves no certificate without its key.
fn ensure_self_signed(dir: &Path, names: &[String]) -> Result<(), TlsError> {
    let cert_path = dir.join("cert.pem");
    let key_path = dir.join("key.pem");
    if cert_path.exists() && key_path.exists() {
        return Ok(());
    }
    let io = |path: &Path| {
        let path = path.to_owned();
        move |e| TlsError::Io { path, source: e }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut all: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    for n in names {
        if !all.contains(n) {
            all.push(n.clone());
        }
    }
    let key = rcgen::KeyPair::generate().map_err(|e| TlsError::Invalid(e.to_string()))?;
    let mut params =
        rcgen::CertificateParams::new(all).map_err(|e| TlsError::Invalid(e.to_string()))?;
    params.distinguished_name.push(rcgen::DnType::CommonName, "blindfold gateway");
    params.not_before = time::OffsetDateTime::now_utc() - time::Duration::days(1);
    params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(3650);
    let cert = params.self_signed(&key).map_err(|e| TlsError::Invalid(e.to_string()))?;
    write_file(&key_path, key.serialize_pem().as_bytes(), 0o600).map_err(io(&key_path))?;
    // The certificate is public: clients under other users must be able to read it.
    write_file(&cert_path, cert.pem().as_bytes(), 0o644).map_err(io(&cert_path))?;
    Ok(())
}

/// Writes a file through a temporary name with `mode`, fsynced, renamed into place.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(parent) = path.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// Reloads every listener's certificate on each SIGHUP, until the process ends; prints and
/// logs what happened (a failed reload keeps the old certificate).
pub fn reload_on_sighup(tls: Vec<Tls>) -> std::io::Result<()> {
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            for t in &tls {
                let (cert, _) = t.source().files();
                match t.reload() {
                    Ok(fp) => tracing::info!(
                        "SIGHUP: reloaded the certificate {} (SHA-256 {fp})",
                        cert.display()
                    ),
                    Err(e) => tracing::warn!(
                        "SIGHUP: certificate not reloaded, keeping the old one ({}): {e}",
                        cert.display()
                    ),
                }
            }
        }
    });
    Ok(())
}
