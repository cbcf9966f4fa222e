//! Obliviousness of sealed Ring ORAM and XOR Ring ORAM, checked on the adversary's view: the
//! requests recorded above the metadata array and the data array.
//!
//! (a) Every access has the same fixed shape (metadata read, metadata write, one online read of
//!     one slot per bucket of a path), whatever the workload.
//! (b) Whole buckets are rewritten only on the public schedule — the eviction path every `A`
//!     accesses, in reverse-lexicographic order — or when the read count the adversary can keep
//!     itself reaches `S` (early reshuffles), exactly then.
//! (c) The leaves read are uniform (chi-square over 10^4 accesses of one block hammered) and
//!     independent of the addresses; the slot read in a freshly written bucket is uniform.

use std::collections::HashMap;
use std::sync::Arc;

use blindfold_crypto::{CellSealer, MasterKey, StoreId, XorPads};
use blindfold_oram::Leaf;
use blindfold_oram::{BlockId, Op, RingOram, RingOramConfig, RingVariant, TreeShape};
use blindfold_proxy::{RingData, SealedRingOram};
use blindfold_store::{MemoryStore, RecordingStore, Store, TraceEvent, TraceOp, XorStore};
use blindfold_testkit::stats;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const ALPHA: f64 = 1e-4;

/// The adversary's view of one access: metadata-array events and data-array events.
struct Access {
    meta: Vec<TraceEvent>,
    data: Vec<TraceEvent>,
}

async fn run(config: &RingOramConfig, ops: &[(u64, bool)], seed: u64) -> Vec<Access> {
    let meta = Arc::new(RecordingStore::new(MemoryStore::new(
        SealedRingOram::meta_geometry(config).unwrap(),
    )));
    let data = Arc::new(RecordingStore::new(MemoryStore::new(
        SealedRingOram::data_geometry(config).unwrap(),
    )));
    let key = MasterKey::generate();
    let id = StoreId::random();
    let (ring_data, pads) = match config.variant() {
        RingVariant::Ring => (RingData::Plain(data.clone() as Arc<dyn Store>), None),
        RingVariant::XorRing => {
            (RingData::Xor(data.clone() as Arc<dyn XorStore>), Some(XorPads::new(&key, id, 0)))
        }
    };
    let mut oram = SealedRingOram::with_oram(
        RingOram::with_seed(config.clone(), seed),
        meta.clone(),
        ring_data,
        CellSealer::new(&key, id, 0),
        pads,
    )
    .unwrap();
    let bs = config.block_size() as usize;
    let mut out = Vec::with_capacity(ops.len());
    for &(b, write) in ops {
        let op = if write { Op::Write(vec![b as u8; bs]) } else { Op::Read };
        oram.access(BlockId(b), op).await.unwrap();
        out.push(Access { meta: meta.take_trace(), data: data.take_trace() });
    }
    out
}

/// Leaf of a path given as buckets (the deepest one).
fn leaf_of(shape: TreeShape, cells: &[blindfold_store::CellId]) -> u64 {
    let deepest = cells.iter().map(|c| c.0).max().unwrap();
    deepest + 1 - shape.leaves()
}

fn is_path(shape: TreeShape, cells: &[blindfold_store::CellId]) -> bool {
    let leaf = Leaf(leaf_of(shape, cells));
    cells.iter().enumerate().all(|(l, c)| shape.bucket_on_path(leaf, l as u32).0 == c.0)
}

