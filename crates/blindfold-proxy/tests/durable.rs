//! Crash consistency of `DurablePathOram`: whatever instant the process dies at — before, while
//! or after its redo record is written, or in the middle of writing cells to the store — a
//! restart reads back every committed write byte for byte, and nothing else.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use blindfold_crypto::{MasterKey, StoreId};
use blindfold_oram::{BlockId, PathOramConfig, PosMapMode};
use blindfold_proxy::{DurablePathOram, ProxyError};
use blindfold_store::{CellId, FileStore, Geometry, MemoryStore, Store, SyncMode};
use blindfold_testkit::DyingStore;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn config() -> PathOramConfig {
    config_cached(0)
}

/// The test configuration with the top `levels` levels of every tree in trusted memory: their
/// changes travel in the redo records instead of the store.
fn config_cached(levels: u32) -> PathOramConfig {
    PathOramConfig::builder(64, 32)
        .posmap(PosMapMode::Recursive { max_in_memory_entries: 8 })
        .cache_levels(levels)
        .build()
        .unwrap()
}

#[tokio::test]
async fn committed_writes_survive_a_crash_at_any_point() {
    let key = MasterKey::generate();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for trial in 0..80u64 {
        // Every third trial caches the top two levels of each tree in trusted memory. Even
        // trials keep two slots per cell (commits log no cell contents), odd ones overwrite
        // cells in place after logging them.
        let config = config_cached(if trial % 3 == 2 { 2 } else { 0 });
        let dir = tempfile::tempdir().unwrap();
        let geometry = if trial % 2 == 0 {
            DurablePathOram::geometry(&config).unwrap()
        } else {
            blindfold_proxy::SealedPathOram::geometry(&config).unwrap()
        };
        let backing: Arc<dyn Store> = Arc::new(MemoryStore::new(geometry));
        let mut oram =
            DurablePathOram::create(dir.path(), config, backing.clone(), &key, StoreId::random())
                .await
                .unwrap();
        assert_eq!(oram.two_slots(), trial % 2 == 0);
        let mut acked: HashMap<u64, Vec<u8>> = HashMap::new();
        // Some committed history, with occasional checkpoints.
        for i in 0..rng.gen_range(1..20) {
            let b = rng.gen_range(0..64);
            let data = vec![(trial * 31 + i) as u8; 32];
            oram.write(BlockId(b), data.clone()).await.unwrap();
            // Reads change the trusted state too (remapping): they must survive as well.
            let r = rng.gen_range(0..64);
            oram.read(BlockId(r)).await.unwrap();
            oram.commit().await.unwrap();
            acked.insert(b, data);
            if rng.gen_bool(0.1) {
                oram.checkpoint().unwrap();
            }
        }
        drop(oram);

        // Reopen over a store that dies after a random number of cell writes, then do one more
        // write + commit that may be cut anywhere.
        let dying = Arc::new(DyingStore::new(backing.clone(), rng.gen_range(0..40)));
        let b = rng.gen_range(0..64);
        let new = vec![0xEE; 32];
        let old = acked.get(&b).cloned().unwrap_or_else(|| vec![0; 32]);
        // The store may even die while the restart replays the log (a crash during recovery).
        let outcome = async {
            let (mut oram, _) = DurablePathOram::open(dir.path(), dying, &key).await?;
            oram.write(BlockId(b), new.clone()).await?;
            oram.commit().await
        }
        .await;
        let committed = outcome.is_ok();
        if let Err(e) = &outcome {
            assert!(matches!(e, ProxyError::Store(_)), "trial {trial}: {e}");
        }
        // Sometimes the crash also tears the end of the redo log.
        if rng.gen_bool(0.3) {
            let mut f =
                std::fs::OpenOptions::new().append(true).open(dir.path().join("redo.log")).unwrap();
            let garbage: Vec<u8> = (0..rng.gen_range(1..300)).map(|_| rng.gen()).collect();
            f.write_all(&garbage).unwrap();
        }

        // Restart on the real store.
        let (mut oram, _rec) =
            DurablePathOram::open(dir.path(), backing.clone(), &key).await.unwrap();
        let got = oram.read(BlockId(b)).await.unwrap();
        if committed {
            assert_eq!(got, new, "trial {trial}: committed write lost");
        } else {
            assert!(got == new || got == old, "trial {trial}: block {b} is neither old nor new");
        }
        if committed {
            acked.insert(b, new.clone());
        } else {
            acked.insert(b, got.clone());
        }
        for (blk, data) in &acked {
            assert_eq!(&oram.read(BlockId(*blk)).await.unwrap(), data, "trial {trial} block {blk}");
        }
        oram.commit().await.unwrap();
        let report = oram.verify(|_, _| {}).await.unwrap();
        assert!(report.failures.is_empty(), "trial {trial}: {:?}", report.failures);
    }
}

