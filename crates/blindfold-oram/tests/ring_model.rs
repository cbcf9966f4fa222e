//! Ring ORAM and XOR Ring ORAM against a `HashMap` model, over a grid of parameters, with a
//! plaintext in-memory driver (the sealed drivers are tested in `blindfold-proxy`), plus the
//! shape of their plans.

use std::collections::HashMap;

use blindfold_oram::ring::SlotRead;
use blindfold_oram::{
    BlockId, Op, OramError, RingInput, RingOram, RingOramConfig, RingRead, RingVariant,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What one access asked of the store, as counts.
#[derive(Debug, Default, Clone, PartialEq)]
struct Shape {
    meta_reads: usize,
    online: usize,
    background: usize,
    meta_writes: usize,
    bucket_writes: usize,
}

/// Plaintext metadata and slots in maps; XOR computed over plaintext slots.
#[derive(Default)]
struct Toy {
    meta: HashMap<u64, Vec<u8>>,
    slots: HashMap<(u64, u32), Vec<u8>>,
}

impl Toy {
    fn slot(&self, r: &SlotRead) -> Option<Vec<u8>> {
        // A never-written bucket reads as "no contents".
        (r.version != 0).then(|| self.slots[&(r.bucket.0, r.slot)].clone())
    }

    fn access(
        &mut self,
        oram: &mut RingOram,
        block: u64,
        op: Op,
    ) -> Result<(Vec<u8>, Shape), OramError> {
        let mut plan = oram.start(BlockId(block), op)?;
        let mut shape = Shape::default();
        let mut answer = None;
        loop {
            if let Some(a) = plan.answer.take() {
                assert!(answer.is_none(), "one answer per access");
                answer = Some(a);
            }
            shape.meta_writes += plan.meta_writes.len();
            shape.bucket_writes += plan.bucket_writes.len();
            for (b, m) in plan.meta_writes.drain(..) {
                assert_eq!(m.len(), oram.config().meta_bytes());
                self.meta.insert(b.0, m);
            }
            for w in plan.bucket_writes.drain(..) {
                assert_eq!(w.slots.len(), oram.config().slots() as usize);
                self.meta.insert(w.bucket.0, w.meta);
                for (k, s) in w.slots.into_iter().enumerate() {
                    self.slots.insert((w.bucket.0, k as u32), s);
                }
            }
            let input = match plan.read {
                RingRead::Done => break,
                RingRead::Meta(bs) => {
                    shape.meta_reads += bs.len();
                    RingInput::Meta(bs.iter().map(|b| self.meta.get(&b.0).cloned()).collect())
                }
                RingRead::Slots(rs) => {
                    if answer.is_none() {
                        shape.online += rs.len();
                    } else {
                        shape.background += rs.len();
                    }
                    RingInput::Slots(rs.iter().map(|r| self.slot(r)).collect())
                }
                RingRead::Xor(rs) => {
                    shape.online += rs.len();
                    let mut x = vec![0u8; oram.config().block_size() as usize];
                    for r in &rs {
                        if let Some(s) = self.slot(r) {
                            x.iter_mut().zip(s).for_each(|(a, b)| *a ^= b);
                        }
                    }
                    RingInput::Xor(x)
                }
            };
            plan = oram.feed(input)?;
        }
        oram.check_stash()?;
        Ok((answer.expect("every access answers"), shape))
    }
}

fn run_model(config: RingOramConfig, ops: usize, seed: u64, bulk: bool) -> RingOram {
    let mut oram = RingOram::with_seed(config.clone(), seed);
    let mut toy = Toy::default();
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let n = config.blocks();
    let bs = config.block_size() as usize;
    if bulk {
        let writes = oram
            .bulk_load(|b| {
                let d: Vec<u8> = (0..bs).map(|i| (b.0 as u8).wrapping_add(i as u8)).collect();
                model.insert(b.0, d.clone());
                d
            })
            .unwrap();
        assert_eq!(writes.len() as u64, config.buckets(), "bulk load writes every bucket");
        for w in writes {
            toy.meta.insert(w.bucket.0, w.meta);
            for (k, s) in w.slots.into_iter().enumerate() {
                toy.slots.insert((w.bucket.0, k as u32), s);
            }
        }
    }
    let levels = config.shape().levels() as usize;
    for i in 0..ops {
        let block = match i % 3 {
            0 => rng.gen_range(0..n),
            1 => (i as u64 / 3) % n,
            _ => rng.gen_range(0..n.min(3)),
        };
        let expect = model.get(&block).cloned().unwrap_or_else(|| vec![0u8; bs]);
        let evicts = (i as u64 + 1).is_multiple_of(u64::from(config.a()));
        let (got, shape) = if rng.gen_bool(0.5) {
            let data: Vec<u8> = (0..bs).map(|_| rng.gen()).collect();
            let r = toy.access(&mut oram, block, Op::Write(data.clone())).unwrap();
            model.insert(block, data);
            r
        } else {
            toy.access(&mut oram, block, Op::Read).unwrap()
        };
        assert_eq!(got, expect, "block {block} at op {i} ({config:?})");
        // The plan's shape follows the public schedule only.
        let z = config.z() as usize;
        assert_eq!(shape.meta_reads, levels * if evicts { 2 } else { 1 }, "op {i}");
        assert_eq!(shape.online, levels);
        assert_eq!(shape.meta_writes, levels);
        let rewritten = shape.bucket_writes;
        assert!(rewritten >= if evicts { levels } else { 0 });
        assert_eq!(shape.background, rewritten * z, "Z slots read per rewritten bucket");
    }
    oram
}

fn grid() -> Vec<RingOramConfig> {
    let mut out = Vec::new();
    for variant in [RingVariant::Ring, RingVariant::XorRing] {
        for (blocks, bs, z, s, a) in [
            (1, 8, 4, 2, 3),
            (64, 16, 4, 2, 3),
            (64, 16, 4, 5, 3),
            (100, 8, 2, 3, 2),
            (200, 32, 8, 12, 8),
            (50, 8, 1, 1, 1),
        ] {
            out.push(
                RingOramConfig::builder(blocks, bs)
                    .z(z)
                    .s(s)
                    .a(a)
                    .variant(variant)
                    .stash_limit(1000)
                    .build()
                    .unwrap(),
            );
        }
    }
    out
}

#[test]
fn model_over_a_grid() {
    for (i, config) in grid().into_iter().enumerate() {
        run_model(config, 400, i as u64, false);
    }
}

#[test]
fn model_after_bulk_load() {
    for (i, config) in grid().into_iter().enumerate() {
        run_model(config, 300, 100 + i as u64, true);
    }
}

#[test]
fn seed_parameters_keep_a_small_stash() {
    // Seed 002's experiment: 4096 blocks of (here) 16 bytes, Z=4, S=2, A=3, 2047 buckets.
    let config = RingOramConfig::builder(4096, 16).z(4).s(2).a(3).build().unwrap();
    assert_eq!(config.buckets(), 2047);
    let oram = run_model(config, 3000, 7, true);
    let st = oram.stats();
    assert!(st.max_stash < 60, "{st:?}");
    assert_eq!(st.evictions, 1000);
    assert!(st.early_reshuffles > 0);
}

#[test]
fn invalid_requests_are_refused_before_anything_changes() {
    let config = RingOramConfig::builder(10, 8).build().unwrap();
    let mut oram = RingOram::with_seed(config, 1);
    assert!(matches!(oram.start(BlockId(10), Op::Read), Err(OramError::BlockOutOfRange { .. })));
    assert!(matches!(
        oram.start(BlockId(1), Op::Write(vec![0; 7])),
        Err(OramError::WrongBlockSize { .. })
    ));
    assert!(!oram.in_progress());
    assert!(RingOramConfig::builder(10, 8).z(0).build().is_err());
    assert!(RingOramConfig::builder(10, 8).s(0).build().is_err());
    assert!(RingOramConfig::builder(10, 8).a(0).build().is_err());
    assert!(RingOramConfig::builder(10, 8).z(200).s(60).build().is_err());
}
