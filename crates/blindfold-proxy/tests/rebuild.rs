//! `rebuild` (for `blindfold recover`): after a recover from a snapshot, no block is fetched
//! along the path its snapshot leaf named (which the store saw in the lost timeline), and the
//! recovered engine reads back what the snapshot held.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use blindfold_crypto::{MasterKey, StoreId};
use blindfold_oram::oblivistore::ObliviStoreConfig;
use blindfold_oram::{BlockId, Leaf, Op, PathOramConfig, TreeShape};
use blindfold_proxy::rebuild::{fresh_epoch, rebuild_oblivistore, rebuild_path_oram, rebuild_tao};
use blindfold_proxy::{DurableObliviStore, DurablePathOram, DurableTao, TaoConfig};
use blindfold_store::{CellId, Geometry, MemoryStore, RecordingStore, Store, TraceOp};

const BS: u32 = 32;
const BLOCKS: u64 = 256;

fn block(i: u64, tag: u8) -> Vec<u8> {
    let mut d = vec![tag; BS as usize];
    d[..8].copy_from_slice(&i.to_le_bytes());
    d
}

/// A copy of every cell of `from` in a new memory store.
async fn clone_store(from: &dyn Store) -> Arc<MemoryStore> {
    let g = from.geometry();
    let to = Arc::new(MemoryStore::new(g));
    let cells: Vec<CellId> = (0..g.cell_count()).map(CellId).collect();
    let data = from.read(&cells).await.unwrap();
    to.write(cells.into_iter().zip(data).collect()).await.unwrap();
    to
}

fn copy_checkpoint(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    std::fs::copy(from.join("checkpoint.bin"), to.join("checkpoint.bin")).unwrap();
}

/// The leaf of each path read since `from` (one read per access), in order. Store cells are
/// taken modulo the tree's size: with two slots per cell, cell `c` also lives at `c + n`.
fn leaves_read(rec: &RecordingStore<MemoryStore>, from: usize, shape: TreeShape) -> Vec<Leaf> {
    let n = shape.buckets();
    rec.trace()[from..]
        .iter()
        .filter(|e| e.op == TraceOp::Read)
        .map(|e| {
            let deepest = e.cells.iter().map(|c| c.0 % n).max().unwrap();
            Leaf(deepest - (shape.leaves() - 1))
        })
        .collect()
}

