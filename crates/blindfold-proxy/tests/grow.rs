//! Growing a durable engine into a larger tree (`blindfold grow`): every block keeps its
//! contents (checked against a model), the new blocks read as zeros and take writes, what the
//! store sees does not depend on which blocks are in use or what they hold, and a damaged cell
//! stops the growth before anything is replaced.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use blindfold_crypto::{MasterKey, StoreId};
use blindfold_oram::oblivistore::ObliviStoreConfig;
use blindfold_oram::{BlockId, Op, PathOramConfig};
use blindfold_proxy::rebuild::{fresh_epoch, grow_oblivistore, grow_path_oram, grow_tao};
use blindfold_proxy::{DurableObliviStore, DurablePathOram, DurableTao, TaoConfig};
use blindfold_store::{CellId, MemoryStore, RecordingStore, Store, TraceOp};
use rand::{Rng, SeedableRng};

const BS: u32 = 32;
const BLOCKS: u64 = 128;
const GROWN: u64 = 512;

fn path_config(blocks: u64) -> PathOramConfig {
    PathOramConfig::builder(blocks, BS).cache_levels(2).build().unwrap()
}

fn tao_config(blocks: u64) -> TaoConfig {
    TaoConfig::builder(blocks, BS).write_back_every(8).build().unwrap()
}

/// The writes of the workload `seed` selects: random contents for random blocks, each write
/// followed by a commit one time in ten.
fn writes(seed: u64) -> Vec<(u64, Vec<u8>, bool)> {
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
    (0..BLOCKS)
        .map(|_| {
            let b = rng.gen_range(0..BLOCKS);
            let data: Vec<u8> = (0..BS).map(|_| rng.gen()).collect();
            (b, data, rng.gen_bool(0.1))
        })
        .collect()
}

/// What the blocks hold after `writes`.
fn model(writes: &[(u64, Vec<u8>, bool)]) -> HashMap<u64, Vec<u8>> {
    writes.iter().map(|(b, data, _)| (*b, data.clone())).collect()
}

/// The writes of `seed`, made to a fresh durable Path ORAM in `dir` over `store`, then shut
/// down cleanly. Returns the model.
async fn fill_path(
    dir: &Path,
    store: Arc<dyn Store>,
    key: &MasterKey,
    seed: u64,
) -> HashMap<u64, Vec<u8>> {
    let w = writes(seed);
    let mut oram = DurablePathOram::create(dir, path_config(BLOCKS), store, key, StoreId::random())
        .await
        .unwrap();
    for (b, data, commit) in &w {
        oram.write(BlockId(*b), data.clone()).await.unwrap();
        if *commit {
            oram.commit().await.unwrap();
        }
    }
    oram.commit().await.unwrap();
    oram.checkpoint().unwrap();
    model(&w)
}

/// The same for the TaoStore engine.
async fn fill_tao(
    dir: &Path,
    store: Arc<dyn Store>,
    key: &MasterKey,
    seed: u64,
) -> HashMap<u64, Vec<u8>> {
    let w = writes(seed);
    let tao =
        DurableTao::create(dir, tao_config(BLOCKS), store, key, StoreId::random()).await.unwrap();
    for (b, data, commit) in &w {
        tao.write_many(vec![(BlockId(*b), data.clone())]).await.unwrap();
        if *commit {
            tao.commit().await.unwrap();
        }
    }
    tao.shutdown().await.unwrap();
    model(&w)
}

/// What the store saw, as (operation, logical cells) in order: contents left out. Which of a
/// cell's two slots a read goes to is taken out: it follows from the writes the store saw
/// before (see `SlottedStore`), whatever the blocks hold.
fn shape(rec: &RecordingStore<MemoryStore>, cells: u64) -> Vec<(TraceOp, Vec<u64>)> {
    let n = cells / 2;
    rec.trace().iter().map(|e| (e.op, e.cells.iter().map(|c| c.0 % n).collect())).collect()
}

