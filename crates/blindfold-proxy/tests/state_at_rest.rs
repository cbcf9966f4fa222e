//! The trusted state directory at rest: private modes, nothing derived from user data in the
//! clear, damage and a wrong key reported as such; and a crash *while* replaying the reveal
//! log at start-up loses nothing and is repaired by the next start.

use std::path::Path;
use std::sync::Arc;

use blindfold_crypto::{MasterKey, StoreId};
use blindfold_oram::{BlockId, PathOramConfig};
use blindfold_proxy::{DurablePathOram, DurableTao, SealedPathOram, TaoConfig};
use blindfold_store::{MemoryStore, Store};
use blindfold_testkit::DyingStore;

const BS: u32 = 64;
const PATTERN: &[u8] = b"blindfold-known-plaintext-pattern";

fn block(i: u64) -> Vec<u8> {
    let mut b = PATTERN.to_vec();
    b.extend_from_slice(&i.to_le_bytes());
    b.resize(BS as usize, b'#');
    b
}

/// Every file under `dir` (recursively), with its bytes.
fn files(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            let bytes = std::fs::read(&p).unwrap();
            out.push((p, bytes));
        }
    }
    out
}

fn assert_sealed_and_private(dir: &Path) {
    let found = files(dir);
    assert!(found.len() >= 2, "a checkpoint and a log at least: {found:?}");
    for (path, bytes) in &found {
        assert!(
            !bytes.windows(PATTERN.len()).any(|w| w == PATTERN),
            "{} holds user data in the clear",
            path.display()
        );
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(dir), 0o700, "state directory mode");
        for (path, _) in &found {
            assert_eq!(mode(path), 0o600, "{} mode", path.display());
        }
    }
}

fn path_config() -> PathOramConfig {
    // Cached top levels live in the checkpoint: plaintext buckets of user data.
    PathOramConfig::builder(64, BS).cache_levels(2).build().unwrap()
}

#[tokio::test]
async fn path_oram_state_is_sealed_and_private() {
    let key = MasterKey::generate();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("oram");
    let g = SealedPathOram::geometry(&path_config()).unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(g));
    let mut o =
        DurablePathOram::create(&state, path_config(), store.clone(), &key, StoreId::random())
            .await
            .unwrap();
    for i in 0..64 {
        o.write(BlockId(i), block(i)).await.unwrap();
    }
    o.commit().await.unwrap();
    o.read(BlockId(3)).await.unwrap(); // a reveal record after the commit
    assert_sealed_and_private(&state);
    o.checkpoint().unwrap_err(); // pending accesses: refused, nothing changes
    o.commit().await.unwrap();
    o.checkpoint().unwrap();
    assert_sealed_and_private(&state);
    drop(o);

    // Another key: recognised as such, not as damage of the store.
    let err =
        DurablePathOram::open(&state, store.clone(), &MasterKey::generate()).await.unwrap_err();
    assert!(err.to_string().contains("another key"), "{err}");
    // One flipped byte of the checkpoint: a clear error, no panic.
    let ckpt = state.join("checkpoint.bin");
    let mut bytes = std::fs::read(&ckpt).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    std::fs::write(&ckpt, &bytes).unwrap();
    let err = DurablePathOram::open(&state, store, &key).await.unwrap_err();
    assert!(err.to_string().contains("checkpoint"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tao_state_is_sealed_and_private() {
    let key = MasterKey::generate();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("oram");
    let config = TaoConfig::builder(64, BS).write_back_every(4).build().unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(config.geometry().unwrap()));
    let tao =
        DurableTao::create(&state, config, store.clone(), &key, StoreId::random()).await.unwrap();
    tao.write_many((0..64).map(|i| (BlockId(i), block(i))).collect()).await.unwrap();
    tao.commit().await.unwrap();
    tao.read_many(&[BlockId(1), BlockId(2)]).await.unwrap();
    assert_sealed_and_private(&state);
    tao.shutdown().await.unwrap();
    assert_sealed_and_private(&state);
}

/// A crash in the middle of the start-up replay (the store dies while the replayed accesses
/// are committed): the next start replays again, and every committed write reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_during_reveal_replay_is_repaired() {
    let key = MasterKey::generate();
    for dies_after in [0i64, 1, 3, 7] {
        let dir = tempfile::tempdir().unwrap();
        let config = TaoConfig::builder(64, BS).write_back_every(4).build().unwrap();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(config.geometry().unwrap()));
        {
            let tao = DurableTao::create(
                dir.path(),
                config.clone(),
                store.clone(),
                &key,
                StoreId::random(),
            )
            .await
            .unwrap();
            tao.write_many((0..64).map(|i| (BlockId(i), block(i))).collect()).await.unwrap();
            tao.commit().await.unwrap();
            // Revealed, never committed.
            tao.read_many(&[BlockId(5), BlockId(6), BlockId(7)]).await.unwrap();
            tao.write_many(vec![(BlockId(9), vec![0u8; BS as usize])]).await.unwrap();
        }
        let dying: Arc<dyn Store> = Arc::new(DyingStore::new(store.clone(), dies_after));
        assert!(DurableTao::open(dir.path(), dying, &key).await.is_err(), "store died");
        let (tao, rec) = DurableTao::open(dir.path(), store.clone(), &key).await.unwrap();
        assert!(rec.reaccessed >= 4, "the logged reveals are replayed again: {rec:?}");
        for i in 0..64 {
            assert_eq!(tao.read_many(&[BlockId(i)]).await.unwrap()[0], block(i), "block {i}");
        }
    }
}

