//! The `remote://` backend against an in-process storage server: the store conformance suite,
//! the XOR capability, pipelining, errors, reconnection; and Ring / XOR Ring ORAM over it.

use std::sync::Arc;

use blindfold_crypto::{CellSealer, MasterKey, StoreId, XorPads};
use blindfold_oram::{BlockId, RingOram, RingOramConfig, RingVariant};
use blindfold_proxy::{RingData, SealedRingOram};
use blindfold_server::{Auth, Server, ServerConfig};
use blindfold_store::remote::AuthKey;
use blindfold_store::{
    open_store, open_xor_store, ByteRange, CellId, Geometry, RemoteStore, Store, StoreError,
    StoreUrl, XorStore,
};
use blindfold_testkit::{conformance, xor::run_xor};

/// The key every test server here is started with.
fn key() -> AuthKey {
    AuthKey::from_bytes([0x5a; 32])
}

async fn server(url: StoreUrl) -> (String, tokio::task::JoinHandle<std::io::Result<()>>) {
    let config = ServerConfig::new(Auth::Key(key()));
    let (addr, task) = Server::bind("127.0.0.1:0", url, config).await.unwrap().spawn();
    (addr.to_string(), task)
}

/// A `remote://` URL for `addr` with a key file (in `dir`) holding [`key`].
fn remote_url(addr: &str, dir: &std::path::Path) -> StoreUrl {
    let path = dir.join("storage.key");
    if !path.exists() {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .unwrap();
        writeln!(f, "{}", "5a".repeat(32)).unwrap();
    }
    StoreUrl::Remote { addr: addr.to_string(), key_file: Some(path) }
}

#[tokio::test]
async fn conformance_over_memory() {
    let (addr, task) = server(StoreUrl::Memory).await;
    let store =
        RemoteStore::open(&addr, Some(key()), "conf", conformance::geometry()).await.unwrap();
    conformance::run(&store).await;
    let store =
        RemoteStore::open(&addr, Some(key()), "xor", conformance::geometry()).await.unwrap();
    run_xor(&store).await;
    task.abort();
}

/// The select capability over the wire: the conformance check against a server on memory and
/// one on files (opened by URL), and the counting wrapper in front of a remote store.
#[cfg(feature = "select")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn select_conformance_over_memory_and_files() {
    use blindfold_store::{open_select_store, CountingStore, SelectStore};
    use blindfold_testkit::select::{self, run_select};

    let (addr, task) = server(StoreUrl::Memory).await;
    let store = RemoteStore::open(&addr, Some(key()), "sel", select::geometry()).await.unwrap();
    let counted = CountingStore::new(store);
    run_select(&counted).await;
    let c = counted.counts();
    assert!(c.select_requests > 0 && c.select_bytes_read > 0, "{c:?}");
    // The server's answer is exactly one slot's worth of ciphertexts.
    let answer = counted.read_select(&select::sample_request(2)).await.unwrap();
    assert_eq!(answer.len(), 128);
    task.abort();

    let dir = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse(&format!("file://{}", dir.path().display())).unwrap();
    let (addr, task) = server(url).await;
    let remote = remote_url(&addr, dir.path());
    let store = open_select_store(&remote, "sel", select::geometry()).await.unwrap();
    run_select(&*store).await;
    assert!(dir.path().join("sel.cells").exists());
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_over_files() {
    let dir = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse(&format!("file://{}", dir.path().display())).unwrap();
    let (addr, task) = server(url).await;
    let remote = remote_url(&addr, dir.path());
    let store = open_store(&remote, "conf", conformance::geometry()).await.unwrap();
    conformance::run(&*store).await;
    assert!(dir.path().join("conf.cells").exists());
    // Another connection sees the same array; another shape is refused.
    let again = open_xor_store(&remote, "conf", conformance::geometry()).await.unwrap();
    assert_eq!(again.read(&[CellId(0)]).await.unwrap(), store.read(&[CellId(0)]).await.unwrap());
    let err = RemoteStore::open(&addr, Some(key()), "conf", Geometry::new(5, 80).unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::GeometryMismatch { .. }), "{err:?}");
    let err = RemoteStore::open(&addr, Some(key()), "../escape", conformance::geometry())
        .await
        .unwrap_err();
    assert!(!err.is_retryable(), "{err:?}");
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_and_reconnection() {
    let (addr, task) = server(StoreUrl::Memory).await;
    let g = Geometry::new(64, 32).unwrap();
    let store = Arc::new(RemoteStore::open(&addr, Some(key()), "p", g).await.unwrap());
    // Many requests in flight on one connection.
    let writes = (0..64u64).map(|c| {
        let s = Arc::clone(&store);
        async move { s.write(vec![(CellId(c), vec![c as u8; 32])]).await }
    });
    for r in futures_join(writes).await {
        r.unwrap();
    }
    let reads = (0..64u64).map(|c| {
        let s = Arc::clone(&store);
        async move { s.read_ranges(&[ByteRange { cell: CellId(c), offset: 1, len: 2 }]).await }
    });
    for (c, r) in futures_join(reads).await.into_iter().enumerate() {
        assert_eq!(r.unwrap(), vec![vec![c as u8; 2]]);
    }
    // The server goes away: requests fail retryably; a new server on the same port serves again.
    task.abort();
    let _ = task.await;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let err = store.read(&[CellId(0)]).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    let (addr2, task2) = {
        let s = Server::bind(&addr, StoreUrl::Memory, ServerConfig::new(Auth::Key(key())))
            .await
            .unwrap();
        let (a, t) = s.spawn();
        (a.to_string(), t)
    };
    assert_eq!(addr2, addr);
    assert_eq!(store.read(&[CellId(0)]).await.unwrap(), vec![vec![0u8; 32]], "a new, empty array");
    task2.abort();
}