/// Checks (a) and (b) on a run; returns the online leaves and the slots read in buckets the
/// adversary knows were freshly written.
fn check_run(config: &RingOramConfig, run: &[Access]) -> (Vec<u64>, Vec<u64>) {
    let shape = config.shape();
    let levels = shape.levels() as usize;
    let z = config.z() as usize;
    let online_op = if config.variant() == RingVariant::XorRing {
        TraceOp::ReadXor
    } else {
        TraceOp::ReadRanges
    };
    let mut counts: HashMap<u64, u32> = HashMap::new();
    let mut evictions = 0u64;
    let (mut leaves, mut fresh_slots) = (Vec::new(), Vec::new());
    let slot_len = SealedRingOram::data_geometry(config).unwrap().cell_size() / config.slots();
    for (i, a) in run.iter().enumerate() {
        let evicts = (i as u64 + 1).is_multiple_of(u64::from(config.a()));
        // Metadata: one read of the path (and the eviction path), one write of the path.
        assert_eq!(a.meta[0].op, TraceOp::Read, "access {i}");
        assert_eq!(a.meta[0].cells.len(), levels * if evicts { 2 } else { 1 }, "access {i}");
        assert_eq!(a.meta[1].shape().0, TraceOp::Write);
        assert_eq!(a.meta[1].cells, a.meta[0].cells[..levels].to_vec(), "metadata written back");
        // Data: the online read of one slot per bucket of that same path.
        let online = &a.data[0];
        assert_eq!(online.op, online_op, "access {i}");
        assert_eq!(online.cells, a.meta[0].cells[..levels].to_vec(), "access {i}");
        assert!(is_path(shape, &online.cells));
        assert!(online.ranges.iter().all(|&(off, len)| len == slot_len && off % slot_len == 0));
        leaves.push(leaf_of(shape, &online.cells));
        for (c, &(off, _)) in online.cells.iter().zip(&online.ranges) {
            let n = counts.entry(c.0).or_insert(0);
            if *n == 0 {
                fresh_slots.push(u64::from(off / slot_len));
            }
            *n += 1;
        }
        // Background: which buckets must be rewritten, by public information only.
        let mut expected: Vec<u64> = Vec::new();
        if evicts {
            let g = RingOram::eviction_leaf(config, evictions);
            evictions += 1;
            expected.extend((0..shape.levels()).rev().map(|l| shape.bucket_on_path(g, l).0));
            assert_eq!(a.meta[0].cells[levels..].to_vec(), {
                let mut p: Vec<_> =
                    expected.iter().rev().map(|&b| blindfold_store::CellId(b)).collect();
                p.truncate(levels);
                p
            });
        }
        for c in online.cells.iter().rev() {
            if counts[&c.0] >= config.s() && !expected.contains(&c.0) {
                expected.push(c.0);
            }
        }
        if expected.is_empty() {
            assert_eq!(a.data.len(), 1, "access {i}: nothing but the online read");
            assert_eq!(a.meta.len(), 2);
            continue;
        }
        assert_eq!(a.data.len(), 3, "access {i}");
        let (bg, wr) = (&a.data[1], &a.data[2]);
        assert_eq!(bg.op, TraceOp::ReadRanges);
        assert_eq!(bg.cells.len(), expected.len() * z, "Z slots per rewritten bucket");
        let mut read_buckets: Vec<u64> = bg.cells.iter().map(|c| c.0).collect();
        read_buckets.dedup();
        assert_eq!(read_buckets, expected, "access {i}: the public schedule");
        assert_eq!(wr.op, TraceOp::Write);
        let written: Vec<u64> = wr.cells.iter().map(|c| c.0).collect();
        assert_eq!(written, expected, "access {i}");
        assert_eq!(a.meta[2].cells, wr.cells);
        for b in expected {
            counts.insert(b, 0);
        }
    }
    (leaves, fresh_slots)
}

fn configs() -> Vec<RingOramConfig> {
    let mut out = Vec::new();
    for variant in [RingVariant::Ring, RingVariant::XorRing] {
        for (s, a) in [(2, 3), (5, 3)] {
            out.push(
                RingOramConfig::builder(1024, 16).z(4).s(s).a(a).variant(variant).build().unwrap(),
            );
        }
    }
    out
}

#[tokio::test]
async fn shape_and_schedule_are_public_for_every_workload() {
    for config in configs() {
        let n = config.blocks();
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let workloads: Vec<Vec<(u64, bool)>> = vec![
            (0..300).map(|_| (7, false)).collect(),
            (0..300).map(|i| (i % n, true)).collect(),
            (0..300).map(|i| (rng.gen_range(0..n), i % 4 == 0)).collect(),
            (0..300).map(|i| ((i % 2) * (n / 2), i % 2 == 0)).collect(),
        ];
        for (w, ops) in workloads.iter().enumerate() {
            let run = run(&config, ops, w as u64).await;
            check_run(&config, &run);
        }
    }
}

#[tokio::test]
async fn leaves_and_slots_are_uniform_and_independent_of_addresses() {
    for variant in [RingVariant::Ring, RingVariant::XorRing] {
        let config =
            RingOramConfig::builder(512, 16).z(4).s(2).a(3).variant(variant).build().unwrap();
        let leaves_n = config.shape().leaves();
        // One block hammered 10^4 times: the hardest case for uniformity.
        let ops: Vec<(u64, bool)> = (0..10_000).map(|i| (3, i % 3 == 0)).collect();
        let run1 = run(&config, &ops, 11).await;
        let (leaves, slots) = check_run(&config, &run1);
        let p = stats::uniformity(&stats::histogram(leaves.iter().copied(), leaves_n)).p_value;
        assert!(p > ALPHA, "{variant:?}: leaves not uniform, p = {p}");
        let p =
            stats::uniformity(&stats::histogram(slots.iter().copied(), u64::from(config.slots())))
                .p_value;
        assert!(p > ALPHA, "{variant:?}: slots of fresh buckets not uniform, p = {p}");

        // Uniform addresses: the leaf read says nothing about the address.
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        let addrs: Vec<u64> = (0..6_000).map(|_| rng.gen_range(0..config.blocks())).collect();
        let ops: Vec<(u64, bool)> = addrs.iter().map(|&a| (a, false)).collect();
        let run2 = run(&config, &ops, 13).await;
        let (leaves, _) = check_run(&config, &run2);
        let pairs = addrs.iter().zip(&leaves).map(|(&a, &l)| (a % 8, l % 8));
        let p = stats::independence(pairs, 8, 8).p_value;
        assert!(p > ALPHA, "{variant:?}: leaves depend on addresses, p = {p}");
    }
}
