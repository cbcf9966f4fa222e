//! Obliviousness of sealed Path ORAM, checked on the adversary's view: the request trace
//! recorded by a `RecordingStore` directly above the untrusted store.
//!
//! (a) Different logical workloads produce traces of identical shape.
//! (b) The leaves fetched are uniform and independent of the logical addresses.
//! (c) Nothing written contains a logical address or a plaintext byte pattern.

use std::sync::Arc;

use blindfold_crypto::{CellSealer, MasterKey, StoreId};
use blindfold_oram::{BlockId, Op, PathOram, PathOramConfig, PosMapMode};
use blindfold_proxy::SealedPathOram;
use blindfold_store::{MemoryStore, RecordingStore, TraceEvent, TraceOp};
use blindfold_testkit::stats;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Significance level: a correct implementation fails a given check with this probability.
/// Runs are seeded, so a pass is reproducible; the level only guards against unlucky seeds.
const ALPHA: f64 = 1e-4;

#[derive(Clone, Copy, Debug)]
enum Workload {
    /// The same block over and over.
    Hammer,
    /// 0, 1, 2, … wrapping around.
    Scan,
    /// Uniformly random blocks.
    Uniform,
    /// Two blocks alternating.
    Alternate,
}

fn addresses(w: Workload, n: u64, count: usize, seed: u64) -> Vec<u64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..count)
        .map(|i| match w {
            Workload::Hammer => 5 % n,
            Workload::Scan => i as u64 % n,
            Workload::Uniform => rng.gen_range(0..n),
            Workload::Alternate => (i as u64 % 2) * (n / 2),
        })
        .collect()
}

struct Run {
    trace: Vec<TraceEvent>,
    config: PathOramConfig,
}

/// Runs `ops` (block, is_write) through a sealed Path ORAM above a recording store.
async fn run(config: &PathOramConfig, ops: &[(u64, bool)], payloads: bool, seed: u64) -> Run {
    let geometry = SealedPathOram::geometry(config).unwrap();
    let inner = MemoryStore::new(geometry);
    let rec = Arc::new(if payloads {
        RecordingStore::with_payloads(inner)
    } else {
        RecordingStore::new(inner)
    });
    let sealer = CellSealer::new(&MasterKey::generate(), StoreId::random(), 0);
    let oram = PathOram::with_seed(config.clone(), seed);
    let mut client = SealedPathOram::with_oram(oram, rec.clone(), sealer).unwrap();
    let bs = config.block_size() as usize;
    for &(b, write) in ops {
        let op = if write { Op::Write(marker_block(b, bs)) } else { Op::Read };
        client.access(BlockId(b), op).await.unwrap();
    }
    Run { trace: rec.take_trace(), config: config.clone() }
}

/// A recognisable plaintext: a fixed marker followed by the block's address, repeated.
fn marker_block(block: u64, size: usize) -> Vec<u8> {
    let mut unit = b"PLAINTEXT-MARKER".to_vec();
    unit.extend_from_slice(&block.to_le_bytes());
    unit.iter().copied().cycle().take(size).collect()
}

fn shape(trace: &[TraceEvent]) -> Vec<(TraceOp, usize, u64)> {
    trace.iter().map(TraceEvent::shape).collect()
}

/// The data-tree leaf of every access: the deepest cell of each data-tree read.
fn data_leaves(run: &Run) -> Vec<u64> {
    let tree = run.config.trees()[0];
    let first_leaf = tree.base + tree.shape.leaves() - 1;
    let end = tree.base + tree.shape.buckets();
    run.trace
        .iter()
        .filter(|e| e.op == TraceOp::Read)
        .filter_map(|e| e.cells.iter().find(|c| c.0 >= first_leaf && c.0 < end))
        .map(|c| c.0 - first_leaf)
        .collect()
}

fn configs() -> Vec<PathOramConfig> {
    vec![
        PathOramConfig::builder(1024, 32).build().unwrap(),
        PathOramConfig::builder(1024, 32)
            .posmap(PosMapMode::Recursive { max_in_memory_entries: 16 })
            .cache_levels(2)
            .build()
            .unwrap(),
    ]
}

#[tokio::test]
async fn trace_shape_is_independent_of_the_workload() {
    for config in configs() {
        let n = config.blocks();
        let count = 300;
        let mut shapes = Vec::new();
        let workloads = [Workload::Hammer, Workload::Scan, Workload::Uniform, Workload::Alternate];
        for (i, w) in workloads.into_iter().enumerate() {
            let addrs = addresses(w, n, count, i as u64);
            // All reads, all writes, and a mix, for each address pattern.
            for mode in 0..3 {
                let ops: Vec<(u64, bool)> = addrs
                    .iter()
                    .enumerate()
                    .map(|(j, &a)| (a, mode == 1 || (mode == 2 && j % 4 == 0)))
                    .collect();
                let r = run(&config, &ops, false, 100 + i as u64).await;
                shapes.push((format!("{w:?}/mode{mode}"), shape(&r.trace)));
            }
        }
        let (first_name, first) = &shapes[0];
        assert!(!first.is_empty());
        // Every access is the same number of rounds, each one read and one write of one path.
        let per_access = config.trees().len() * 2;
        assert_eq!(first.len(), count * per_access, "{first_name}");
        for (name, s) in &shapes[1..] {
            assert_eq!(s, first, "trace shape of {name} differs from {first_name}");
        }
    }
}

