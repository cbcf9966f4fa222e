//! The real `blindfold storage-server` binary: the store conformance suite over `remote://`,
//! and XOR Ring ORAM (server-side XOR) against it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use blindfold_crypto::{CellSealer, MasterKey, StoreId, XorPads};
use blindfold_oram::{BlockId, RingOram, RingOramConfig, RingVariant};
use blindfold_proxy::{RingData, SealedRingOram};
use blindfold_store::remote::AuthKey;
use blindfold_store::{open_store, open_xor_store, CountingStore, StoreError, StoreUrl, XorStore};
use blindfold_testkit::{conformance, xor::run_xor};

/// A storage server process on a free port; killed when dropped.
struct ServerProcess {
    child: Child,
    url: StoreUrl,
}

impl ServerProcess {
    /// Starts a server whose key file is created (with `--generate-auth-key`) in `keys`.
    fn start(store: &str, keys: &std::path::Path) -> Self {
        let key_file = keys.join("storage.key");
        let mut child = Command::new(env!("CARGO_BIN_EXE_blindfold"))
            .args(["storage-server", "--listen", "127.0.0.1:0", "--store", store])
            .arg("--auth-key-file")
            .arg(&key_file)
            .arg("--generate-auth-key")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start blindfold storage-server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line
            .split_whitespace()
            .find(|w| w.starts_with("127.0.0.1:"))
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        let url = StoreUrl::Remote { addr: addr.to_string(), key_file: Some(key_file) };
        Self { child, url }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_against_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let keys = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&format!("file://{}", dir.path().display()), keys.path());
    let store = open_store(&server.url, "conformance", conformance::geometry()).await.unwrap();
    conformance::run(&*store).await;
    let xor = open_xor_store(&server.url, "xor", conformance::geometry()).await.unwrap();
    run_xor(&*xor).await;
    assert!(dir.path().join("conformance.cells").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xor_ring_oram_against_the_binary() {
    let keys = tempfile::tempdir().unwrap();
    let server = ServerProcess::start("memory:", keys.path());
    let config = RingOramConfig::builder(256, 128)
        .z(4)
        .s(2)
        .a(3)
        .variant(RingVariant::XorRing)
        .build()
        .unwrap();
    let meta = open_store(&server.url, "xr-meta", SealedRingOram::meta_geometry(&config).unwrap())
        .await
        .unwrap();
    let data =
        open_xor_store(&server.url, "xr-data", SealedRingOram::data_geometry(&config).unwrap())
            .await
            .unwrap();
    let counted = Arc::new(CountingStore::new(data));
    let key = MasterKey::generate();
    let id = StoreId::random();
    let mut oram = SealedRingOram::with_oram(
        RingOram::with_seed(config.clone(), 3),
        meta,
        RingData::Xor(counted.clone() as Arc<dyn XorStore>),
        CellSealer::new(&key, id, 1),
        Some(XorPads::new(&key, id, 1)),
    )
    .unwrap();
    oram.bulk_load(|b| vec![b.0 as u8; 128]).await.unwrap();
    counted.reset();
    for i in 0..120u64 {
        let b = BlockId(i * 7 % 256);
        if i % 4 == 0 {
            oram.write(b, vec![0xEE; 128]).await.unwrap();
        } else {
            let got = oram.read(b).await.unwrap();
            assert!(got == vec![b.0 as u8; 128] || got == vec![0xEE; 128], "block {}", b.0);
        }
    }
    // Every online read was one XOR computed by the server, returning one block.
    let c = counted.counts();
    assert_eq!(c.xor_requests, 120);
    assert_eq!(c.xor_bytes_read, 120 * 128);
    assert_eq!(c.xor_ranges, 120 * u64::from(config.shape().levels()));
}

#[test]
fn the_binary_wants_a_key_or_an_explicit_opt_out() {
    let out = Command::new(env!("CARGO_BIN_EXE_blindfold"))
        .args(["storage-server", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--auth-key-file"), "{err}");
    // A key file that does not exist is not created without --generate-auth-key.
    let keys = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_blindfold"))
        .args(["storage-server", "--listen", "127.0.0.1:0", "--auth-key-file"])
        .arg(keys.path().join("missing.key"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--generate-auth-key"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_refuses_clients_without_its_key() {
    use std::os::unix::fs::PermissionsExt;
    let keys = tempfile::tempdir().unwrap();
    let server = ServerProcess::start("memory:", keys.path());
    let StoreUrl::Remote { addr, key_file: Some(key_file) } = &server.url else { unreachable!() };
    let mode = std::fs::metadata(key_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the generated key file is private");
    let g = conformance::geometry();
    let bare = StoreUrl::Remote { addr: addr.clone(), key_file: None };
    let err = open_store(&bare, "x", g).await.unwrap_err();
    assert!(matches!(err, StoreError::AccessDenied { .. }), "{err:?}");
    let other = keys.path().join("other.key");
    AuthKey::create(&other).unwrap();
    let wrong = StoreUrl::Remote { addr: addr.clone(), key_file: Some(other) };
    let err = open_store(&wrong, "x", g).await.unwrap_err();
    assert!(err.to_string().contains("does not hold the storage server's key"), "{err}");
    // The right key still works.
    open_store(&server.url, "x", g).await.unwrap();
}