/// Checks that `after[i]` is independent of `before[i]`: the mean depth down to which their
/// paths coincide matches two independent uniform leaves (expectation `Σ 2^-d`, about 1), within
/// five standard errors. Restoring the snapshot's leaves as they were gives the full height.
fn assert_independent(before: &[Leaf], after: &[Leaf], shape: TreeShape) {
    assert_eq!(before.len(), after.len());
    let n = before.len() as f64;
    let l = shape.height();
    // P(shared depth >= d) = 2^-d for d in 1..=L.
    let mean: f64 = (1..=l).map(|d| 0.5f64.powi(d as i32)).sum();
    let second: f64 = (1..=l).map(|d| (2 * d - 1) as f64 * 0.5f64.powi(d as i32)).sum();
    let sd = ((second - mean * mean) / n).sqrt();
    let observed: f64 =
        before.iter().zip(after).map(|(a, b)| f64::from(shape.common_depth(*a, *b))).sum::<f64>()
            / n;
    let same = before.iter().zip(after).filter(|(a, b)| a == b).count();
    assert!(
        (observed - mean).abs() <= 5.0 * sd,
        "mean shared depth {observed:.3}, expected {mean:.3} ± {:.3} (height {l}); \
         {same} of {} blocks fetched their snapshot leaf again",
        5.0 * sd,
        before.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tao_recover_fetches_no_snapshot_leaf_again() {
    let key = MasterKey::generate();
    let config = TaoConfig::builder(BLOCKS, BS).write_back_every(8).build().unwrap();
    let shape = config.shape();
    let g = DurableTao::geometry(&config).unwrap();
    let root = tempfile::tempdir().unwrap();
    let (lost_dir, snap_dir, new_dir) =
        (root.path().join("lost"), root.path().join("snap"), root.path().join("new"));
    let store = Arc::new(RecordingStore::new(MemoryStore::new(g)));
    // Before the snapshot: every block written.
    {
        let tao =
            DurableTao::create(&lost_dir, config.clone(), store.clone(), &key, StoreId::random())
                .await
                .unwrap();
        for i in 0..BLOCKS {
            tao.write_many(vec![(BlockId(i), block(i, 1))]).await.unwrap();
        }
        tao.shutdown().await.unwrap();
    }
    copy_checkpoint(&lost_dir, &snap_dir);
    let at_snapshot = clone_store(&*store).await;
    // The lost timeline goes on: one access per block, each along its snapshot leaf.
    let mark = store.trace().len();
    {
        let (tao, _) = DurableTao::open(&lost_dir, store.clone(), &key).await.unwrap();
        for i in 0..BLOCKS {
            tao.read_many(&[BlockId(i)]).await.unwrap();
        }
        tao.shutdown().await.unwrap();
    }
    let snapshot_leaves = leaves_read(&store, mark, shape);
    assert_eq!(snapshot_leaves.len() as u64, BLOCKS);

    // Recover from the snapshot into a new array.
    copy_checkpoint(&snap_dir, &new_dir);
    let fresh = Arc::new(RecordingStore::new(MemoryStore::new(g)));
    let rebuilt =
        rebuild_tao(&new_dir, at_snapshot, fresh.clone(), &key, fresh_epoch()).await.unwrap();
    assert_eq!(rebuilt.blocks_found, BLOCKS);
    assert!(rebuilt.lost.is_empty() && rebuilt.unreadable_cells.is_empty(), "{rebuilt:?}");
    assert_eq!(rebuilt.cells_written, g.cell_count() / 2, "one slot of every cell");
    // The store saw every cell written once, in cell-independent order: nothing else.
    let mark = fresh.trace().len();
    assert!(fresh.trace().iter().all(|e| e.op != TraceOp::Read));
    let (tao, _) = DurableTao::open(&new_dir, fresh.clone(), &key).await.unwrap();
    for i in 0..BLOCKS {
        assert_eq!(tao.read_many(&[BlockId(i)]).await.unwrap(), vec![block(i, 1)]);
    }
    let after = leaves_read(&fresh, mark, shape);
    assert_independent(&snapshot_leaves, &after, shape);
    let report = tao.verify(|_, _| {}).await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
}

#[tokio::test]
async fn path_oram_recover_fetches_no_snapshot_leaf_again() {
    let key = MasterKey::generate();
    let config = PathOramConfig::builder(BLOCKS, BS).build().unwrap();
    let shape = config.trees()[0].shape;
    let g: Geometry = blindfold_proxy::SealedPathOram::geometry(&config).unwrap();
    let root = tempfile::tempdir().unwrap();
    let (lost_dir, snap_dir, new_dir) =
        (root.path().join("lost"), root.path().join("snap"), root.path().join("new"));
    let store = Arc::new(RecordingStore::new(MemoryStore::new(g)));
    {
        let mut oram = DurablePathOram::create(
            &lost_dir,
            config.clone(),
            store.clone(),
            &key,
            StoreId::random(),
        )
        .await
        .unwrap();
        for i in 0..BLOCKS {
            oram.write(BlockId(i), block(i, 1)).await.unwrap();
        }
        oram.commit().await.unwrap();
        oram.checkpoint().unwrap();
    }
    copy_checkpoint(&lost_dir, &snap_dir);
    let at_snapshot = clone_store(&*store).await;
    let mark = store.trace().len();
    {
        let (mut oram, _) = DurablePathOram::open(&lost_dir, store.clone(), &key).await.unwrap();
        for i in 0..BLOCKS {
            oram.read(BlockId(i)).await.unwrap();
        }
        oram.commit().await.unwrap();
    }
    let snapshot_leaves = leaves_read(&store, mark, shape);
    assert_eq!(snapshot_leaves.len() as u64, BLOCKS);

    copy_checkpoint(&snap_dir, &new_dir);
    let fresh = Arc::new(RecordingStore::new(MemoryStore::new(g)));
    let rebuilt =
        rebuild_path_oram(&new_dir, at_snapshot, fresh.clone(), &key, fresh_epoch()).await.unwrap();
    assert_eq!(rebuilt.blocks_found, BLOCKS);
    assert!(rebuilt.lost.is_empty() && rebuilt.unreadable_cells.is_empty(), "{rebuilt:?}");
    let mark = fresh.trace().len();
    let (mut oram, _) = DurablePathOram::open(&new_dir, fresh.clone(), &key).await.unwrap();
    for i in 0..BLOCKS {
        assert_eq!(oram.read(BlockId(i)).await.unwrap(), block(i, 1));
    }
    let after = leaves_read(&fresh, mark, shape);
    assert_independent(&snapshot_leaves, &after, shape);
    let report = oram.verify(|_, _| {}).await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
}

/// Cells the lost run rewrote after the snapshot do not open under the snapshot's versions:
/// the blocks in them are reported lost (never returned with other contents), the rest come
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cells_rewritten_after_the_snapshot_are_reported_lost() {
    let key = MasterKey::generate();
    let config = TaoConfig::builder(BLOCKS, BS).write_back_every(8).build().unwrap();
    let g = DurableTao::geometry(&config).unwrap();
    let root = tempfile::tempdir().unwrap();
    let (lost_dir, new_dir) = (root.path().join("lost"), root.path().join("new"));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(g));
    {
        let tao =
            DurableTao::create(&lost_dir, config.clone(), store.clone(), &key, StoreId::random())
                .await
                .unwrap();
        for i in 0..BLOCKS {
            tao.write_many(vec![(BlockId(i), block(i, 1))]).await.unwrap();
        }
        tao.shutdown().await.unwrap();
    }
    copy_checkpoint(&lost_dir, &new_dir);
    {
        let (tao, _) = DurableTao::open(&lost_dir, store.clone(), &key).await.unwrap();
        // Several commits: with two slots per cell, a cell's snapshot copy is overwritten only
        // by the second commit that writes the cell after the snapshot (the root: every one).
        for i in 0..8 {
            tao.write_many(vec![(BlockId(i), block(i, 2))]).await.unwrap();
            tao.commit().await.unwrap();
        }
        tao.shutdown().await.unwrap();
    }
    let fresh: Arc<dyn Store> = Arc::new(MemoryStore::new(g));
    let rebuilt = rebuild_tao(&new_dir, store, fresh.clone(), &key, fresh_epoch()).await.unwrap();
    assert!(!rebuilt.unreadable_cells.is_empty());
    assert_eq!(rebuilt.blocks_found + rebuilt.lost.len() as u64, BLOCKS, "{rebuilt:?}");
    let (tao, _) = DurableTao::open(&new_dir, fresh, &key).await.unwrap();
    for i in 0..BLOCKS {
        let got = tao.read_many(&[BlockId(i)]).await.unwrap().pop().unwrap();
        if rebuilt.lost.contains(&i) {
            assert_eq!(got, vec![0; BS as usize]);
        } else {
            assert_eq!(got, block(i, 1), "block {i}");
        }
    }
}

/// The three kinds of partition engine: ObliviStore, CURIOUS over levelled partitions and
/// CURIOUS over Path ORAM partitions (b = 3, z = 5).
fn partition_configs() -> Vec<ObliviStoreConfig> {
    vec![
        ObliviStoreConfig::new(BLOCKS, BS).unwrap(),
        ObliviStoreConfig::curious(BLOCKS, BS, 3).unwrap(),
        ObliviStoreConfig::curious_path(BLOCKS, BS, 3, 5).unwrap(),
    ]
}

async fn partition_engine(
    dir: &Path,
    config: ObliviStoreConfig,
    store: Arc<dyn Store>,
    key: &MasterKey,
) -> DurableObliviStore {
    DurableObliviStore::create(dir, config, store, key, StoreId::random(), &mut |_, _| {})
        .await
        .unwrap()
}

/// Writes blocks `0..n`, tagged `tag`, and commits.
async fn write_blocks(e: &DurableObliviStore, n: u64, tag: u8) {
    for i in 0..n {
        e.access(BlockId(i), Op::Write(block(i, tag))).await.unwrap();
    }
    e.commit().await.unwrap();
}

/// The partition of every stored block.
fn partitions_of(engine: &DurableObliviStore) -> HashMap<u64, u64> {
    let per = engine.config().partition_cells();
    engine.block_cells().into_iter().map(|(b, c)| (b, c.0 / per)).collect()
}

/// A partition engine recovered from its snapshot: every block the snapshot held comes back
/// (or is reported lost, never returned with other contents), in a partition independent of
/// the one the snapshot named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_engines_recover_into_fresh_partitions() {
    for config in partition_configs() {
        let key = MasterKey::generate();
        let g = DurableObliviStore::geometry(&config).unwrap();
        let root = tempfile::tempdir().unwrap();
        let (lost_dir, new_dir) = (root.path().join("lost"), root.path().join("new"));
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(g));
        let before = {
            let e = partition_engine(&lost_dir, config.clone(), store.clone(), &key).await;
            write_blocks(&e, BLOCKS, 1).await;
            e.shutdown().await.unwrap();
            let (e, _) = DurableObliviStore::open(&lost_dir, store.clone(), &key).await.unwrap();
            let p = partitions_of(&e);
            e.shutdown().await.unwrap();
            p
        };
        copy_checkpoint(&lost_dir, &new_dir);
        {
            // The lost timeline: reads show partitions, writes and shuffles overwrite cells.
            let (e, _) = DurableObliviStore::open(&lost_dir, store.clone(), &key).await.unwrap();
            write_blocks(&e, 8, 2).await;
            e.shutdown().await.unwrap();
        }
        let fresh: Arc<dyn Store> = Arc::new(MemoryStore::new(g));
        let rebuilt =
            rebuild_oblivistore(&new_dir, store.clone(), fresh.clone(), &key, fresh_epoch())
                .await
                .unwrap();
        assert_eq!(rebuilt.blocks_found + rebuilt.lost.len() as u64, BLOCKS, "{rebuilt:?}");
        assert!(rebuilt.blocks_found >= BLOCKS * 3 / 4, "{rebuilt:?}");
        let (e, _) = DurableObliviStore::open(&new_dir, fresh.clone(), &key).await.unwrap();
        let after = partitions_of(&e);
        let kept = after.iter().filter(|(b, p)| before.get(b) == Some(p)).count();
        let parts = config.partitions() as f64;
        // Independent: about 1/P of them stay where they were; the snapshot's own places: all.
        let expected = after.len() as f64 / parts;
        assert!(
            (kept as f64) < expected + 5.0 * expected.sqrt() + 3.0,
            "{kept} of {} blocks kept their snapshot partition (P = {parts})",
            after.len()
        );
        for i in 0..BLOCKS {
            let got = e.access(BlockId(i), Op::Read).await.unwrap();
            if rebuilt.lost.contains(&i) {
                assert_eq!(got, vec![0; BS as usize], "lost block {i}");
            } else {
                assert_eq!(got, block(i, 1), "block {i} ({config:?})");
            }
        }
        e.commit().await.unwrap();
        e.shutdown().await.unwrap();
    }
}

