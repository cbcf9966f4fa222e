//! TLS on the gateway's listener: a real rustls client against a running gateway; self-signed
//! certificates made once; certificates reloaded for new connections without dropping open
//! ones; bad files refused with the old certificate kept; plain HTTP told to use HTTPS.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use blindfold_gateway::tls::{fingerprint, Tls, TlsSource};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common;

async fn start(tls: Tls) -> common::Running {
    common::Running::start(("AKIDTLSTEST", "tls-test-secret"), Some(tls)).await
}

/// Writes a new self-signed certificate for localhost/127.0.0.1 and its key to `cert`, `key`.
fn make_cert(cert: &Path, key: &Path) {
    let k = rcgen::KeyPair::generate().unwrap();
    let c = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
        .unwrap()
        .self_signed(&k)
        .unwrap();
    std::fs::write(cert, c.pem()).unwrap();
    std::fs::write(key, k.serialize_pem()).unwrap();
}

fn cert_of(path: &Path) -> CertificateDer<'static> {
    CertificateDer::from_pem_file(path).unwrap()
}

type Conn = tokio_rustls::client::TlsStream<TcpStream>;

/// A TLS connection trusting exactly `roots`.
async fn connect(addr: std::net::SocketAddr, roots: &[CertificateDer<'static>]) -> Conn {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r.clone()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(store)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
        .await
        .expect("handshake within 10 s")
        .expect("handshake")
}

/// The certificate the server presented on `conn`.
fn presented(conn: &Conn) -> String {
    fingerprint(&conn.get_ref().1.peer_certificates().unwrap()[0])
}

/// One unsigned request on a kept-alive connection; returns the status line and body.
async fn request(conn: &mut Conn, path: &str) -> (String, String) {
    conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (head, body) = common::read_response(conn, false).await;
    (head.lines().next().unwrap().to_owned(), String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn s3_over_tls_and_a_hint_for_plain_http() {
    let dir = tempfile::tempdir().unwrap();
    let tls =
        Tls::load(TlsSource::SelfSigned { dir: dir.path().join("tls"), names: vec![] }).unwrap();
    let g = start(tls).await;
    let cert = cert_of(&dir.path().join("tls/cert.pem"));
    let mut conn = connect(g.addr, &[cert]).await;
    // An unsigned request reaches the S3 layer, which refuses it as S3 does.
    for _ in 0..2 {
        let (status, body) = request(&mut conn, "/some-bucket/k").await;
        assert!(status.starts_with("http/1.1 403"), "{status} {body}");
        assert!(body.contains("AccessDenied"), "{body}");
    }
    // Plain HTTP on the HTTPS port: a 400 that says what to do.
    let mut plain = TcpStream::connect(g.addr).await.unwrap();
    plain.write_all(b"GET /some-bucket/k HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), plain.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("https://"), "{answer}");
    // As S3's XML, which is what S3 clients show to their users.
    assert!(answer.contains("Content-Type: application/xml"), "{answer}");
    assert!(answer.contains("<Error><Code>InvalidRequest</Code><Message>"), "{answer}");
    // A client that does not trust the certificate fails its handshake.
    let other = tempfile::tempdir().unwrap();
    make_cert(&other.path().join("c.pem"), &other.path().join("k.pem"));
    let untrusted = cert_of(&other.path().join("c.pem"));
    let addr = g.addr;
    let joined = tokio::spawn(async move { connect(addr, &[untrusted]).await }).await;
    assert!(joined.is_err(), "a client trusting another certificate completed the handshake");
    g.stop().await;
}

#[tokio::test]
async fn a_self_signed_certificate_is_made_once() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let src = TlsSource::SelfSigned {
        dir: dir.path().join("tls"),
        names: vec!["gw.example.org".into(), "10.1.2.3".into()],
    };
    let a = Tls::load(src.clone()).unwrap();
    let b = Tls::load(src).unwrap();
    assert_eq!(a.fingerprint(), b.fingerprint(), "a second start made a new certificate");
    let mode = |f: &str| {
        std::fs::metadata(dir.path().join("tls").join(f)).unwrap().permissions().mode() & 0o777
    };
    assert_eq!(mode("key.pem"), 0o600);
    assert_eq!(mode("cert.pem"), 0o644);
    let pem = std::fs::read_to_string(dir.path().join("tls/cert.pem")).unwrap();
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
    assert_eq!(a.fingerprint(), fingerprint(&cert_of(&dir.path().join("tls/cert.pem"))));
}

#[tokio::test]
async fn reload_serves_the_new_certificate_and_keeps_open_connections() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    make_cert(&cert, &key);
    let first = cert_of(&cert);
    let tls = Tls::load(TlsSource::Files { cert: cert.clone(), key: key.clone() }).unwrap();
    let g = start(tls.clone()).await;

    // Replace the files: the listener still presents the old one until the reload.
    let fresh = tempfile::tempdir().unwrap();
    let (cert2, key2) = (fresh.path().join("cert.pem"), fresh.path().join("key.pem"));
    make_cert(&cert2, &key2);
    let second = cert_of(&cert2);
    let roots = [first.clone(), second.clone()];
    let mut open = connect(g.addr, &roots).await;
    assert_eq!(presented(&open), fingerprint(&first));
    std::fs::copy(&cert2, &cert).unwrap();
    std::fs::copy(&key2, &key).unwrap();
    assert_eq!(presented(&connect(g.addr, &roots).await), fingerprint(&first));

    let fp = tls.reload().unwrap();
    assert_eq!(fp, fingerprint(&second));
    assert_eq!(presented(&connect(g.addr, &roots).await), fingerprint(&second));
    // The connection opened before the reload still serves.
    let (status, _) = request(&mut open, "/some-bucket/k").await;
    assert!(status.starts_with("http/1.1 403"), "{status}");

    // Broken files: the reload fails, says why, and the current certificate stays.
    std::fs::write(&key, "not a key").unwrap();
    let e = tls.reload().unwrap_err().to_string();
    assert!(e.contains("key.pem") && e.contains("no private key"), "{e}");
    // A key that is not the certificate's.
    let other = tempfile::tempdir().unwrap();
    make_cert(&other.path().join("c.pem"), &other.path().join("k.pem"));
    std::fs::copy(other.path().join("k.pem"), &key).unwrap();
    let e = tls.reload().unwrap_err().to_string();
    assert!(e.contains("is the key the certificate's"), "{e}");
    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
        .unwrap();
    assert!(tls.reload().is_err());
    assert_eq!(tls.fingerprint(), fingerprint(&second));
    assert_eq!(presented(&connect(g.addr, &roots).await), fingerprint(&second));
    g.stop().await;
}

#[test]
fn missing_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let e = Tls::load(TlsSource::Files {
        cert: dir.path().join("nope.pem"),
        key: dir.path().join("nokey.pem"),
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("nope.pem"), "{e}");
}

/// The serving certificate's end of validity is a metric (unix seconds), so an alert can fire
/// weeks before clients start refusing the gateway.
#[tokio::test]
async fn the_certificate_expiry_is_a_metric() {
    use base64::Engine as _;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
    let k = rcgen::KeyPair::generate().unwrap();
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    params.not_after = rcgen::date_time_ymd(2031, 3, 4);
    std::fs::write(&cert, params.self_signed(&k).unwrap().pem()).unwrap();
    std::fs::write(&key, k.serialize_pem()).unwrap();
    let tls = Tls::load(TlsSource::Files { cert: cert.clone(), key }).unwrap();
    // 2031-03-04T00:00:00Z.
    assert_eq!(tls.not_after(), Some(1_930_348_800));
    let g = start(tls).await;
    let mut conn = connect(g.admin, &[cert_of(&cert)]).await;
    let auth = base64::engine::general_purpose::STANDARD.encode("AKIDTLSTEST:tls-test-secret");
    conn.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic {auth}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let (head, body) = common::read_response(&mut conn, false).await;
    let body = String::from_utf8_lossy(&body);
    assert!(head.starts_with("http/1.1 200"), "{head}{body}");
    assert!(
        body.contains("blindfold_tls_certificate_expiry_timestamp_seconds 1930348800"),
        "{body}"
    );
    g.stop().await;
}
