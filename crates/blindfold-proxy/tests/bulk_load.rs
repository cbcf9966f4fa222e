//! Bulk loading a sealed Path ORAM: contents read back, the store sees every cell written once
//! in a fixed order, tampering after the load is detected, and failures poison the instance.

use std::collections::HashSet;
use std::sync::Arc;

use blindfold_crypto::{CellSealer, MasterKey, StoreId};
use blindfold_oram::{BlockId, OramError, PathOram, PathOramConfig, PosMapMode};
use blindfold_proxy::{ProxyError, SealedPathOram, SealedPathState};
use blindfold_store::{
    CellId, FaultConfig, FaultStore, MemoryStore, RecordingStore, Store, TraceEvent, TraceOp,
};
use rand::{Rng, SeedableRng};
use rand_chacha::{ChaCha20Rng, ChaCha8Rng};

fn sealer(key: &MasterKey) -> CellSealer {
    CellSealer::new(key, StoreId([9; 16]), 0)
}

/// Initial contents of a block, different for every block and `salt`.
fn initial(block: BlockId, size: u32, salt: u64) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(block.0.wrapping_mul(0x9e37_79b9) ^ salt);
    (0..size).map(|_| rng.gen()).collect()
}

/// Cells the store holds: every bucket of every tree except the cached top levels.
fn stored_cells(config: &PathOramConfig) -> HashSet<CellId> {
    let mut out = HashSet::new();
    for t in config.trees() {
        let cached = (1u64 << config.cache_levels().min(t.shape.levels())) - 1;
        out.extend((cached..t.shape.buckets()).map(|b| CellId(t.base + b)));
    }
    out
}

/// Bulk loads a fresh instance over a recording memory store; returns it with the trace of
/// the load.
async fn loaded(
    config: &PathOramConfig,
    seed: u64,
    key: &MasterKey,
    salt: u64,
) -> (SealedPathOram, Arc<RecordingStore<MemoryStore>>, Vec<TraceEvent>) {
    let geometry = SealedPathOram::geometry(config).unwrap();
    let store = Arc::new(RecordingStore::new(MemoryStore::new(geometry)));
    let oram = PathOram::with_seed(config.clone(), seed);
    let mut sealed = SealedPathOram::with_oram(oram, store.clone(), sealer(key)).unwrap();
    let bs = config.block_size();
    let mut seen: Vec<(u64, u64)> = Vec::new();
    sealed
        .bulk_load(|b| initial(b, bs, salt), |done, total| seen.push((done, total)))
        .await
        .unwrap();
    // Progress: from zero to the total, one report per batch.
    let total = stored_cells(config).len() as u64;
    assert_eq!(seen.first(), Some(&(0, total)));
    assert_eq!(seen.last(), Some(&(total, total)));
    assert!(seen.windows(2).all(|w| w[0].0 < w[1].0 && w[1].0 - w[0].0 <= 256));
    let trace = store.take_trace();
    (sealed, store, trace)
}

#[tokio::test]
async fn bulk_load_then_reads_match() {
    let key = MasterKey::generate();
    let mut seed = 0;
    for &z in &[2u32, 4] {
        for posmap in [PosMapMode::InMemory, PosMapMode::Recursive { max_in_memory_entries: 8 }] {
            for &cache in &[0u32, 2] {
                let config = PathOramConfig::builder(300, 32)
                    .z(z)
                    .posmap(posmap)
                    .cache_levels(cache)
                    .build()
                    .unwrap();
                seed += 1;
                let (mut oram, _, trace) = loaded(&config, seed, &key, seed).await;

                // The store saw writes only, every stored cell exactly once.
                assert!(trace.iter().all(|e| e.op == TraceOp::Write));
                let cells: Vec<CellId> = trace.iter().flat_map(|e| e.cells.clone()).collect();
                let unique: HashSet<CellId> = cells.iter().copied().collect();
                assert_eq!(unique.len(), cells.len(), "{config:?}");
                assert_eq!(unique, stored_cells(&config), "{config:?}");

                for b in 0..300u64 {
                    let want = initial(BlockId(b), 32, seed);
                    assert_eq!(oram.read(BlockId(b)).await.unwrap(), want, "block {b}");
                }
                // Writes after the load behave as usual.
                oram.write(BlockId(7), vec![1; 32]).await.unwrap();
                assert_eq!(oram.read(BlockId(7)).await.unwrap(), vec![1; 32]);
                assert_eq!(oram.read(BlockId(8)).await.unwrap(), initial(BlockId(8), 32, seed));
                assert_eq!(oram.oram().stats().accesses, 303);
            }
        }
    }
}

#[tokio::test]
async fn store_view_of_the_load_is_fixed() {
    let key = MasterKey::generate();
    let config = PathOramConfig::builder(1000, 16)
        .posmap(PosMapMode::Recursive { max_in_memory_entries: 4 })
        .cache_levels(1)
        .build()
        .unwrap();
    let (_, _, a) = loaded(&config, 1, &key, 1).await;
    let (_, _, b) = loaded(&config, 2, &key, 2).await;
    let view =
        |t: &[TraceEvent]| t.iter().map(|e| (e.shape(), e.cells.clone())).collect::<Vec<_>>();
    assert_eq!(view(&a), view(&b), "the store's view must not depend on data or leaves");
    assert!(a.len() > 1, "several batches");
}