#[tokio::test]
async fn state_survives_restarts_on_a_file_store() {
    let dir = tempfile::tempdir().unwrap();
    let key = MasterKey::generate();
    let geometry = blindfold_proxy::SealedPathOram::geometry(&config()).unwrap();
    let path = dir.path().join("cells");
    let state = dir.path().join("state");
    let open_store = || -> Arc<dyn Store> {
        Arc::new(FileStore::create_or_open(&path, geometry, SyncMode::OnFlush).unwrap())
    };
    let mut model = HashMap::new();
    let mut oram = DurablePathOram::create(&state, config(), open_store(), &key, StoreId::random())
        .await
        .unwrap();
    oram.set_log_limit(10_000); // force checkpoints along the way
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for round in 0..5u8 {
        for _ in 0..30 {
            let b = rng.gen_range(0..64);
            let data: Vec<u8> = (0..32).map(|_| rng.gen()).collect();
            oram.write(BlockId(b), data.clone()).await.unwrap();
            model.insert(b, data);
        }
        oram.commit().await.unwrap();
        drop(oram);
        let (reopened, rec) = DurablePathOram::open(&state, open_store(), &key).await.unwrap();
        assert_eq!(rec.torn_bytes, 0, "round {round}");
        oram = reopened;
        for (b, d) in &model {
            assert_eq!(&oram.read(BlockId(*b)).await.unwrap(), d, "round {round} block {b}");
        }
    }
    // Tampering with the cell file is caught by verify. (Checkpoint first: replaying the redo
    // log at the next start would otherwise rewrite, and so repair, the cell.)
    oram.commit().await.unwrap();
    oram.checkpoint().unwrap();
    drop(oram);
    let raw = FileStore::create_or_open(&path, geometry, SyncMode::OnFlush).unwrap();
    let mut cell = raw.read(&[CellId(0)]).await.unwrap().pop().unwrap();
    cell[40] ^= 1;
    raw.write(vec![(CellId(0), cell)]).await.unwrap();
    drop(raw);
    let (mut oram, _) = DurablePathOram::open(&state, open_store(), &key).await.unwrap();
    let report = oram.verify(|_, _| {}).await.unwrap();
    assert_eq!(report.failures.len(), 1, "{report:?}");
    assert_eq!(report.failures[0].0, 0);
    assert!(report.cells_checked > 10);
    // And an access through the damaged root fails with an integrity error, not wrong data.
    assert!(matches!(oram.read(BlockId(1)).await, Err(ProxyError::Integrity { cell: 0, .. })));
}

#[tokio::test]
async fn refuses_to_create_twice_and_checks_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let key = MasterKey::generate();
    let g = blindfold_proxy::SealedPathOram::geometry(&config()).unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(g));
    DurablePathOram::create(dir.path(), config(), store.clone(), &key, StoreId::random())
        .await
        .unwrap();
    assert!(DurablePathOram::exists(dir.path()));
    let again = DurablePathOram::create(dir.path(), config(), store, &key, StoreId::random()).await;
    assert!(again.is_err());
    let small: Arc<dyn Store> =
        Arc::new(MemoryStore::new(Geometry::new(g.cell_count(), g.cell_size() - 1).unwrap()));
    assert!(matches!(
        DurablePathOram::open(dir.path(), small, &key).await,
        Err(ProxyError::Geometry { .. })
    ));
}