/// After a recover, the store hands back the lost timeline's cell at every address of the
/// rebuilt array (both timelines having run the same number of accesses, so that their
/// shuffles number their serials alike): none opens. With the rebuilt engine's serials
/// continued from the snapshot instead of drawn afresh, some do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cell_of_the_lost_timeline_opens_after_a_partition_engine_recovers() {
    for config in partition_configs() {
        let key = MasterKey::generate();
        let g = DurableObliviStore::geometry(&config).unwrap();
        let root = tempfile::tempdir().unwrap();
        let (lost_dir, new_dir) = (root.path().join("lost"), root.path().join("new"));
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(g));
        let run = |e: DurableObliviStore, tag: u8| async move {
            write_blocks(&e, BLOCKS, tag).await;
            e.shutdown().await.unwrap();
        };
        run(partition_engine(&lost_dir, config.clone(), store.clone(), &key).await, 1).await;
        copy_checkpoint(&lost_dir, &new_dir);
        run(DurableObliviStore::open(&lost_dir, store.clone(), &key).await.unwrap().0, 2).await;
        let fresh: Arc<dyn Store> = Arc::new(MemoryStore::new(g));
        rebuild_oblivistore(&new_dir, store.clone(), fresh.clone(), &key, fresh_epoch())
            .await
            .unwrap();
        run(DurableObliviStore::open(&new_dir, fresh.clone(), &key).await.unwrap().0, 3).await;
        let all: Vec<CellId> = (0..g.cell_count()).map(CellId).collect();
        let old = store.read(&all).await.unwrap();
        fresh.write(all.into_iter().zip(old).collect()).await.unwrap();
        let (e, _) = DurableObliviStore::open(&new_dir, fresh, &key).await.unwrap();
        let report = e.verify(&mut |_, _| {}).await.unwrap();
        assert!(!report.failures.is_empty());
        assert_eq!(
            report.cells_checked, 0,
            "cells of the lost timeline opened in the rebuilt array ({config:?})"
        );
    }
}

