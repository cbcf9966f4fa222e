//! What the store sees of Onion ORAM with real Damgård–Jurik, on recorded traces of both arrays:
//! the same shape for every workload, evictions on the public schedule only, every select over
//! all slots of a path, leaves uniform.
#![cfg(feature = "onion")]

use std::sync::Arc;

use blindfold_crypto::{CellSealer, MasterKey, StoreId};
use blindfold_dj::SecretKey;
use blindfold_oram::{BlockId, BucketId, OnionOram, OnionOramConfig, TreeShape};
use blindfold_proxy::SealedOnionOram;
use blindfold_store::{
    CellId, MemoryStore, RecordingStore, SelectStore, Store, TraceEvent, TraceOp,
};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

const BS: u32 = 16;

struct Run {
    meta: Vec<TraceEvent>,
    data: Vec<TraceEvent>,
    config: OnionOramConfig,
}

/// Runs `ops` (block, write?) on a fresh ORAM (same key, same scheme seed) and returns both
/// arrays' traces.
async fn run(ops: &[(u64, bool)], seed: u64) -> Run {
    let mut rng = ChaCha20Rng::seed_from_u64(77);
    let key = SecretKey::generate(256, &mut rng).unwrap();
    let config = OnionOramConfig::builder(8, BS).height(2).build().unwrap();
    let meta = Arc::new(RecordingStore::new(MemoryStore::new(
        SealedOnionOram::meta_geometry(&config).unwrap(),
    )));
    let data = Arc::new(RecordingStore::new(MemoryStore::new(
        SealedOnionOram::data_geometry(&config, key.public()).unwrap(),
    )));
    let sealer = CellSealer::new(&MasterKey::generate(), StoreId::random(), 0);
    let mut oram = SealedOnionOram::new(
        OnionOram::with_seed(config.clone(), seed),
        meta.clone() as Arc<dyn Store>,
        data.clone() as Arc<dyn SelectStore>,
        sealer,
        key,
    )
    .unwrap();
    for &(b, w) in ops {
        if w {
            oram.write(BlockId(b), vec![b as u8; BS as usize]).await.unwrap();
        } else {
            oram.read(BlockId(b)).await.unwrap();
        }
    }
    Run { meta: meta.trace(), data: data.trace(), config }
}

/// The public shape of an event: its kind, sizes and group structure (no addresses).
fn shape(e: &TraceEvent) -> (TraceOp, usize, Vec<(u32, u32)>, Vec<u32>, u64) {
    (e.op, e.cells.len(), e.ranges.clone(), e.groups.clone(), e.bytes)
}

fn path_of(shape: TreeShape, leaf_bucket: u64) -> Vec<u64> {
    let leaf = blindfold_oram::Leaf(leaf_bucket - (shape.leaves() - 1));
    (0..=shape.height()).map(|l| shape.bucket_on_path(leaf, l).0).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_workload_looks_the_same() {
    let n = 18;
    let hammer: Vec<(u64, bool)> = (0..n).map(|i| (3, i % 2 == 0)).collect();
    let scan: Vec<(u64, bool)> = (0..n).map(|i| (i % 8, true)).collect();
    let mixed: Vec<(u64, bool)> = (0..n).map(|i| ((i * 5) % 8, i % 3 == 0)).collect();
    let runs = [run(&hammer, 1).await, run(&scan, 1).await, run(&mixed, 1).await];
    let c = &runs[0].config;
    let shape_t = c.shape();
    for r in &runs[1..] {
        // Byte counts of selects vary only with ciphertext encodings' fixed lengths: identical.
        let a: Vec<_> = runs[0].data.iter().map(shape).collect();
        let b: Vec<_> = r.data.iter().map(shape).collect();
        assert_eq!(a, b, "data-array shapes differ between workloads");
        let a: Vec<_> = runs[0].meta.iter().map(shape).collect();
        let b: Vec<_> = r.meta.iter().map(shape).collect();
        assert_eq!(a, b, "metadata shapes differ between workloads");
        // Evictions (write_select batches) touch exactly the same cells: the public schedule.
        let ev = |run: &Run| -> Vec<Vec<CellId>> {
            run.data
                .iter()
                .filter(|e| e.op == TraceOp::WriteSelect)
                .map(|e| e.cells.iter().chain(&e.targets).copied().collect())
                .collect()
        };
        assert_eq!(ev(&runs[0]), ev(r), "evictions differ between workloads");
    }
    for r in &runs {
        let selects: Vec<&TraceEvent> =
            r.data.iter().filter(|e| e.op == TraceOp::ReadSelectCombined).collect();
        assert_eq!(selects.len(), n as usize, "one combined select per access");
        assert_eq!(
            r.data.iter().filter(|e| e.op == TraceOp::WriteSelect).count(),
            n as usize / c.a() as usize,
            "one eviction every A accesses"
        );
        // Each combined select covers every slot of one whole path, nothing else.
        for e in selects {
            let leaf_cell = e.cells.last().unwrap().0;
            let leaf_bucket = (0..c.buckets())
                .find(|&b| {
                    (0..c.slots_of(BucketId(b))).any(|s| c.cell(BucketId(b), s).0 == leaf_cell)
                })
                .unwrap();
            let mut want: Vec<u64> = path_of(shape_t, leaf_bucket)
                .into_iter()
                .flat_map(|b| (0..c.slots_of(BucketId(b))).map(move |s| (b, s)))
                .map(|(b, s)| c.cell(BucketId(b), s).0)
                .collect();
            let mut got: Vec<u64> = e.cells.iter().map(|c| c.0).collect();
            want.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, want, "a select over exactly one path's slots");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaves_read_are_uniform_while_one_block_is_hammered() {
    // The metadata read of each access is a path; its leaf is the last bucket.
    let n = 240;
    let ops: Vec<(u64, bool)> = (0..n).map(|i| (5, i % 4 == 0)).collect();
    let r = run(&ops, 2).await;
    let shape_t = r.config.shape();
    let first_leaf = shape_t.leaves() - 1;
    let mut counts = vec![0f64; shape_t.leaves() as usize];
    let mut accesses = 0;
    for e in r.meta.iter().filter(|e| e.op == TraceOp::Read) {
        // Access reads are one path (height + 1 cells); eviction reads add the siblings.
        if e.cells.len() == shape_t.levels() as usize {
            counts[(e.cells.last().unwrap().0 - first_leaf) as usize] += 1.0;
            accesses += 1;
        }
    }
    assert_eq!(accesses, n);
    let expect = n as f64 / counts.len() as f64;
    let chi2: f64 = counts.iter().map(|o| (o - expect).powi(2) / expect).sum();
    // 3 degrees of freedom: 16.27 is the 0.999 quantile.
    assert!(chi2 < 16.27, "leaves {counts:?}, chi2 {chi2}");
}