/// `access_many` runs a batch of distinct blocks on paths fetched in one request: it must
/// agree with a `HashMap` model, with the position map in memory (batched) or recursive (one
/// by one), with or without cached levels, and across commits and restarts.
#[tokio::test]
async fn batched_accesses_match_a_model() {
    use blindfold_oram::Op;
    let key = MasterKey::generate();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for (posmap, cache) in [
        (PosMapMode::InMemory, 0),
        (PosMapMode::InMemory, 2),
        (PosMapMode::Recursive { max_in_memory_entries: 8 }, 1),
    ] {
        let config =
            PathOramConfig::builder(128, 32).posmap(posmap).cache_levels(cache).build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let geometry = blindfold_proxy::SealedPathOram::geometry(&config).unwrap();
        let backing: Arc<dyn Store> = Arc::new(MemoryStore::new(geometry));
        let mut oram =
            DurablePathOram::create(dir.path(), config, backing.clone(), &key, StoreId::random())
                .await
                .unwrap();
        oram.set_max_overlay(40); // commits in the middle of batches too
        let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
        for round in 0..60u32 {
            let n = rng.gen_range(1..12);
            let mut blocks: Vec<u64> = Vec::new();
            while blocks.len() < n {
                let b = rng.gen_range(0..128);
                if !blocks.contains(&b) {
                    blocks.push(b);
                }
            }
            let ops: Vec<(BlockId, Op)> = blocks
                .iter()
                .map(|&b| {
                    if rng.gen_bool(0.5) {
                        (BlockId(b), Op::Read)
                    } else {
                        (BlockId(b), Op::Write(vec![rng.gen(); 32]))
                    }
                })
                .collect();
            let expect: Vec<Vec<u8>> = ops
                .iter()
                .map(|(b, _)| model.get(&b.0).cloned().unwrap_or_else(|| vec![0; 32]))
                .collect();
            for (b, op) in &ops {
                if let Op::Write(d) = op {
                    model.insert(b.0, d.clone());
                }
            }
            let got = oram
                .access_many(ops)
                .await
                .unwrap_or_else(|e| panic!("{posmap:?} cache {cache} round {round}: {e}"));
            assert_eq!(got, expect, "{posmap:?} cache {cache} round {round}");
            if round % 20 == 19 {
                oram.commit().await.unwrap();
                drop(oram);
                oram = DurablePathOram::open(dir.path(), backing.clone(), &key).await.unwrap().0;
                oram.set_max_overlay(40);
            }
        }
        assert!(
            oram.access_many(vec![(BlockId(1), Op::Read), (BlockId(1), Op::Read)]).await.is_ok(),
            "a repeated block falls back to one-by-one accesses"
        );
    }
}

/// What the store sees of a batch: one read of the union of the batch's paths, whose size
/// depends only on the random leaves — the same distribution whether the batch touches the
/// same blocks every time or fresh ones.
#[tokio::test]
async fn a_batch_is_one_read_whose_size_does_not_depend_on_the_blocks() {
    use blindfold_oram::Op;
    use blindfold_store::{RecordingStore, TraceOp};
    let key = MasterKey::generate();
    let config = PathOramConfig::builder(1024, 16).build().unwrap();
    // (mean, standard error of the mean) of the union's size, per workload.
    let mut stats = Vec::new();
    for workload in ["same", "fresh"] {
        let dir = tempfile::tempdir().unwrap();
        let geometry = blindfold_proxy::SealedPathOram::geometry(&config).unwrap();
        let recording = Arc::new(RecordingStore::new(MemoryStore::new(geometry)));
        let mut oram = DurablePathOram::create(
            dir.path(),
            config.clone(),
            recording.clone() as Arc<dyn Store>,
            &key,
            StoreId::random(),
        )
        .await
        .unwrap();
        oram.set_max_overlay(usize::MAX); // no commits inside the measured batches
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut unions = Vec::new();
        for round in 0..ROUNDS {
            let blocks: Vec<u64> = match workload {
                "same" => (0..8).collect(),
                _ => (0..8).map(|i| (round * 8 + i) % 1024).collect(),
            };
            let ops = blocks.iter().map(|&b| (BlockId(b), Op::Write(vec![rng.gen(); 16])));
            recording.clear();
            oram.access_many(ops.collect()).await.unwrap();
            let trace = recording.take_trace();
            let reads: Vec<_> = trace.iter().filter(|e| e.op == TraceOp::Read).collect();
            assert_eq!(reads.len(), 1, "{workload} round {round}: one read request per batch");
            assert!(trace.iter().all(|e| e.op == TraceOp::Read), "writes wait for the commit");
            unions.push(reads[0].cells.len() as f64);
            if round % 50 == 49 {
                oram.commit().await.unwrap();
            }
        }
        let n = unions.len() as f64;
        let mean = unions.iter().sum::<f64>() / n;
        let var = unions.iter().map(|u| (u - mean).powi(2)).sum::<f64>() / (n - 1.0);
        stats.push((mean, (var / n).sqrt()));
    }
    // 8 paths below a shared top: the union is about 49 cells either way. The two means may
    // differ by chance; five standard errors of the difference (about 1 cell at 600 rounds)
    // make a false alarm rarer than one run in a million, while a batch that fetched per
    // block (caught above) or leaked reuse of the same blocks (paths overlapping more, or
    // less, than random ones) moves the mean by several cells.
    let ((m0, se0), (m1, se1)) = (stats[0], stats[1]);
    let tolerance = 5.0 * (se0 * se0 + se1 * se1).sqrt();
    eprintln!("union: same {m0:.2} ± {se0:.2}, fresh {m1:.2} ± {se1:.2}, tolerance {tolerance:.2}");
    assert!(
        (m0 - m1).abs() < tolerance,
        "mean cells per batch read: same blocks {m0:.2} ± {se0:.2}, fresh blocks {m1:.2} ± \
         {se1:.2}; differ by more than {tolerance:.2}"
    );
    assert!(tolerance < 2.0, "too noisy to tell anything: tolerance {tolerance:.2} cells");
}