/// Cells the lost run rewrote after the snapshot are caught: the blocks in them are lost,
/// every other block comes back as the snapshot had it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_engine_cells_damaged_after_the_snapshot_are_reported_lost() {
    for config in partition_configs() {
        let key = MasterKey::generate();
        let g = DurableObliviStore::geometry(&config).unwrap();
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("e");
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(g));
        let e = partition_engine(&dir, config.clone(), store.clone(), &key).await;
        write_blocks(&e, BLOCKS, 1).await;
        e.shutdown().await.unwrap();
        let (e, _) = DurableObliviStore::open(&dir, store.clone(), &key).await.unwrap();
        let cells = e.block_cells();
        e.shutdown().await.unwrap();
        // Three stored blocks' cells flipped.
        let hit: Vec<(u64, CellId)> =
            cells.iter().step_by(cells.len() / 3).take(3).copied().collect();
        for &(_, c) in &hit {
            let mut raw = store.read(&[c]).await.unwrap().pop().unwrap();
            raw[20] ^= 1;
            store.write(vec![(c, raw)]).await.unwrap();
        }
        let fresh: Arc<dyn Store> = Arc::new(MemoryStore::new(g));
        let rebuilt =
            rebuild_oblivistore(&dir, store, fresh.clone(), &key, fresh_epoch()).await.unwrap();
        let mut lost: Vec<u64> = hit.iter().map(|h| h.0).collect();
        lost.sort_unstable();
        assert_eq!(rebuilt.lost, lost);
        assert_eq!(rebuilt.unreadable_cells.len(), 3);
        let (e, _) = DurableObliviStore::open(&dir, fresh, &key).await.unwrap();
        for i in 0..BLOCKS {
            let got = e.access(BlockId(i), Op::Read).await.unwrap();
            let want = if lost.contains(&i) { vec![0; BS as usize] } else { block(i, 1) };
            assert_eq!(got, want, "block {i}");
        }
        e.shutdown().await.unwrap();
    }
}