/// No cell of `rec` appears in two requests of kind `op`; with `ordered`, they come in cell
/// order (cell `c` of two slots of `n` cells also lives at `c + n`).
fn each_cell_once(rec: &RecordingStore<MemoryStore>, op: TraceOp, cells: u64, ordered: bool) {
    let seen: Vec<u64> = rec
        .trace()
        .iter()
        .filter(|e| e.op == op)
        .flat_map(|e| e.cells.iter().map(|c| c.0))
        .collect();
    let mut sorted = seen.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), seen.len(), "a cell was touched twice");
    assert!(seen.len() as u64 <= cells);
    let logical: Vec<u64> = seen.iter().map(|c| c % (cells / 2)).collect();
    assert!(!ordered || logical.windows(2).all(|w| w[0] < w[1]), "cells not in order");
}

#[tokio::test]
async fn path_oram_grows_with_every_block_kept() {
    let key = MasterKey::generate();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("oram");
    let old: Arc<dyn Store> =
        Arc::new(MemoryStore::new(DurablePathOram::geometry(&path_config(BLOCKS)).unwrap()));
    let model = fill_path(&dir, old.clone(), &key, 1).await;
    let new: Arc<dyn Store> =
        Arc::new(MemoryStore::new(DurablePathOram::geometry(&path_config(GROWN)).unwrap()));
    let grown = grow_path_oram(&dir, old, new.clone(), &key, fresh_epoch(), path_config(GROWN))
        .await
        .unwrap();
    assert_eq!(grown.blocks_found, model.len() as u64, "{grown:?}");
    assert!(grown.unreadable_cells.is_empty());
    let (mut oram, _) = DurablePathOram::open(&dir, new.clone(), &key).await.unwrap();
    assert_eq!(oram.oram().config().blocks(), GROWN);
    for i in 0..GROWN {
        let want = model.get(&i).cloned().unwrap_or_else(|| vec![0; BS as usize]);
        assert_eq!(oram.read(BlockId(i)).await.unwrap(), want, "block {i}");
    }
    // The new blocks take writes, durably.
    for i in BLOCKS..GROWN {
        oram.write(BlockId(i), vec![i as u8; BS as usize]).await.unwrap();
    }
    oram.commit().await.unwrap();
    drop(oram);
    let (mut oram, _) = DurablePathOram::open(&dir, new, &key).await.unwrap();
    for i in BLOCKS..GROWN {
        assert_eq!(oram.read(BlockId(i)).await.unwrap(), vec![i as u8; BS as usize]);
    }
    let report = oram.verify(|_, _| {}).await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tao_grows_with_every_block_kept() {
    let key = MasterKey::generate();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("oram");
    let old: Arc<dyn Store> =
        Arc::new(MemoryStore::new(DurableTao::geometry(&tao_config(BLOCKS)).unwrap()));
    let model = fill_tao(&dir, old.clone(), &key, 2).await;
    let new: Arc<dyn Store> =
        Arc::new(MemoryStore::new(DurableTao::geometry(&tao_config(GROWN)).unwrap()));
    grow_tao(&dir, old, new.clone(), &key, fresh_epoch(), tao_config(GROWN)).await.unwrap();
    let (tao, _) = DurableTao::open(&dir, new.clone(), &key).await.unwrap();
    let ids: Vec<BlockId> = (0..GROWN).map(BlockId).collect();
    for chunk in ids.chunks(32) {
        let got = tao.read_many(chunk).await.unwrap();
        for (b, data) in chunk.iter().zip(got) {
            let want = model.get(&b.0).cloned().unwrap_or_else(|| vec![0; BS as usize]);
            assert_eq!(data, want, "block {}", b.0);
        }
    }
    tao.write_many(vec![(BlockId(GROWN - 1), vec![7; BS as usize])]).await.unwrap();
    tao.shutdown().await.unwrap();
    drop(tao);
    let (tao, _) = DurableTao::open(&dir, new, &key).await.unwrap();
    assert_eq!(tao.read_many(&[BlockId(GROWN - 1)]).await.unwrap()[0], vec![7; BS as usize]);
    let report = tao.verify(|_, _| {}).await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
}

/// Two stores holding different blocks with different contents grow through exactly the same
/// requests: every old cell read once and every new cell written once, in cell order.
#[tokio::test]
async fn what_the_store_sees_of_a_growth_is_independent_of_the_data() {
    let key = MasterKey::generate();
    let root = tempfile::tempdir().unwrap();
    let mut shapes = Vec::new();
    for seed in [10u64, 20] {
        let dir = root.path().join(format!("oram{seed}"));
        let g = DurablePathOram::geometry(&path_config(BLOCKS)).unwrap();
        let old = Arc::new(RecordingStore::new(MemoryStore::new(g)));
        fill_path(&dir, old.clone(), &key, seed).await;
        old.take_trace();
        let gn = DurablePathOram::geometry(&path_config(GROWN)).unwrap();
        let new = Arc::new(RecordingStore::new(MemoryStore::new(gn)));
        grow_path_oram(&dir, old.clone(), new.clone(), &key, fresh_epoch(), path_config(GROWN))
            .await
            .unwrap();
        assert!(old.trace().iter().all(|e| e.op == TraceOp::Read || e.op == TraceOp::Flush));
        each_cell_once(&old, TraceOp::Read, g.cell_count(), true);
        assert!(new.trace().iter().all(|e| e.op != TraceOp::Read));
        // The bulk load writes buckets in post-order: a fixed order, the same for both stores.
        each_cell_once(&new, TraceOp::Write, gn.cell_count(), false);
        let written: u64 = new
            .trace()
            .iter()
            .filter(|e| e.op == TraceOp::Write)
            .map(|e| e.cells.len() as u64)
            .sum();
        // Every cell of the new tree but the cached top is written.
        assert_eq!(written, path_config(GROWN).total_cells() - 3);
        shapes.push((shape(&old, g.cell_count()), shape(&new, gn.cell_count())));
    }
    assert_eq!(shapes[0], shapes[1], "the store could tell the two stores apart");
}

/// A cell that does not authenticate stops the growth before the checkpoint is replaced.
#[tokio::test]
async fn a_damaged_cell_stops_the_growth_with_nothing_changed() {
    let key = MasterKey::generate();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("oram");
    let old: Arc<dyn Store> =
        Arc::new(MemoryStore::new(DurablePathOram::geometry(&path_config(BLOCKS)).unwrap()));
    let model = fill_path(&dir, old.clone(), &key, 3).await;
    let before = std::fs::read(dir.join("checkpoint.bin")).unwrap();
    // Flip a byte of every written cell of the stored tree (both slots).
    let cells: Vec<CellId> = (0..old.geometry().cell_count()).map(CellId).collect();
    let all = old.read(&cells).await.unwrap();
    let mut written: Vec<(CellId, Vec<u8>)> =
        cells.into_iter().zip(all).filter(|(_, d)| d.iter().any(|&b| b != 0)).collect();
    assert!(!written.is_empty());
    let flip = |w: &mut Vec<(CellId, Vec<u8>)>| w.iter_mut().for_each(|(_, d)| d[40] ^= 1);
    flip(&mut written);
    old.write(written.clone()).await.unwrap();
    let new: Arc<dyn Store> =
        Arc::new(MemoryStore::new(DurablePathOram::geometry(&path_config(GROWN)).unwrap()));
    let e = grow_path_oram(&dir, old.clone(), new, &key, fresh_epoch(), path_config(GROWN))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("do not authenticate"), "{e}");
    assert_eq!(std::fs::read(dir.join("checkpoint.bin")).unwrap(), before);
    // Undo the damage: the old tree serves on, every block intact.
    flip(&mut written);
    old.write(written).await.unwrap();
    let (mut oram, _) = DurablePathOram::open(&dir, old, &key).await.unwrap();
    assert_eq!(oram.oram().config().blocks(), BLOCKS);
    for (i, want) in &model {
        assert_eq!(&oram.read(BlockId(*i)).await.unwrap(), want);
    }
}

