//! Sealed Path ORAM over real S3 (MinIO) and Redis servers, the ones `scripts/test.sh` starts
//! (see `blindfold_testkit::servers`): the `HashMap` model over a small parameter grid, bulk
//! load and restart from exported state, and tampering done directly on the server detected.
//!
//! Without the servers these tests print a notice and pass, except under `CI=true`, where a
//! missing server fails them.

use std::collections::HashMap;
use std::sync::Arc;

use blindfold_crypto::{CellSealer, MasterKey, StoreId};
use blindfold_oram::{BlockId, Op, PathOram, PathOramConfig, PosMapMode};
use blindfold_proxy::{ProxyError, SealedPathOram, SealedPathState};
use blindfold_store::{open_store, CellId, StoreUrl};
use blindfold_testkit::servers;
use rand::{Rng, SeedableRng};
use rand_chacha::{ChaCha20Rng, ChaCha8Rng};

fn sealer(key: &MasterKey) -> CellSealer {
    CellSealer::new(key, StoreId([5; 16]), 0)
}

/// Random reads and writes (40 % writes, a quarter of them on two hot blocks) checked against
/// a `HashMap`; returns the model.
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

/// The model over a grid of Z, position map and cached levels, one array per configuration
/// under one fresh URL.
async fn model_grid(url: StoreUrl, ops: usize) {
    let key = MasterKey::generate();
    let mut seed = 100;
    for &z in &[2u32, 4] {
        for posmap in [PosMapMode::InMemory, PosMapMode::Recursive { max_in_memory_entries: 8 }] {
            for &cache in &[0u32, 2] {
                let c = PathOramConfig::builder(120, 48)
                    .z(z)
                    .posmap(posmap)
                    .cache_levels(cache)
                    .build()
                    .unwrap();
                seed += 1;
                let name = format!("grid-{seed}");
                let store =
                    open_store(&url, &name, SealedPathOram::geometry(&c).unwrap()).await.unwrap();
                let mut oram =
                    SealedPathOram::with_oram(PathOram::with_seed(c, seed), store, sealer(&key))
                        .unwrap();
                check_model(&mut oram, ops, seed).await;
            }
        }
    }
}

#[tokio::test]
async fn path_oram_model_grid_over_s3() {
    let Some(url) = servers::s3_url("proxy-s3-grid", "") else { return };
    model_grid(url, 120).await;
}

#[tokio::test]
async fn path_oram_model_grid_over_redis() {
    let Some(url) = servers::redis_url("proxy-redis-grid", "") else { return };
    model_grid(url, 300).await;
}

/// Bulk load, a workload, export the trusted state, drop everything, reopen the store by URL in
/// a "new process" and read every block back; then tamper with a cell on the server.
async fn load_restart_tamper(url: StoreUrl) {
    let key = MasterKey::generate();
    let c = PathOramConfig::builder(200, 64)
        .posmap(PosMapMode::Recursive { max_in_memory_entries: 16 })
        .build()
        .unwrap();
    let g = SealedPathOram::geometry(&c).unwrap();
    let (model, saved) = {
        let store = open_store(&url, "tree", g).await.unwrap();
        let mut oram =
            SealedPathOram::with_oram(PathOram::with_seed(c.clone(), 7), store, sealer(&key))
                .unwrap();
        let initial = |b: BlockId| vec![(b.0 % 251) as u8 + 1; 64];
        oram.bulk_load(initial, |_, _| {}).await.unwrap();
        let mut model: HashMap<u64, Vec<u8>> = (0..200).map(|b| (b, initial(BlockId(b)))).collect();
        model.extend(check_model_from(&mut oram, &model, 150, 8).await);
        oram.store().flush().await.unwrap();
        let json = serde_json::to_vec(&oram.export_state().unwrap()).unwrap();
        (model, json)
    };

    let state: SealedPathState = serde_json::from_slice(&saved).unwrap();
    let store = open_store(&url, "tree", g).await.unwrap();
    let mut oram =
        SealedPathOram::from_state(state, store, sealer(&key), ChaCha20Rng::seed_from_u64(9))
            .unwrap();
    for b in 0..200u64 {
        assert_eq!(oram.read(BlockId(b)).await.unwrap(), model[&b], "block {b} after restart");
    }

    // The server's operator flips one bit of the root bucket (on every path) through a second
    // handle on the same array: the next access must fail as an integrity error, never return
    // data.
    let raw = open_store(&url, "tree", g).await.unwrap();
    let mut root = raw.read(&[CellId(0)]).await.unwrap().pop().unwrap();
    root[40] ^= 1;
    raw.write(vec![(CellId(0), root)]).await.unwrap();
    match oram.read(BlockId(3)).await {
        Err(ProxyError::Integrity { .. }) => {}
        other => panic!("tampering not detected: {other:?}"),
    }
    assert!(matches!(oram.read(BlockId(3)).await, Err(ProxyError::Poisoned)));
}

/// Like [`check_model`] but starting from `initial` contents.
async fn check_model_from(
    oram: &mut SealedPathOram,
    initial: &HashMap<u64, Vec<u8>>,
    ops: usize,
    seed: u64,
) -> HashMap<u64, Vec<u8>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = oram.oram().config().blocks();
    let bs = oram.oram().config().block_size() as usize;
    let mut model = initial.clone();
    for i in 0..ops {
        let b = rng.gen_range(0..n);
        if rng.gen_bool(0.5) {
            let data: Vec<u8> = (0..bs).map(|_| rng.gen()).collect();
            let old = oram.access(BlockId(b), Op::Write(data.clone())).await.unwrap();
            assert_eq!(old, model[&b], "op {i}: previous contents of block {b}");
            model.insert(b, data);
        } else {
            assert_eq!(oram.read(BlockId(b)).await.unwrap(), model[&b], "op {i}: block {b}");
        }
    }
    model
}

#[tokio::test]
async fn bulk_load_restart_and_tampering_over_s3() {
    let Some(url) = servers::s3_url("proxy-s3-restart", "") else { return };
    load_restart_tamper(url).await;
}

#[tokio::test]
async fn bulk_load_restart_and_tampering_over_redis() {
    let Some(url) = servers::redis_url("proxy-redis-restart", "") else { return };
    load_restart_tamper(url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_oram_over_s3_on_a_multi_threaded_runtime() {
    let Some(url) = servers::s3_url("proxy-s3-mt", "") else { return };
    let key = MasterKey::generate();
    let c = PathOramConfig::builder(64, 32).build().unwrap();
    let store = open_store(&url, "t", SealedPathOram::geometry(&c).unwrap()).await.unwrap();
    let store: Arc<dyn blindfold_store::Store> = store;
    let mut oram =
        SealedPathOram::with_oram(PathOram::with_seed(c, 11), store, sealer(&key)).unwrap();
    check_model(&mut oram, 100, 11).await;
}
