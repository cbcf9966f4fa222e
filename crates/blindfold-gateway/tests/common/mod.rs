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