/// Growing means more blocks of the same size: anything else is refused.
#[tokio::test]
async fn growth_refuses_smaller_or_reshaped_trees() {
    let key = MasterKey::generate();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("oram");
    let old: Arc<dyn Store> =
        Arc::new(MemoryStore::new(DurablePathOram::geometry(&path_config(BLOCKS)).unwrap()));
    fill_path(&dir, old.clone(), &key, 4).await;
    for to in [
        path_config(BLOCKS),
        path_config(BLOCKS / 2),
        PathOramConfig::builder(GROWN, BS * 2).build().unwrap(),
        PathOramConfig::builder(GROWN, BS).z(5).build().unwrap(),
    ] {
        let new: Arc<dyn Store> =
            Arc::new(MemoryStore::new(DurablePathOram::geometry(&to).unwrap()));
        let e = grow_path_oram(&dir, old.clone(), new, &key, fresh_epoch(), to).await.unwrap_err();
        assert!(e.to_string().contains("cannot grow"), "{e}");
    }
}

/// The partition engines: ObliviStore, CURIOUS over levelled partitions, CURIOUS over Path
/// ORAM partitions (b = 3, z = 5).
fn partition_configs(blocks: u64) -> Vec<ObliviStoreConfig> {
    vec![
        ObliviStoreConfig::new(blocks, BS).unwrap(),
        ObliviStoreConfig::curious(blocks, BS, 3).unwrap(),
        ObliviStoreConfig::curious_path(blocks, BS, 3, 5).unwrap(),
    ]
}