#[tokio::test]
async fn tampered_cell_after_bulk_load_is_detected() {
    let key = MasterKey::generate();
    let config = PathOramConfig::builder(64, 32).build().unwrap();
    let (mut oram, raw, _) = loaded(&config, 5, &key, 5).await;
    assert_eq!(oram.read(BlockId(3)).await.unwrap(), initial(BlockId(3), 32, 5));
    // Flip one bit of the root bucket, which every path passes through.
    let mut cell = raw.read(&[CellId(0)]).await.unwrap().pop().unwrap();
    cell[40] ^= 0x04;
    raw.write(vec![(CellId(0), cell)]).await.unwrap();
    match oram.read(BlockId(4)).await {
        Err(ProxyError::Integrity { cell: 0, .. }) => {}
        other => panic!("expected an integrity error at cell 0, got {other:?}"),
    }
    assert!(matches!(oram.read(BlockId(4)).await, Err(ProxyError::Poisoned)));

    // A valid cell of the load moved to another place is refused too.
    let (mut oram, raw, _) = loaded(&config, 6, &key, 6).await;
    let leaves = config.trees()[0].shape.leaves();
    let first_leaf = CellId(leaves - 1);
    let other = raw.read(&[CellId(leaves)]).await.unwrap().pop().unwrap();
    raw.write(vec![(first_leaf, other)]).await.unwrap();
    let mut failed = false;
    for i in 0..1000u64 {
        let b = i % 64;
        match oram.read(BlockId(b)).await {
            Ok(d) => assert_eq!(d, initial(BlockId(b), 32, 6), "block {b}"),
            Err(ProxyError::Integrity { cell, .. }) => {
                assert_eq!(cell, first_leaf.0);
                failed = true;
                break;
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(failed, "the swapped leaf bucket is read within 1000 random paths");
}

#[tokio::test]
async fn refused_after_an_access_without_poisoning() {
    let key = MasterKey::generate();
    let config = PathOramConfig::builder(32, 16).build().unwrap();
    let store = Arc::new(MemoryStore::new(SealedPathOram::geometry(&config).unwrap()));
    let mut oram = SealedPathOram::new(config, store, sealer(&key)).unwrap();
    oram.write(BlockId(1), vec![2; 16]).await.unwrap();
    let e = oram.bulk_load(|_| vec![0; 16], |_, _| {}).await.unwrap_err();
    assert!(matches!(e, ProxyError::Oram(OramError::Protocol(_))), "{e}");
    assert_eq!(oram.read(BlockId(1)).await.unwrap(), vec![2; 16]);
}

#[tokio::test]
async fn failures_during_the_load_poison() {
    let key = MasterKey::generate();
    let config = PathOramConfig::builder(600, 16).build().unwrap();
    let g = SealedPathOram::geometry(&config).unwrap();

    // A block of the wrong size.
    let store = Arc::new(MemoryStore::new(g));
    let mut oram = SealedPathOram::new(config.clone(), store, sealer(&key)).unwrap();
    let e =
        oram.bulk_load(|b| vec![0; if b.0 == 599 { 3 } else { 16 }], |_, _| {}).await.unwrap_err();
    assert!(matches!(e, ProxyError::Oram(OramError::WrongBlockSize { got: 3, .. })), "{e}");
    assert!(matches!(oram.read(BlockId(0)).await, Err(ProxyError::Poisoned)));
    assert!(matches!(oram.export_state(), Err(ProxyError::Poisoned)));

    // A store that keeps failing.
    let faults = FaultConfig { seed: 1, error_rate: 1.0, ..FaultConfig::default() };
    let store = Arc::new(FaultStore::new(MemoryStore::new(g), faults));
    let mut oram = SealedPathOram::new(config, store, sealer(&key)).unwrap();
    let e = oram.bulk_load(|_| vec![0; 16], |_, _| {}).await.unwrap_err();
    assert!(matches!(e, ProxyError::Store(_)), "{e}");
    assert!(matches!(oram.bulk_load(|_| vec![0; 16], |_, _| {}).await, Err(ProxyError::Poisoned)));
}

#[tokio::test]
async fn load_survives_transient_faults_and_restarts() {
    let key = MasterKey::generate();
    let config = PathOramConfig::builder(500, 24)
        .posmap(PosMapMode::Recursive { max_in_memory_entries: 16 })
        .build()
        .unwrap();
    let faults = FaultConfig {
        seed: 4,
        error_rate: 0.1,
        timeout_rate: 0.0,
        timeout: std::time::Duration::from_millis(1),
        lost_ack_rate: 0.1,
    };
    let inner = MemoryStore::new(SealedPathOram::geometry(&config).unwrap());
    let store = Arc::new(FaultStore::new(inner, faults));
    let mut oram = SealedPathOram::with_oram(
        PathOram::with_seed(config.clone(), 9),
        store.clone(),
        sealer(&key),
    )
    .unwrap();
    oram.bulk_load(|b| initial(b, 24, 3), |_, _| {}).await.unwrap();
    assert!(store.injected() > 0, "faults were injected");

    // The trusted state after the load carries over to a new instance.
    let json = serde_json::to_vec(&oram.export_state().unwrap()).unwrap();
    drop(oram);
    let state: SealedPathState = serde_json::from_slice(&json).unwrap();
    let mut again =
        SealedPathOram::from_state(state, store, sealer(&key), ChaCha20Rng::seed_from_u64(1))
            .unwrap();
    for b in (0..500u64).step_by(7) {
        assert_eq!(again.read(BlockId(b)).await.unwrap(), initial(BlockId(b), 24, 3));
    }
}

#[test]
fn bulk_load_future_is_send() {
    fn assert_send<T: Send>(_: T) {}
    let config = PathOramConfig::builder(8, 16).build().unwrap();
    let store = Arc::new(MemoryStore::new(SealedPathOram::geometry(&config).unwrap()));
    let mut oram = SealedPathOram::new(config, store, sealer(&MasterKey::generate())).unwrap();
    assert_send(oram.bulk_load(|_| vec![0; 16], |_, _| {}));
}