async fn futures_join<F: std::future::Future + Send + 'static>(
    futs: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_and_xor_ring_oram_over_the_server() {
    let (addr, task) = server(StoreUrl::Memory).await;
    let dir = tempfile::tempdir().unwrap();
    let url = remote_url(&addr, dir.path());
    for variant in [RingVariant::Ring, RingVariant::XorRing] {
        let config = RingOramConfig::builder(128, 64).variant(variant).build().unwrap();
        let name = variant.name();
        let meta = open_store(
            &url,
            &format!("{name}-meta"),
            SealedRingOram::meta_geometry(&config).unwrap(),
        )
        .await
        .unwrap();
        let data_g = SealedRingOram::data_geometry(&config).unwrap();
        let data = match variant {
            RingVariant::Ring => {
                RingData::Plain(open_store(&url, &format!("{name}-data"), data_g).await.unwrap())
            }
            RingVariant::XorRing => {
                let s: Arc<dyn XorStore> =
                    open_xor_store(&url, &format!("{name}-data"), data_g).await.unwrap();
                RingData::Xor(s)
            }
        };
        let key = MasterKey::generate();
        let id = StoreId::random();
        let pads = (variant == RingVariant::XorRing).then(|| XorPads::new(&key, id, 1));
        let mut oram = SealedRingOram::with_oram(
            RingOram::with_seed(config, 5),
            meta,
            data,
            CellSealer::new(&key, id, 1),
            pads,
        )
        .unwrap();
        for i in 0..100u64 {
            oram.write(BlockId(i % 50), vec![i as u8; 64]).await.unwrap();
        }
        for i in 50..100u64 {
            assert_eq!(oram.read(BlockId(i % 50)).await.unwrap(), vec![i as u8; 64], "{name}");
        }
    }
    task.abort();
}

/// The lease capability over the wire, the compare-and-swap run by the server: the lease suite
/// against a server on memory and one on files, each with handles on separate connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_over_memory_and_files() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file_url = StoreUrl::parse(&format!("file://{}", data.display())).unwrap();
    for backing in [StoreUrl::Memory, file_url] {
        let (addr, task) = server(backing.clone()).await;
        let url = remote_url(&addr, dir.path());
        let mut handles = Vec::new();
        for _ in 0..3 {
            handles.push(blindfold_store::open_lease_store(&url).await.unwrap());
        }
        blindfold_testkit::lease::run(&handles).await;
        if let StoreUrl::File { dir, .. } = &backing {
            let record = std::fs::read_to_string(dir.join("race.lease")).unwrap();
            assert!(record.starts_with("blindfold-lease v1\ngeneration=2\n"), "{record}");
        }
        task.abort();
    }
}

/// A server restarted on the same directory keeps the generations.
#[tokio::test]
async fn lease_generations_survive_a_server_restart_on_files() {
    let dir = tempfile::tempdir().unwrap();
    let data = StoreUrl::parse(&format!("file://{}", dir.path().join("data").display())).unwrap();
    let ttl = std::time::Duration::from_secs(60);
    let (addr, task) = server(data.clone()).await;
    let leases = blindfold_store::open_lease_store(&remote_url(&addr, dir.path())).await.unwrap();
    let first = leases.acquire("gateway", "gw-a", ttl).await.unwrap();
    leases.release("gateway", first.generation).await.unwrap();
    task.abort();
    let _ = task.await;
    let (addr, task) = server(data).await;
    let leases = blindfold_store::open_lease_store(&remote_url(&addr, dir.path())).await.unwrap();
    assert_eq!(leases.acquire("gateway", "gw-b", ttl).await.unwrap().generation, 2);
    task.abort();
}