/// A partition engine grows with every block kept (the workloads of two seeds, against their
/// models; new blocks read as zeros and take writes), and what the store sees does not depend
/// on the data: the new array gets the same writes, in the same order, for both workloads;
/// the old array gets only reads, each cell at most once, of the levels that were filled (a
/// whole tree's current copies for Path ORAM partitions: the same count for both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_engines_grow_with_every_block_kept() {
    for (small, large) in partition_configs(BLOCKS).into_iter().zip(partition_configs(GROWN)) {
        let key = MasterKey::generate();
        let root = tempfile::tempdir().unwrap();
        let mut shapes = Vec::new();
        for seed in [10u64, 20] {
            let dir = root.path().join(format!("e{seed}"));
            let g = DurableObliviStore::geometry(&small).unwrap();
            let old = Arc::new(RecordingStore::new(MemoryStore::new(g)));
            let w = writes(seed);
            let e = DurableObliviStore::create(
                &dir,
                small.clone(),
                old.clone(),
                &key,
                StoreId::random(),
                &mut |_, _| {},
            )
            .await
            .unwrap();
            for (b, data, commit) in &w {
                e.access(BlockId(*b), Op::Write(data.clone())).await.unwrap();
                if *commit {
                    e.commit().await.unwrap();
                }
            }
            e.shutdown().await.unwrap();
            let model = model(&w);
            old.take_trace();
            let gn = DurableObliviStore::geometry(&large).unwrap();
            let new = Arc::new(RecordingStore::new(MemoryStore::new(gn)));
            let grown = grow_oblivistore(
                &dir,
                old.clone(),
                new.clone(),
                &key,
                fresh_epoch(),
                large.clone(),
            )
            .await
            .unwrap();
            assert!(grown.lost.is_empty() && grown.unreadable_cells.is_empty(), "{grown:?}");
            assert_eq!(grown.blocks_found, model.len() as u64);
            assert!(old.trace().iter().all(|e| e.op == TraceOp::Read));
            let read: Vec<u64> =
                old.trace().iter().flat_map(|e| e.cells.iter().map(|c| c.0)).collect();
            let mut once = read.clone();
            once.sort_unstable();
            once.dedup();
            assert_eq!(once.len(), read.len(), "a cell was read twice");
            if large.path_shape().is_some() {
                let (z, h) = small.path_shape().unwrap();
                let per = ((2u64 << h) - 1) * u64::from(z);
                assert_eq!(read.len() as u64, per * u64::from(small.partitions()));
            }
            assert!(new.trace().iter().all(|e| e.op != TraceOp::Read));
            let written: Vec<(TraceOp, Vec<u64>)> =
                new.trace().iter().map(|e| (e.op, e.cells.iter().map(|c| c.0).collect())).collect();
            shapes.push(written);
            let (e, _) = DurableObliviStore::open(&dir, new, &key).await.unwrap();
            for b in 0..GROWN {
                let got = e.access(BlockId(b), Op::Read).await.unwrap();
                let want = model.get(&b).cloned().unwrap_or(vec![0; BS as usize]);
                assert_eq!(got, want, "block {b} after growing ({large:?})");
            }
            e.access(BlockId(GROWN - 1), Op::Write(vec![7; BS as usize])).await.unwrap();
            assert_eq!(e.access(BlockId(GROWN - 1), Op::Read).await.unwrap(), vec![7; BS as usize]);
            e.shutdown().await.unwrap();
        }
        assert_eq!(shapes[0], shapes[1], "the store could tell the two workloads apart");
    }
}