/// A rebuild whose blocks do not fit in its memory limit sets them aside on the disk and
/// still brings every one back, holding no more than the limit in memory: for a recovery of
/// TaoStore and Path ORAM, and for a growth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_larger_than_its_memory_limit_sets_blocks_aside() {
    use blindfold_proxy::rebuild::{grow_tao, memory_limit, set_memory_limit, MIN_MEMORY_LIMIT};
    // 256 KiB of blocks against 64 KiB of memory (no other test of this binary rebuilds more
    // than 64 KiB, so the limit changes nothing for them).
    const MANY: u64 = 4096;
    const SIZE: u32 = 64;
    set_memory_limit(MIN_MEMORY_LIMIT);
    let limit = memory_limit();
    assert!(MANY * u64::from(SIZE) > 3 * limit);
    let contents = |i: u64, tag: u8| {
        let mut d = vec![tag; SIZE as usize];
        d[..8].copy_from_slice(&i.to_le_bytes());
        d
    };
    let key = MasterKey::generate();
    let root = tempfile::tempdir().unwrap();

    // TaoStore: recovered from a snapshot into a new array, then grown to twice the blocks.
    let config = TaoConfig::builder(MANY, SIZE).write_back_every(8).build().unwrap();
    let g = DurableTao::geometry(&config).unwrap();
    let (lost_dir, new_dir) = (root.path().join("tao-lost"), root.path().join("tao-new"));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(g));
    {
        let tao =
            DurableTao::create(&lost_dir, config.clone(), store.clone(), &key, StoreId::random())
                .await
                .unwrap();
        for chunk in (0..MANY).collect::<Vec<_>>().chunks(64) {
            tao.write_many(chunk.iter().map(|&i| (BlockId(i), contents(i, 1))).collect())
                .await
                .unwrap();
        }
        tao.shutdown().await.unwrap();
    }
    copy_checkpoint(&lost_dir, &new_dir);
    let fresh: Arc<dyn Store> = Arc::new(MemoryStore::new(g));
    let rebuilt = rebuild_tao(&new_dir, store, fresh.clone(), &key, fresh_epoch()).await.unwrap();
    assert_eq!(rebuilt.blocks_found, MANY, "{rebuilt:?}");
    assert!(rebuilt.lost.is_empty() && rebuilt.unreadable_cells.is_empty(), "{rebuilt:?}");
    assert!(rebuilt.set_aside_bytes > MANY * u64::from(SIZE), "{rebuilt:?}");
    assert!(rebuilt.held_peak_bytes <= limit, "{rebuilt:?}");
    assert!(!new_dir.join("rebuild-aside").exists(), "what was set aside is removed");
    let grown_config = TaoConfig::builder(2 * MANY, SIZE).write_back_every(8).build().unwrap();
    let grown: Arc<dyn Store> =
        Arc::new(MemoryStore::new(DurableTao::geometry(&grown_config).unwrap()));
    let report =
        grow_tao(&new_dir, fresh, grown.clone(), &key, fresh_epoch(), grown_config).await.unwrap();
    assert!(report.set_aside_bytes > 0 && report.held_peak_bytes <= limit, "{report:?}");
    let (tao, _) = DurableTao::open(&new_dir, grown, &key).await.unwrap();
    let ids: Vec<BlockId> = (0..2 * MANY).map(BlockId).collect();
    for chunk in ids.chunks(128) {
        for (b, got) in chunk.iter().zip(tao.read_many(chunk).await.unwrap()) {
            let want = if b.0 < MANY { contents(b.0, 1) } else { vec![0; SIZE as usize] };
            assert_eq!(got, want, "block {}", b.0);
        }
    }
    let report = tao.verify(|_, _| {}).await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    tao.shutdown().await.unwrap();

    // Path ORAM.
    let config = PathOramConfig::builder(MANY, SIZE).build().unwrap();
    let g: Geometry = blindfold_proxy::SealedPathOram::geometry(&config).unwrap();
    let (lost_dir, new_dir) = (root.path().join("path-lost"), root.path().join("path-new"));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(g));
    {
        let mut oram =
            DurablePathOram::create(&lost_dir, config, store.clone(), &key, StoreId::random())
                .await
                .unwrap();
        for i in 0..MANY {
            oram.write(BlockId(i), contents(i, 2)).await.unwrap();
        }
        oram.commit().await.unwrap();
        oram.checkpoint().unwrap();
    }
    copy_checkpoint(&lost_dir, &new_dir);
    let fresh: Arc<dyn Store> = Arc::new(MemoryStore::new(g));
    let rebuilt =
        rebuild_path_oram(&new_dir, store, fresh.clone(), &key, fresh_epoch()).await.unwrap();
    assert_eq!(rebuilt.blocks_found, MANY, "{rebuilt:?}");
    assert!(rebuilt.set_aside_bytes > 0 && rebuilt.held_peak_bytes <= limit, "{rebuilt:?}");
    let (mut oram, _) = DurablePathOram::open(&new_dir, fresh, &key).await.unwrap();
    for i in 0..MANY {
        assert_eq!(oram.read(BlockId(i)).await.unwrap(), contents(i, 2), "block {i}");
    }
}
