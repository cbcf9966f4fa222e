//! Sealed Path ORAM against a `HashMap` model on real stores, plus the security claims of the
//! seal layer: tampering, swapping and rollback of stored cells are detected, never returned.

use std::collections::HashMap;
use std::sync::Arc;

use blindfold_crypto::{CellSealer, MasterKey, StoreId};
use blindfold_oram::{BlockId, Op, PathOram, PathOramConfig, PosMapMode};
use blindfold_proxy::{ProxyError, SealedDirect, SealedPathOram, SealedPathState};
use blindfold_store::{CellId, FaultConfig, FaultStore, FileStore, MemoryStore, Store, SyncMode};
use rand::{Rng, SeedableRng};
use rand_chacha::{ChaCha20Rng, ChaCha8Rng};

fn sealer(key: &MasterKey) -> CellSealer {
    CellSealer::new(key, StoreId([7; 16]), 0)
}

fn config(blocks: u64, block_size: u32) -> PathOramConfig {
    PathOramConfig::builder(blocks, block_size).build().unwrap()
}

async fn check_model(oram: &mut SealedPathOram, ops: usize, seed: u64) -> HashMap<u64, Vec<u8>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = oram.oram().config().blocks();
    let bs = oram.oram().config().block_size() as usize;
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    for i in 0..ops {
        let b = if i % 4 == 0 { rng.gen_range(0..n.min(2)) } else { rng.gen_range(0..n) };
        let expect = model.get(&b).cloned().unwrap_or_else(|| vec![0; bs]);
        if rng.gen_bool(0.4) {
            let data: Vec<u8> = (0..bs).map(|_| rng.gen()).collect();
            let old = oram.access(BlockId(b), Op::Write(data.clone())).await.unwrap();
            assert_eq!(old, expect, "op {i}: previous contents of block {b}");
            model.insert(b, data);
        } else {
            assert_eq!(oram.read(BlockId(b)).await.unwrap(), expect, "op {i}: block {b}");
        }
    }
    model
}

#[tokio::test]
async fn model_grid_on_memory_store() {
    let key = MasterKey::generate();
    let mut seed = 0;
    for &z in &[2u32, 4] {
        for posmap in [PosMapMode::InMemory, PosMapMode::Recursive { max_in_memory_entries: 8 }] {
            for &cache in &[0u32, 2] {
                for &(blocks, bs) in &[(50u64, 16u32), (200, 64)] {
                    let c = PathOramConfig::builder(blocks, bs)
                        .z(z)
                        .posmap(posmap)
                        .cache_levels(cache)
                        .build()
                        .unwrap();
                    let store = Arc::new(MemoryStore::new(SealedPathOram::geometry(&c).unwrap()));
                    seed += 1;
                    let mut oram = SealedPathOram::with_oram(
                        PathOram::with_seed(c, seed),
                        store,
                        sealer(&key),
                    )
                    .unwrap();
                    check_model(&mut oram, 300, seed).await;
                }
            }
        }
    }
}

#[tokio::test]
async fn model_survives_injected_faults_with_retries() {
    let key = MasterKey::generate();
    let c = PathOramConfig::builder(64, 32)
        .posmap(PosMapMode::Recursive { max_in_memory_entries: 4 })
        .build()
        .unwrap();
    let inner = MemoryStore::new(SealedPathOram::geometry(&c).unwrap());
    let faults = FaultConfig {
        seed: 3,
        error_rate: 0.02,
        timeout_rate: 0.01,
        timeout: std::time::Duration::from_millis(1),
        lost_ack_rate: 0.02,
    };
    let store = Arc::new(FaultStore::new(inner, faults));
    let mut oram =
        SealedPathOram::with_oram(PathOram::with_seed(c, 4), store.clone(), sealer(&key)).unwrap();
    check_model(&mut oram, 400, 4).await;
    assert!(store.injected() > 10, "faults were injected: {}", store.injected());
}

#[tokio::test]
async fn state_survives_restart_on_file_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tree.cells");
    let key = MasterKey::generate();
    let c = PathOramConfig::builder(100, 48)
        .posmap(PosMapMode::Recursive { max_in_memory_entries: 10 })
        .cache_levels(1)
        .build()
        .unwrap();
    let g = SealedPathOram::geometry(&c).unwrap();
    let (model, saved) = {
        let store = Arc::new(FileStore::create_or_open(&path, g, SyncMode::OnFlush).unwrap());
        let mut oram =
            SealedPathOram::with_oram(PathOram::with_seed(c, 5), store.clone(), sealer(&key))
                .unwrap();
        let model = check_model(&mut oram, 200, 5).await;
        store.flush().await.unwrap();
        let json = serde_json::to_vec(&oram.export_state().unwrap()).unwrap();
        (model, json)
    };
    let state: SealedPathState = serde_json::from_slice(&saved).unwrap();
    let store = Arc::new(FileStore::create_or_open(&path, g, SyncMode::OnFlush).unwrap());
    let mut oram =
        SealedPathOram::from_state(state, store, sealer(&key), ChaCha20Rng::seed_from_u64(6))
            .unwrap();
    for (b, data) in &model {
        assert_eq!(&oram.read(BlockId(*b)).await.unwrap(), data);
    }
    drop(oram); // releases the file's lock
                // Same store, wrong key: nothing decrypts.
    let state: SealedPathState = serde_json::from_slice(&saved).unwrap();
    let store = Arc::new(FileStore::create_or_open(&path, g, SyncMode::OnFlush).unwrap());
    let mut wrong = SealedPathOram::from_state(
        state,
        store,
        sealer(&MasterKey::generate()),
        ChaCha20Rng::seed_from_u64(6),
    )
    .unwrap();
    let b = *model.keys().next().unwrap();
    assert!(matches!(wrong.read(BlockId(b)).await, Err(ProxyError::Integrity { .. })));
}