/// Batches per workload in the test above.
const ROUNDS: u64 = 600;

/// With two slots per cell, the store holds a committed copy and an older (or newer,
/// uncommitted) one of every written cell. Damage to the committed copy is caught; damage to
/// the other copy is harmless; serving the other copy in place of the committed one (a
/// rollback, or swapping the two slots) is caught.
#[tokio::test]
async fn two_slots_detect_tampering_rollback_and_swaps() {
    let key = MasterKey::generate();
    let config = PathOramConfig::builder(64, 32).build().unwrap();
    let n = config.total_cells();
    let raw = Arc::new(MemoryStore::new(DurablePathOram::geometry(&config).unwrap()));
    let dir = tempfile::tempdir().unwrap();
    let mut oram =
        DurablePathOram::create(dir.path(), config, raw.clone(), &key, StoreId::random())
            .await
            .unwrap();
    assert!(oram.two_slots());
    // Several commits: the root (cell 0) is on every path, so both of its slots get written.
    for i in 0..6u8 {
        oram.write(BlockId(u64::from(i)), vec![i; 32]).await.unwrap();
        oram.commit().await.unwrap();
    }
    oram.checkpoint().unwrap();
    drop(oram);
    let get = |c: u64| {
        let raw = raw.clone();
        async move { raw.read(&[CellId(c)]).await.unwrap().pop().unwrap() }
    };
    let put = |c: u64, d: Vec<u8>| {
        let raw = raw.clone();
        async move { raw.write(vec![(CellId(c), d)]).await.unwrap() }
    };
    let (slot0, slot1) = (get(0).await, get(n).await);
    assert_ne!(slot0, slot1, "both slots of the root were written");
    assert!(failures(dir.path(), raw.clone(), &key).await.is_empty());

    // Flip a byte in each slot in turn: exactly one of them (the committed copy) matters.
    let mut caught = Vec::new();
    for (phys, original) in [(0, &slot0), (n, &slot1)] {
        let mut bad = original.clone();
        bad[40] ^= 1;
        put(phys, bad).await;
        caught.push(failures(dir.path(), raw.clone(), &key).await == vec![0]);
        put(phys, original.clone()).await;
    }
    assert_eq!(caught.iter().filter(|c| **c).count(), 1, "{caught:?}");
    let (current, other) = if caught[0] { (0, n) } else { (n, 0) };

    // Rollback: the older copy served as the committed one.
    let older = get(other).await;
    let newer = get(current).await;
    put(current, older.clone()).await;
    assert_eq!(failures(dir.path(), raw.clone(), &key).await, vec![0]);
    // Swapping the two slots is no better.
    put(other, newer.clone()).await;
    assert_eq!(failures(dir.path(), raw.clone(), &key).await, vec![0]);
    // Put back, all is well again; an access through the root then works.
    put(current, newer).await;
    put(other, older).await;
    let (mut oram, _) = DurablePathOram::open(dir.path(), raw.clone(), &key).await.unwrap();
    assert_eq!(oram.read(BlockId(3)).await.unwrap(), vec![3; 32]);
    oram.commit().await.unwrap();
    assert!(oram.verify(|_, _| {}).await.unwrap().failures.is_empty());
}

/// The cells `verify` finds damaged after reopening `dir` over `raw`.
async fn failures(dir: &std::path::Path, raw: Arc<MemoryStore>, key: &MasterKey) -> Vec<u64> {
    let (mut oram, _) = DurablePathOram::open(dir, raw, key).await.unwrap();
    oram.verify(|_, _| {}).await.unwrap().failures.into_iter().map(|f| f.0).collect()
}
