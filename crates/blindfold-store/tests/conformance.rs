//! Every backend and wrapper passes the shared conformance suite, and the suite itself catches
//! broken stores.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use blindfold_store::{
    ByteRange, CellId, CountingStore, FaultConfig, FaultStore, FileStore, Geometry, JitterStore,
    LatencyStore, LinkConfig, MemoryStore, RecordingStore, Result, Store, SyncMode,
};
use blindfold_testkit::conformance;

fn memory() -> MemoryStore {
    MemoryStore::new(conformance::geometry())
}

#[tokio::test]
async fn memory_store() {
    conformance::run(&memory()).await;
}

async fn file_store(sync: SyncMode) {
    let dir = tempfile::tempdir().unwrap();
    let store =
        FileStore::create_or_open(dir.path().join("c.cells"), conformance::geometry(), sync)
            .unwrap();
    conformance::run(&store).await;
}

#[tokio::test]
async fn file_store_sync_none() {
    file_store(SyncMode::None).await;
}

#[tokio::test]
async fn file_store_sync_on_flush() {
    file_store(SyncMode::OnFlush).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_store_sync_always() {
    file_store(SyncMode::Always).await;
}

#[tokio::test]
async fn counting_store() {
    let store = CountingStore::new(memory());
    conformance::run(&store).await;
    assert!(store.counts().round_trips > 100, "{:?}", store.counts());
}

#[tokio::test]
async fn recording_store() {
    let store = RecordingStore::new(memory());
    conformance::run(&store).await;
    assert!(store.trace().len() > 100);
}

#[tokio::test]
async fn recording_store_with_payloads() {
    let store = RecordingStore::with_payloads(memory());
    conformance::run(&store).await;
    assert!(store.trace().iter().any(|e| !e.payloads.is_empty()));
}

#[tokio::test(start_paused = true)]
async fn latency_store() {
    let link = LinkConfig::symmetric(Duration::from_millis(20), 1_000_000);
    let store = LatencyStore::new(memory(), link);
    let start = tokio::time::Instant::now();
    conformance::run(&store).await;
    // Over a hundred sequential calls each paid the round trip (on the paused clock, so the
    // test is quick).
    assert!(start.elapsed() > Duration::from_secs(2), "{:?}", start.elapsed());
}

#[tokio::test]
async fn fault_store_with_zero_rates() {
    let store = FaultStore::new(memory(), FaultConfig { seed: 7, ..FaultConfig::default() });
    conformance::run(&store).await;
    assert_eq!(store.injected(), 0);
}

#[tokio::test(start_paused = true)]
async fn jitter_store() {
    let store = JitterStore::new(memory(), Duration::from_millis(5), 11);
    conformance::run(&store).await;
}

#[tokio::test(start_paused = true)]
async fn jitter_store_reorders_concurrent_replies() {
    let store = Arc::new(JitterStore::new(memory(), Duration::from_millis(5), 3));
    let done = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let calls: Vec<_> = (0..32u64)
        .map(|i| {
            let (store, done) = (Arc::clone(&store), Arc::clone(&done));
            tokio::spawn(async move {
                store.read(&[CellId(i % 8)]).await.unwrap();
                done.lock().push(i);
            })
        })
        .collect();
    for c in calls {
        c.await.unwrap();
    }
    let order = done.lock().clone();
    assert_eq!(order.len(), 32);
    assert!(order.windows(2).any(|w| w[0] > w[1]), "replies came back in order: {order:?}");
}

#[tokio::test]
async fn wrappers_over_a_shared_dyn_store() {
    let shared: Arc<dyn Store> = Arc::new(memory());
    conformance::run(&CountingStore::new(shared)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_stack_over_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = FileStore::create_or_open(
        dir.path().join("nested.cells"),
        conformance::geometry(),
        SyncMode::OnFlush,
    )
    .unwrap();
    let link = LinkConfig::symmetric(Duration::from_millis(2), 100_000_000);
    let store = CountingStore::new(LatencyStore::new(RecordingStore::new(file), link));
    conformance::run(&store).await;
    let recorded = store.inner().inner().trace().len() as u64;
    assert_eq!(store.counts().round_trips, recorded);
}

/// A store that breaks one contract, to show the suite notices.
#[derive(Debug)]
enum Broken {
    /// Applies the valid entries of a write batch before failing on an invalid one.
    PartialWrites(MemoryStore),
    /// Applies duplicate writes first-wins.
    FirstWriteWins(MemoryStore),
    /// Returns range reads one byte short at the end of a cell.
    ShortRangeAtEnd(MemoryStore),
}

impl Broken {
    fn inner(&self) -> &MemoryStore {
        match self {
            Broken::PartialWrites(s) | Broken::FirstWriteWins(s) | Broken::ShortRangeAtEnd(s) => s,
        }
    }
}

#[async_trait]
impl Store for Broken {
    fn geometry(&self) -> Geometry {
        self.inner().geometry()
    }

    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>> {
        self.inner().read(cells).await
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        let mut out = self.inner().read_ranges(ranges).await?;
        if let Broken::ShortRangeAtEnd(_) = self {
            for (r, data) in ranges.iter().zip(&mut out) {
                if r.len > 0 && r.offset + r.len == self.geometry().cell_size() {
                    data.pop();
                }
            }
        }
        Ok(out)
    }

    async fn write(&self, mut cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        match self {
            Broken::PartialWrites(s) => {
                for (c, data) in cells {
                    s.write(vec![(c, data)]).await?;
                }
                Ok(())
            }
            Broken::FirstWriteWins(s) => {
                let mut seen = std::collections::HashSet::new();
                cells.retain(|(c, _)| seen.insert(*c));
                s.write(cells).await
            }
            Broken::ShortRangeAtEnd(s) => s.write(cells).await,
        }
    }

    async fn flush(&self) -> Result<()> {
        self.inner().flush().await
    }
}

#[tokio::test]
#[should_panic(expected = "leave the store unchanged")]
async fn suite_catches_partial_writes() {
    conformance::run(&Broken::PartialWrites(memory())).await;
}

#[tokio::test]
#[should_panic(expected = "the last of duplicate writes wins")]
async fn suite_catches_first_write_wins() {
    conformance::run(&Broken::FirstWriteWins(memory())).await;
}

#[tokio::test]
#[should_panic(expected = "fresh cells read as zeros")]
async fn suite_catches_short_ranges() {
    conformance::run(&Broken::ShortRangeAtEnd(memory())).await;
}

#[tokio::test]
#[should_panic(expected = "geometry")]
async fn suite_refuses_another_geometry() {
    conformance::run(&MemoryStore::new(Geometry::new(96, 80).unwrap())).await;
}
