//! Helpers shared by the gateway's integration tests (tests/all.rs and the binaries apart).
#![allow(dead_code)]

use blindfold_gateway::server::{self, OramEngine, ServeConfig};
use blindfold_store::StoreUrl;

/// A small gateway (1 MiB of 1 KiB blocks, no cached levels) over a file store, everything
/// under `root`.
pub fn file_cfg(root: &std::path::Path, engine: OramEngine) -> ServeConfig {
    ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: root.join("data"),
        store: Some(StoreUrl::File {
            dir: root.join("cells"),
            sync: blindfold_store::SyncMode::OnFlush,
        }),
        key_file: Some(root.join("key.json")),
        passphrase: None,
        credentials: Some(("ak".into(), "sk".into())),
        capacity: 1 << 20,
        block_size: 1024,
        pad_objects: false,
        cache_mib: 0,
        engine,
        in_place: false,
        pack_levels: 1,
        durability: Default::default(),
        lease_ttl: None,
        anchor: None,
        reads_ahead_of_log: false,
        log_feed: None,
    }
}

/// The whole of object `key` in bucket `b`, or the error that stopped the read.
pub async fn read_object(opened: &server::Opened, key: &str) -> Result<Vec<u8>, String> {
    let meta = opened.objects.directory().object("b", key).unwrap().expect("object");
    let mut rx =
        opened.objects.read_range(&meta, 0..meta.size, 0).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    while let Some(c) = rx.recv().await {
        out.extend_from_slice(&c.map_err(|e| e.to_string())?);
    }
    Ok(out)
}