/// A filled ORAM plus a handle on the raw cells beneath it.
async fn filled() -> (SealedPathOram, Arc<MemoryStore>, HashMap<u64, Vec<u8>>) {
    let key = MasterKey::generate();
    let c = config(32, 64);
    let raw = Arc::new(MemoryStore::new(SealedPathOram::geometry(&c).unwrap()));
    let mut oram =
        SealedPathOram::with_oram(PathOram::with_seed(c, 8), raw.clone(), sealer(&key)).unwrap();
    let mut model = HashMap::new();
    for b in 0..32u64 {
        let data = vec![b as u8 + 1; 64];
        oram.write(BlockId(b), data.clone()).await.unwrap();
        model.insert(b, data);
    }
    (oram, raw, model)
}

/// Runs reads until one fails; asserts that every read before it returned correct data and
/// that the failure is an integrity error.
async fn expect_integrity_error(oram: &mut SealedPathOram, model: &HashMap<u64, Vec<u8>>) {
    // The root bucket (cell 0) is on every path, so the very next access must fail.
    match oram.read(BlockId(3)).await {
        Err(ProxyError::Integrity { cell: 0, .. }) => {}
        Ok(d) => panic!(
            "tampering not detected; read returned {} bytes (correct: {})",
            d.len(),
            d == model[&3]
        ),
        Err(e) => panic!("expected an integrity error, got {e}"),
    }
    // The instance refuses to continue rather than risk inconsistent state.
    assert!(matches!(oram.read(BlockId(3)).await, Err(ProxyError::Poisoned)));
}

#[tokio::test]
async fn flipped_byte_is_detected() {
    for position in [0usize, 5, 20, 100, 300] {
        let (mut oram, raw, model) = filled().await;
        let mut cell = raw.read(&[CellId(0)]).await.unwrap().pop().unwrap();
        let i = position % cell.len();
        cell[i] ^= 0x01;
        raw.write(vec![(CellId(0), cell)]).await.unwrap();
        expect_integrity_error(&mut oram, &model).await;
    }
    // ...and the last byte (inside the tag).
    let (mut oram, raw, model) = filled().await;
    let mut cell = raw.read(&[CellId(0)]).await.unwrap().pop().unwrap();
    *cell.last_mut().unwrap() ^= 0x80;
    raw.write(vec![(CellId(0), cell)]).await.unwrap();
    expect_integrity_error(&mut oram, &model).await;
}

#[tokio::test]
async fn swapped_cells_are_detected() {
    let (mut oram, raw, model) = filled().await;
    let cells = raw.read(&[CellId(0), CellId(1)]).await.unwrap();
    raw.write(vec![(CellId(0), cells[1].clone()), (CellId(1), cells[0].clone())]).await.unwrap();
    expect_integrity_error(&mut oram, &model).await;
}

#[tokio::test]
async fn rolled_back_cell_is_detected() {
    let (mut oram, raw, model) = filled().await;
    let old = raw.read(&[CellId(0)]).await.unwrap().pop().unwrap();
    // One more access rewrites the root under a new version...
    oram.read(BlockId(1)).await.unwrap();
    // ...and the store replays the older, perfectly valid ciphertext.
    raw.write(vec![(CellId(0), old)]).await.unwrap();
    expect_integrity_error(&mut oram, &model).await;
}

#[tokio::test]
async fn rolled_back_whole_store_is_detected() {
    let (mut oram, raw, model) = filled().await;
    let all: Vec<CellId> = (0..raw.geometry().cell_count()).map(CellId).collect();
    let snapshot = raw.read(&all).await.unwrap();
    for b in 0..8u64 {
        oram.write(BlockId(b), vec![0xEE; 64]).await.unwrap();
    }
    raw.write(all.iter().copied().zip(snapshot).collect()).await.unwrap();
    expect_integrity_error(&mut oram, &model).await;
}

#[tokio::test]
async fn direct_baseline_is_sealed_too() {
    let key = MasterKey::generate();
    let raw = Arc::new(MemoryStore::new(SealedDirect::geometry(8, 32).unwrap()));
    let d = SealedDirect::new(raw.clone(), sealer(&key), 32).unwrap();
    assert_eq!(d.read(BlockId(2)).await.unwrap(), vec![0; 32]);
    d.write(BlockId(2), vec![9; 32]).await.unwrap();
    assert_eq!(d.read(BlockId(2)).await.unwrap(), vec![9; 32]);
    let old = raw.read(&[CellId(2)]).await.unwrap().pop().unwrap();
    d.write(BlockId(2), vec![10; 32]).await.unwrap();
    raw.write(vec![(CellId(2), old)]).await.unwrap();
    assert!(matches!(d.read(BlockId(2)).await, Err(ProxyError::Integrity { cell: 2, .. })));
    assert!(d.write(BlockId(2), vec![1; 31]).await.is_err());
    assert!(d.read(BlockId(8)).await.is_err());
}

#[tokio::test]
async fn mismatched_store_is_refused() {
    let key = MasterKey::generate();
    let c = config(32, 64);
    let g = SealedPathOram::geometry(&c).unwrap();
    let small = Arc::new(MemoryStore::new(
        blindfold_store::Geometry::new(g.cell_count() - 1, g.cell_size()).unwrap(),
    ));
    let e = SealedPathOram::new(c.clone(), small, sealer(&key)).unwrap_err();
    assert!(matches!(e, ProxyError::Geometry { .. }), "{e}");
    let other = Arc::new(MemoryStore::new(
        blindfold_store::Geometry::new(g.cell_count(), g.cell_size() + 1).unwrap(),
    ));
    assert!(SealedPathOram::new(c, other, sealer(&key)).is_err());
}
