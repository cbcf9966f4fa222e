//! The lease capability on the backends that need no server: memory and file (MinIO and Redis
//! are in `real_servers.rs`, the storage server in `blindfold-server`'s tests). One conformance
//! suite, `blindfold_testkit::lease::run`, and a deliberately broken backend that it must
//! catch.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use blindfold_store::{
    open_lease_store, FileLeaseRecords, LeaseRecords, LeaseStore, Leases, LoadedRecord,
    MemoryLeaseRecords, StoreError, StoreUrl,
};
use blindfold_testkit::lease;
use futures::FutureExt;

#[tokio::test]
async fn memory_passes_the_lease_suite() {
    let leases = open_lease_store(&StoreUrl::Memory).await.unwrap();
    lease::run(&[Arc::clone(&leases), leases]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_passes_the_lease_suite_with_handles_opened_separately() {
    let dir = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse(&format!("file://{}", dir.path().display())).unwrap();
    let mut handles = Vec::new();
    for _ in 0..3 {
        handles.push(open_lease_store(&url).await.unwrap());
    }
    lease::run(&handles).await;
    // The layout: one small text record per lease, beside its lock file.
    let record = std::fs::read_to_string(dir.path().join("race.lease")).unwrap();
    assert!(record.starts_with("blindfold-lease v1\ngeneration=2\n"), "{record}");
    assert!(dir.path().join("race.lease.lock").exists());
}

/// Two processes' worth of contention on one file store: many tasks on a multi-threaded
/// runtime, each with its own handle, fight over one lease; every generation has one holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_takeovers_under_contention_never_share_a_generation() {
    let dir = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse(&format!("file://{}", dir.path().display())).unwrap();
    let mut tasks = Vec::new();
    for t in 0..6 {
        let leases = open_lease_store(&url).await.unwrap();
        tasks.push(tokio::spawn(async move {
            let mut won = Vec::new();
            for _ in 0..20 {
                if let Ok(info) =
                    leases.acquire("gw", &format!("t{t}"), Duration::from_secs(60)).await
                {
                    won.push(info.generation);
                    leases.release("gw", info.generation).await.unwrap();
                }
            }
            won
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    let expected: Vec<u64> = (1..=all.len() as u64).collect();
    assert_eq!(all, expected, "each generation won exactly once, none skipped");
}

#[tokio::test]
async fn a_foreign_record_is_refused_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gw.lease"), "holder=me\n").unwrap();
    let leases = Leases::new(FileLeaseRecords::new(dir.path().to_path_buf()));
    let err = leases.acquire("gw", "me", Duration::from_secs(1)).await.unwrap_err();
    assert!(matches!(err, StoreError::NotAStore { .. }), "{err:?}");
    std::fs::write(dir.path().join("big.lease"), vec![b'x'; 1 << 20]).unwrap();
    let err = leases.inspect("big").await.unwrap_err();
    assert!(matches!(err, StoreError::NotAStore { .. }), "{err:?}");
}

#[tokio::test]
async fn the_errors_say_who_holds_the_lease_and_what_to_do() {
    let leases = open_lease_store(&StoreUrl::Memory).await.unwrap();
    let mine = leases.acquire("gateway", "host-a pid 7", Duration::from_secs(30)).await.unwrap();
    let held = leases.acquire("gateway", "host-b pid 8", Duration::from_secs(30)).await;
    let msg = held.unwrap_err().to_string();
    assert!(msg.contains("host-a pid 7") && msg.contains("generation 1"), "{msg}");
    assert!(msg.contains("stop that gateway") && msg.contains("wait"), "{msg}");
    leases.release("gateway", mine.generation).await.unwrap();
    leases.acquire("gateway", "host-b pid 8", Duration::from_secs(30)).await.unwrap();
    let lost = leases.renew("gateway", mine.generation, Duration::from_secs(30)).await;
    let msg = lost.unwrap_err().to_string();
    assert!(msg.contains("fenced") && msg.contains("host-b pid 8"), "{msg}");
}

/// Compare-and-swap done wrong: it checks, lets other tasks run, then writes whatever is
/// there — a read-then-write race.
#[derive(Debug, Default)]
struct RacyRecords(MemoryLeaseRecords);

#[async_trait]
impl LeaseRecords for RacyRecords {
    async fn load(&self, name: &str) -> blindfold_store::Result<Option<LoadedRecord>> {
        self.0.load(name).await
    }
    async fn swap(
        &self,
        name: &str,
        expected: Option<&[u8]>,
        record: &[u8],
    ) -> blindfold_store::Result<bool> {
        let current = self.0.load(name).await?;
        if current.as_ref().map(|c| c.token.as_slice()) != expected {
            return Ok(false);
        }
        tokio::task::yield_now().await;
        let now = self.0.load(name).await?;
        Ok(self.0.swap(name, now.as_ref().map(|c| c.token.as_slice()), record).await?)
    }
}

#[tokio::test]
async fn the_suite_catches_a_racy_backend() {
    let leases: Arc<dyn LeaseStore> = Arc::new(Leases::new(RacyRecords::default()));
    let handles = [Arc::clone(&leases), leases];
    let outcome = std::panic::AssertUnwindSafe(lease::run(&handles)).catch_unwind();
    let err = outcome.await.expect_err("the suite must fail on a racy backend");
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("exactly one wins"), "{msg}");
}