/// A gateway serving S3 (plain, or over `tls`) and its admin listener on free 127.0.0.1 ports,
/// with the credentials `access_key`/`secret_key` (admin token "admin-test-token").
pub struct Running {
    pub addr: std::net::SocketAddr,
    /// The admin listener.
    pub admin: std::net::SocketAddr,
    /// The data directory (for the users file).
    pub data_dir: std::path::PathBuf,
    pub key: std::sync::Arc<blindfold_crypto::MasterKey>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Running {
    /// Starts a 1 MiB gateway of 4 KiB blocks.
    pub async fn start(
        (access_key, secret_key): (&str, &str),
        tls: Option<blindfold_gateway::tls::Tls>,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::start_on(listener, (access_key, secret_key), tls, Default::default(), || {}).await
    }

    /// [`Running::start`] on `listener`, whose S3 listener allows `limits`; `before_serving`
    /// runs after the store is opened, just before connections are accepted.
    pub async fn start_on(
        listener: tokio::net::TcpListener,
        (access_key, secret_key): (&str, &str),
        tls: Option<blindfold_gateway::tls::Tls>,
        limits: blindfold_gateway::listen::Limits,
        before_serving: impl FnOnce(),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cfg = memory_cfg(dir.path(), access_key, secret_key);
        let mut opened = server::open(&cfg).await.unwrap();
        opened.limits = limits;
        let key = std::sync::Arc::clone(&opened.key);
        let addr = listener.local_addr().unwrap();
        let admin_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = admin_listener.local_addr().unwrap();
        let auth = blindfold_gateway::admin::AdminAuth::new(
            cfg.credentials.clone().unwrap(),
            Some("admin-test-token".into()),
        )
        .unwrap();
        let state = blindfold_gateway::admin::AdminState::new(&opened, auth, None);
        let limits = blindfold_gateway::listen::Limits::default();
        tokio::spawn(blindfold_gateway::admin::serve(admin_listener, state, tls.clone(), limits));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        before_serving();
        let task = tokio::spawn(async move {
            server::run_tls(opened, listener, tls, async {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        Self { addr, admin, data_dir: cfg.data_dir.clone(), key, stop: Some(tx), task, _dir: dir }
    }

    /// Stops it (a clean shutdown) and waits.
    pub async fn stop(mut self) {
        self.stop.take().unwrap().send(()).unwrap();
        (&mut self.task).await.unwrap();
    }
}

/// A 1 MiB gateway of 4 KiB blocks with the default engine and store, everything under `root`.
pub fn memory_cfg(root: &std::path::Path, access_key: &str, secret_key: &str) -> ServeConfig {
    ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: root.join("data"),
        store: None,
        key_file: None,
        passphrase: None,
        credentials: Some((access_key.into(), secret_key.into())),
        capacity: 1 << 20,
        block_size: 4096,
        pad_objects: false,
        cache_mib: server::DEFAULT_CACHE_MIB,
        engine: Default::default(),
        in_place: false,
        pack_levels: 1,
        durability: Default::default(),
        lease_ttl: None,
        anchor: None,
        reads_ahead_of_log: false,
        log_feed: None,
    }
}

/// Reads one HTTP/1.1 response from `conn`: its head (status line and headers, lower-cased)
/// and, unless `head_only` (the answer to a HEAD), the body its Content-Length announces.
/// Panics if nothing comes within 10 s or the connection closes first.
pub async fn read_response<R: tokio::io::AsyncRead + Unpin>(
    conn: &mut R,
    head_only: bool,
) -> (String, Vec<u8>) {
    use tokio::io::AsyncReadExt as _;
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), conn.read(&mut byte))
            .await
            .expect("a response within 10 s")
            .unwrap();
        assert!(
            n == 1,
            "connection closed before a response; got {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.push(byte[0]);
    }
    let head = String::from_utf8(buf).unwrap().to_ascii_lowercase();
    if head_only {
        return (head, Vec::new());
    }
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0u8; len];
    conn.read_exact(&mut body).await.unwrap();
    (head, body)
}

/// The Redis test server's URL (None when no Redis runs), with its password also in the
/// environment: gateway.json keeps the URL without it, and a gateway takes it from there, as an
/// operator's would. Set once for the whole test binary, so that no test changes the
/// environment while another reads it.
pub fn redis_url(test: &str) -> Option<StoreUrl> {
    static EXPORTED: std::sync::Once = std::sync::Once::new();
    let url = blindfold_testkit::servers::redis_url(test, "")?;
    if let StoreUrl::Redis { address, .. } = &url {
        if let Some(p) = &address.password {
            EXPORTED.call_once(|| std::env::set_var("BLINDFOLD_REDIS_PASSWORD", p.expose()));
        }
    }
    Some(url)
}

/// A SigV4-signed request (header auth, unsigned payload) for `(access key, secret key)`.
pub fn signed_as(keys: (&str, &str), method: &str, path: &str, extra_headers: &str) -> String {
    use ring::{digest, hmac};
    let now = time::OffsetDateTime::now_utc();
    let day = format!("{:04}{:02}{:02}", now.year(), u8::from(now.month()), now.day());
    let stamp = format!("{day}T{:02}{:02}{:02}Z", now.hour(), now.minute(), now.second());
    // The query (plain names and values only, as these tests use) in canonical order.
    let (bare, query) = path.split_once('?').unwrap_or((path, ""));
    let mut params: Vec<String> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| if p.contains('=') { p.to_owned() } else { format!("{p}=") })
        .collect();
    params.sort();
    let query = params.join("&");
    let canonical = format!(
        "{method}\n{bare}\n{query}\nhost:gw\nx-amz-content-sha256:UNSIGNED-PAYLOAD\nx-amz-date:{stamp}\n\n\
         host;x-amz-content-sha256;x-amz-date\nUNSIGNED-PAYLOAD"
    );
    let scope = format!("{day}/us-east-1/s3/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{}",
        hex::encode(digest::digest(&digest::SHA256, canonical.as_bytes()))
    );
    let mac = |key: &[u8], data: &str| {
        hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data.as_bytes()).as_ref().to_vec()
    };
    let mut key = mac(format!("AWS4{}", keys.1).as_bytes(), &day);
    for part in ["us-east-1", "s3", "aws4_request"] {
        key = mac(&key, part);
    }
    let signature = hex::encode(mac(&key, &to_sign));
    format!(
        "{method} {path} HTTP/1.1\r\nHost: gw\r\nx-amz-date: {stamp}\r\n\
         x-amz-content-sha256: UNSIGNED-PAYLOAD\r\n{extra_headers}\
         Authorization: AWS4-HMAC-SHA256 Credential={}/{scope}, \
         SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={signature}\r\n",
        keys.0
    )
}

/// Sends one request on a new connection to `g` and reads the response: its head (status line
/// and headers, lower-cased) and body.
pub async fn exchange(g: &Running, request: &[u8]) -> (String, String) {
    use tokio::io::AsyncWriteExt as _;
    let mut sock = tokio::net::TcpStream::connect(g.addr).await.unwrap();
    sock.write_all(request).await.unwrap();
    let (head, body) = read_response(&mut sock, request.starts_with(b"HEAD ")).await;
    (head, String::from_utf8_lossy(&body).into_owned())
}

/// Sends a request signed with `keys` (unsigned if `None`), with `headers` (each ending in
/// CRLF) and `body`; returns the response's head (lower-cased) and body.
pub async fn request(
    g: &Running,
    keys: Option<(&str, &str)>,
    method: &str,
    path: &str,
    headers: &str,
    body: &[u8],
) -> (String, String) {
    let extra = if body.is_empty() && method != "PUT" {
        headers.to_owned()
    } else {
        format!("{headers}Content-Length: {}\r\n", body.len())
    };
    let head = match keys {
        Some(keys) => signed_as(keys, method, path, &extra),
        None => format!("{method} {path} HTTP/1.1\r\nHost: gw\r\n{extra}"),
    };
    let mut req = format!("{head}\r\n").into_bytes();
    req.extend_from_slice(body);
    exchange(g, &req).await
}

/// The status code of a response from [`request`] or [`exchange`].
pub fn status(r: &(String, String)) -> u16 {
    r.0.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}
