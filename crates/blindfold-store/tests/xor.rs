//! The XOR capability on every local backend and wrapper, and how the wrappers see it.

use std::sync::Arc;
use std::time::Duration;

use blindfold_store::{
    ByteRange, CellId, CountingStore, FileStore, LatencyStore, LinkConfig, MemoryStore,
    RecordingStore, StoreUrl, SyncMode, TraceOp, XorStore,
};
use blindfold_testkit::{conformance, xor::run_xor};

#[tokio::test]
async fn memory_and_file_stores_xor() {
    run_xor(&MemoryStore::new(conformance::geometry())).await;
    let dir = tempfile::tempdir().unwrap();
    let file = FileStore::create_or_open(
        dir.path().join("x.cells"),
        conformance::geometry(),
        SyncMode::None,
    )
    .unwrap();
    run_xor(&file).await;
}

#[tokio::test(start_paused = true)]
async fn wrappers_pass_xor_through_and_count_it() {
    let link = LinkConfig::symmetric(Duration::from_millis(10), 8_000_000);
    let shared: Arc<dyn XorStore> = Arc::new(MemoryStore::new(conformance::geometry()));
    let store = CountingStore::new(RecordingStore::new(LatencyStore::new(shared, link)));
    run_xor(&store).await;
    conformance::run(&CountingStore::new(MemoryStore::new(conformance::geometry()))).await;

    store.reset();
    store.inner().clear();
    let ranges = [
        ByteRange { cell: CellId(1), offset: 0, len: 40 },
        ByteRange { cell: CellId(2), offset: 40, len: 40 },
    ];
    let start = tokio::time::Instant::now();
    let out = store.read_xor(&ranges).await.unwrap();
    assert_eq!(out.len(), 40);
    // One round trip, 40 bytes down (not 80): 10 ms + (32 + 40) bytes at 1 MB/s.
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(10) && took < Duration::from_millis(12), "{took:?}");
    let c = store.counts();
    assert_eq!((c.xor_requests, c.xor_ranges, c.xor_bytes_read, c.round_trips), (1, 2, 40, 1));
    assert_eq!(c.bytes_down(), 40);
    let trace = store.inner().trace();
    assert_eq!(trace.len(), 1);
    assert_eq!(trace[0].shape(), (TraceOp::ReadXor, 2, 40));
    assert_eq!(trace[0].ranges, vec![(0, 40), (40, 40)]);
}

#[tokio::test]
async fn open_xor_store_by_url() {
    let dir = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse(&format!("file://{}", dir.path().display())).unwrap();
    let store = blindfold_store::open_xor_store(&url, "x", conformance::geometry()).await.unwrap();
    run_xor(&*store).await;
    assert!(blindfold_store::open_xor_store(&url, "../x", conformance::geometry()).await.is_err());
}

#[test]
fn remote_urls_parse_and_print() {
    let url = StoreUrl::parse("remote://127.0.0.1:7420").unwrap();
    assert_eq!(url, StoreUrl::Remote { addr: "127.0.0.1:7420".into(), key_file: None });
    assert_eq!(url.to_string(), "remote://127.0.0.1:7420");
    let keyed = StoreUrl::parse("remote://h:1?key_file=/etc/b%20f/auth.key").unwrap();
    assert_eq!(
        keyed,
        StoreUrl::Remote { addr: "h:1".into(), key_file: Some("/etc/b f/auth.key".into()) }
    );
    assert_eq!(StoreUrl::parse(&keyed.to_string()).unwrap(), keyed);
    assert_eq!(
        StoreUrl::parse("REMOTE://example.invalid:9/").unwrap().to_string(),
        "remote://example.invalid:9"
    );
    for bad in [
        "remote:",
        "remote://host",
        "remote://:80",
        "remote://h:0",
        "remote://h:1/x",
        "remote://h:99999",
        "remote:h:1",
        "remote://h:1?key=x",
        "remote://h:1?key_file=",
        "remote://h:1?key_file=/a&key_file=/b",
    ] {
        assert!(StoreUrl::parse(bad).is_err(), "{bad}");
    }
}