/// A partition engine grows only into more blocks of the same size and kind of partitions;
/// anything else is refused with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_engine_growth_refuses_smaller_or_other_engines() {
    let key = MasterKey::generate();
    let root = tempfile::tempdir().unwrap();
    let small = ObliviStoreConfig::new(BLOCKS, BS).unwrap();
    let g = DurableObliviStore::geometry(&small).unwrap();
    let dir = root.path().join("e");
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(g));
    let e = DurableObliviStore::create(
        &dir,
        small,
        store.clone(),
        &key,
        StoreId::random(),
        &mut |_, _| {},
    )
    .await
    .unwrap();
    e.shutdown().await.unwrap();
    let refused = [
        ObliviStoreConfig::new(BLOCKS / 2, BS).unwrap(),
        ObliviStoreConfig::new(GROWN, BS * 2).unwrap(),
        ObliviStoreConfig::curious(GROWN, BS, 3).unwrap(),
        ObliviStoreConfig::curious_path(GROWN, BS, 3, 5).unwrap(),
    ];
    for to in refused {
        let new = Arc::new(RecordingStore::new(MemoryStore::new(
            DurableObliviStore::geometry(&to).unwrap(),
        )));
        let e = grow_oblivistore(&dir, store.clone(), new.clone(), &key, fresh_epoch(), to)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("growing adds blocks"), "{e}");
        assert!(new.trace().is_empty());
    }
}

fn tee_config(blocks: u64) -> blindfold_oram::tee::TeeOramConfig {
    blindfold_oram::tee::TeeOramConfig::builder(blocks, BS)
        .arity(4)
        .round_queries(8)
        .build()
        .unwrap()
}

/// The writes of `seed`, made to a fresh TEE engine in `dir` over `store` (the trusted
/// component in this process), then shut down cleanly. Returns the model.
async fn fill_tee(
    dir: &Path,
    store: Arc<dyn Store>,
    key: &MasterKey,
    seed: u64,
) -> HashMap<u64, Vec<u8>> {
    use blindfold_proxy::{DurableTee, Preload};
    let enclave = blindfold_tee::Enclave::new(&DurableTee::tee_key(key), BS as usize);
    let host = Arc::new(blindfold_store::TeeHost::new(store, Arc::new(enclave)));
    let w = writes(seed);
    let tee = DurableTee::create(
        dir,
        tee_config(BLOCKS),
        host,
        key,
        StoreId::random(),
        Preload::none(),
        &mut |_, _| {},
    )
    .await
    .unwrap();
    for (b, data, commit) in &w {
        tee.access(BlockId(*b), Op::Write(data.clone())).await.unwrap();
        if *commit {
            tee.commit().await.unwrap();
        }
    }
    tee.shutdown().await.unwrap();
    model(&w)
}