#[tokio::test]
async fn leaves_are_uniform_for_any_workload() {
    let config = &configs()[0];
    let leaves = config.trees()[0].shape.leaves(); // 256
    for (i, w) in [Workload::Hammer, Workload::Scan].into_iter().enumerate() {
        let ops: Vec<(u64, bool)> = addresses(w, config.blocks(), 10_000, i as u64)
            .into_iter()
            .enumerate()
            .map(|(j, a)| (a, j % 4 == 0))
            .collect();
        let r = run(config, &ops, false, 7 + i as u64).await;
        let fetched = data_leaves(&r);
        assert_eq!(fetched.len(), 10_000);
        let test = stats::uniformity(&stats::histogram(fetched.iter().copied(), leaves));
        assert!(test.p_value > ALPHA, "{w:?}: leaves not uniform: {test:?}");
        // Consecutive leaves are independent (a block hammered repeatedly is remapped each
        // time; a stale position map would repeat the previous leaf).
        let pairs = fetched.windows(2).map(|p| (p[0] % 16, p[1] % 16));
        let test = stats::independence(pairs, 16, 16);
        assert!(test.p_value > ALPHA, "{w:?}: consecutive leaves dependent: {test:?}");
        let repeats = fetched.windows(2).filter(|p| p[0] == p[1]).count();
        assert!(repeats < 100, "{w:?}: {repeats} immediate repeats of the same leaf");
    }
}

#[tokio::test]
async fn leaves_are_independent_of_addresses() {
    let config = &configs()[1];
    let leaves = config.trees()[0].shape.leaves();
    // A small set of addresses, each visited many times, in random order.
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let hot: Vec<u64> = (0..8).map(|i| i * 97 + 3).collect();
    let ops: Vec<(u64, bool)> =
        (0..10_000).map(|j| (hot[rng.gen_range(0..hot.len())], j % 3 == 0)).collect();
    let r = run(config, &ops, false, 9).await;
    let fetched = data_leaves(&r);
    assert_eq!(fetched.len(), ops.len());
    let which = |b: u64| hot.iter().position(|&h| h == b).unwrap() as u64;
    let pairs = ops.iter().zip(&fetched).map(|(&(b, _), &leaf)| (which(b), leaf * 16 / leaves));
    let test = stats::independence(pairs, hot.len() as u64, 16);
    assert!(test.p_value > ALPHA, "leaf depends on the logical address: {test:?}");
    let test = stats::uniformity(&stats::histogram(fetched.iter().copied(), leaves));
    assert!(test.p_value > ALPHA, "leaves not uniform: {test:?}");
    // The position-map trees' leaves are uniform too.
    for (t, tree) in config.trees().iter().enumerate().skip(1) {
        let first_leaf = tree.base + tree.shape.leaves() - 1;
        let end = tree.base + tree.shape.buckets();
        let l: Vec<u64> = r
            .trace
            .iter()
            .filter(|e| e.op == TraceOp::Read)
            .filter_map(|e| e.cells.iter().find(|c| c.0 >= first_leaf && c.0 < end))
            .map(|c| c.0 - first_leaf)
            .collect();
        assert_eq!(l.len(), ops.len(), "tree {t}");
        let bins = tree.shape.leaves().min(64);
        let test = stats::uniformity(&stats::histogram(l.iter().map(|x| x % bins), bins));
        assert!(test.p_value > ALPHA, "tree {t} leaves not uniform: {test:?}");
    }
}

#[tokio::test]
async fn nothing_written_reveals_addresses_or_plaintext() {
    for config in configs() {
        let ops: Vec<(u64, bool)> = (0..400).map(|i| (i % config.blocks(), true)).collect();
        let r = run(&config, &ops, true, 13).await;
        let mut histogram = [0u64; 256];
        let mut written = 0usize;
        for e in r.trace.iter().filter(|e| e.op == TraceOp::Write) {
            assert_eq!(e.payloads.len(), e.cells.len());
            for p in &e.payloads {
                written += p.len();
                // The first four bytes are the sealing key's epoch, public by design.
                for &byte in &p[4..] {
                    histogram[byte as usize] += 1;
                }
                assert!(!contains(p, b"PLAINTEXT-MARK"), "plaintext marker in a written cell");
                for b in [5u64, 77, 399] {
                    // Addresses as they sit in a bucket slot header (id + 1) and in the data.
                    assert!(!contains(p, &(b + 1).to_le_bytes()), "address {b} in a cell");
                    let mut tail = b"MARKER".to_vec();
                    tail.extend_from_slice(&b.to_le_bytes());
                    assert!(!contains(p, &tail), "address {b} next to the marker");
                }
            }
        }
        assert!(written > 500_000, "enough bytes to judge: {written}");
        // Ciphertext bytes are uniform; the plaintext (mostly marker text and zero padding)
        // would be wildly off.
        let test = stats::uniformity(&histogram);
        assert!(test.p_value > ALPHA, "written bytes are not uniform: {test:?}");
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