#[tokio::test]
async fn path_oram_crash_during_reveal_replay_is_repaired() {
    let key = MasterKey::generate();
    for dies_after in [0i64, 2, 5] {
        let dir = tempfile::tempdir().unwrap();
        let g = SealedPathOram::geometry(&path_config()).unwrap();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(g));
        {
            let mut o = DurablePathOram::create(
                dir.path(),
                path_config(),
                store.clone(),
                &key,
                StoreId::random(),
            )
            .await
            .unwrap();
            for i in 0..64 {
                o.write(BlockId(i), block(i)).await.unwrap();
            }
            o.commit().await.unwrap();
            o.access_many(vec![
                (BlockId(5), blindfold_oram::Op::Read),
                (BlockId(6), blindfold_oram::Op::Write(vec![1; BS as usize])),
            ])
            .await
            .unwrap();
        }
        let dying: Arc<dyn Store> = Arc::new(DyingStore::new(store.clone(), dies_after));
        assert!(DurablePathOram::open(dir.path(), dying, &key).await.is_err(), "store died");
        let (mut o, rec) = DurablePathOram::open(dir.path(), store.clone(), &key).await.unwrap();
        assert_eq!(rec.reaccessed, 2, "{rec:?}");
        for i in 0..64 {
            assert_eq!(o.read(BlockId(i)).await.unwrap(), block(i), "block {i}");
        }
    }
}

/// A store that damages a cell the start-up replay must read stops the start with an
/// integrity error (serving without the replay would re-reveal leaves); once the cell is
/// back, the start completes and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_cell_on_the_replay_path_stops_the_start_cleanly() {
    let key = MasterKey::generate();
    let dir = tempfile::tempdir().unwrap();
    let config = TaoConfig::builder(64, BS).write_back_every(4).build().unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(config.geometry().unwrap()));
    {
        let tao =
            DurableTao::create(dir.path(), config.clone(), store.clone(), &key, StoreId::random())
                .await
                .unwrap();
        tao.write_many((0..64).map(|i| (BlockId(i), block(i))).collect()).await.unwrap();
        // Checkpointed, so the start-up does not rewrite the cells from the log.
        tao.shutdown().await.unwrap();
        tao.read_many(&[BlockId(5)]).await.unwrap();
    }
    // The root bucket is on every path, so the replay reads it.
    let root = blindfold_store::CellId(0);
    let good = store.read(&[root]).await.unwrap().pop().unwrap();
    let mut bad = good.clone();
    bad[40] ^= 1;
    store.write(vec![(root, bad)]).await.unwrap();
    let err = DurableTao::open(dir.path(), store.clone(), &key).await.unwrap_err();
    assert!(matches!(err, blindfold_proxy::ProxyError::Integrity { cell: 0, .. }), "{err}");
    store.write(vec![(root, good)]).await.unwrap();
    let (tao, rec) = DurableTao::open(dir.path(), store.clone(), &key).await.unwrap();
    assert_eq!(rec.reaccessed, 1);
    for i in 0..64 {
        assert_eq!(tao.read_many(&[BlockId(i)]).await.unwrap()[0], block(i), "block {i}");
    }
}