/// The TEE engine grows (refused until 2026-11-28): every block kept, the new ones zeros, and
/// two stores holding different blocks with different contents grow through exactly the same
/// requests (every old cell read once in cell order, every new cell written once in a fixed
/// order). The grown tree is sealed under a fresh store id: no old cell opens in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tee_engine_grows_with_every_block_kept_and_a_data_independent_trace() {
    use blindfold_proxy::rebuild::rebuild_tee;
    use blindfold_proxy::DurableTee;
    let key = MasterKey::generate();
    let root = tempfile::tempdir().unwrap();
    let mut shapes = Vec::new();
    for seed in [30u64, 40] {
        let dir = root.path().join(format!("tee{seed}"));
        let g = DurableTee::geometry(&tee_config(BLOCKS)).unwrap();
        let old = Arc::new(RecordingStore::new(MemoryStore::new(g)));
        let model = fill_tee(&dir, old.clone(), &key, seed).await;
        old.take_trace();
        let gn = DurableTee::geometry(&tee_config(GROWN)).unwrap();
        let new = Arc::new(RecordingStore::new(MemoryStore::new(gn)));
        let grown = rebuild_tee(
            &dir,
            old.clone(),
            new.clone(),
            &key,
            fresh_epoch(),
            Some(tee_config(GROWN)),
        )
        .await
        .unwrap();
        assert_eq!(grown.blocks_found, model.len() as u64, "{grown:?}");
        assert!(grown.lost.is_empty() && grown.unreadable_cells.is_empty(), "{grown:?}");
        assert!(old.trace().iter().all(|e| e.op == TraceOp::Read || e.op == TraceOp::Flush));
        let read: Vec<u64> = old.trace().iter().flat_map(|e| e.cells.iter().map(|c| c.0)).collect();
        assert_eq!(read, (0..g.cell_count()).collect::<Vec<_>>(), "every old cell once, in order");
        assert!(new.trace().iter().all(|e| e.op != TraceOp::Read));
        let trace = |r: &RecordingStore<MemoryStore>| -> Vec<(TraceOp, Vec<u64>)> {
            r.trace().iter().map(|e| (e.op, e.cells.iter().map(|c| c.0).collect())).collect()
        };
        shapes.push((trace(&old), trace(&new)));
        // The grown engine serves every block, and takes writes to the new ones.
        let enclave = blindfold_tee::Enclave::new(&DurableTee::tee_key(&key), BS as usize);
        let host = Arc::new(blindfold_store::TeeHost::new(
            new.clone() as Arc<dyn Store>,
            Arc::new(enclave),
        ));
        let (tee, _) = DurableTee::open(&dir, host, &key).await.unwrap();
        assert_eq!(tee.config().blocks(), GROWN);
        for i in 0..GROWN {
            let want = model.get(&i).cloned().unwrap_or_else(|| vec![0; BS as usize]);
            assert_eq!(tee.access(BlockId(i), Op::Read).await.unwrap(), want, "block {i}");
        }
        tee.access(BlockId(GROWN - 1), Op::Write(vec![9; BS as usize])).await.unwrap();
        tee.commit().await.unwrap();
        assert_eq!(tee.access(BlockId(GROWN - 1), Op::Read).await.unwrap(), vec![9; BS as usize]);
        tee.settle().await.unwrap();
        let report = tee.verify(|_, _| {}).await.unwrap();
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        tee.shutdown().await.unwrap();
    }
    assert_eq!(shapes[0], shapes[1], "the store could tell the two stores apart");
}
