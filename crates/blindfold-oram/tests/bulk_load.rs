//! Bulk loading of a fresh Path ORAM, with a plaintext in-memory driver: contents read back,
//! normal accesses continue against a `HashMap` model, every cell is written exactly once, and
//! what the store sees does not depend on the data or the leaves.

use std::collections::{HashMap, HashSet};

use blindfold_oram::path::BulkLoad;
use blindfold_oram::{BlockId, Op, OramError, PathOram, PathOramConfig, PosMapMode, Progress};
use blindfold_store::CellId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Plaintext cells, as a store would hold them after sealing is stripped away.
#[derive(Default)]
struct ToyDriver {
    cells: HashMap<u64, Vec<u8>>,
}

impl ToyDriver {
    fn access(&mut self, oram: &mut PathOram, block: u64, op: Op) -> Result<Vec<u8>, OramError> {
        let mut read = oram.start(BlockId(block), op)?;
        loop {
            let fetched = read.iter().map(|c| self.cells.get(&c.0).cloned()).collect();
            let (writes, done) = match oram.feed(fetched)? {
                Progress::Continue { writes, read: next } => {
                    read = next;
                    (writes, None)
                }
                Progress::Done { writes, data } => (writes, Some(data)),
            };
            self.cells.extend(writes.into_iter().map(|(c, d)| (c.0, d)));
            if let Some(d) = done {
                oram.check_stash()?;
                return Ok(d);
            }
        }
    }

    /// Runs a whole bulk load; returns the cells of each batch, in order.
    fn bulk_load(
        &mut self,
        oram: &mut PathOram,
        data: &mut dyn FnMut(BlockId) -> Vec<u8>,
        batch: usize,
    ) -> Vec<Vec<CellId>> {
        let mut load = oram.bulk_load().unwrap();
        let total = load.total_cells();
        let mut trace = Vec::new();
        while let Some(cells) = oram.bulk_load_step(&mut load, data, batch).unwrap() {
            assert!(!cells.is_empty() && cells.len() <= batch.max(1));
            trace.push(cells.iter().map(|c| c.0).collect());
            for (c, d) in cells {
                assert_eq!(d.len(), oram.config().bucket_bytes());
                self.cells.insert(c.0, d);
            }
            assert_eq!(load.cells_done(), trace.iter().map(Vec::len).sum::<usize>() as u64);
        }
        assert!(load.is_finished());
        assert_eq!(load.cells_done(), total);
        // Finished loads stay finished.
        assert!(oram.bulk_load_step(&mut load, data, batch).unwrap().is_none());
        trace
    }
}

/// Initial contents of a block, different for every block and `salt`.
fn initial(block: BlockId, size: u32, salt: u64) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(block.0 ^ salt.rotate_left(32));
    (0..size).map(|_| rng.gen()).collect()
}

/// Cells the store holds: every bucket of every tree except the cached top levels.
fn stored_cells(config: &PathOramConfig) -> HashSet<u64> {
    let mut out = HashSet::new();
    for t in config.trees() {
        let cached = (1u64 << config.cache_levels().min(t.shape.levels())) - 1;
        out.extend((cached..t.shape.buckets()).map(|b| t.base + b));
    }
    out
}

fn check(config: PathOramConfig, seed: u64) {
    let bs = config.block_size();
    let n = config.blocks();
    let mut oram = PathOram::with_seed(config.clone(), seed);
    let mut driver = ToyDriver::default();
    let mut calls = vec![0u32; n as usize];
    let mut data = |b: BlockId| {
        calls[b.0 as usize] += 1;
        initial(b, bs, seed)
    };
    let trace = driver.bulk_load(&mut oram, &mut data, 7);
    assert!(calls.iter().all(|&c| c == 1), "data asked once per block ({config:?})");

    // Every stored cell exactly once.
    let written: Vec<u64> = trace.concat().into_iter().map(|c| c.0).collect();
    let unique: HashSet<u64> = written.iter().copied().collect();
    assert_eq!(unique.len(), written.len(), "a cell written twice ({config:?})");
    assert_eq!(unique, stored_cells(&config), "cells written ({config:?})");
    assert_eq!(oram.stats().accesses, 0);

    // Everything reads back, then the ORAM behaves as if the blocks had been written.
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    for b in 0..n {
        let expect = initial(BlockId(b), bs, seed);
        let got = driver.access(&mut oram, b, Op::Read).unwrap();
        assert_eq!(got, expect, "block {b} after bulk load ({config:?})");
        model.insert(b, expect);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xb1);
    for i in 0..150 {
        let b = if i % 3 == 0 { rng.gen_range(0..n.min(3)) } else { rng.gen_range(0..n) };
        if rng.gen_bool(0.5) {
            let d: Vec<u8> = (0..bs).map(|_| rng.gen()).collect();
            let old = driver.access(&mut oram, b, Op::Write(d.clone())).unwrap();
            assert_eq!(old, model[&b], "old contents of block {b} at op {i} ({config:?})");
            model.insert(b, d);
        } else {
            let got = driver.access(&mut oram, b, Op::Read).unwrap();
            assert_eq!(got, model[&b], "block {b} at op {i} ({config:?})");
        }
    }
    for (b, d) in &model {
        assert_eq!(&driver.access(&mut oram, *b, Op::Read).unwrap(), d);
    }
    // Exported state carries the loaded position map and stashes.
    let state = oram.export_state().unwrap();
    assert!(state.top.iter().all(|&e| e != 0));
}

#[test]
fn grid_reads_back_and_continues_like_the_model() {
    let mut seed = 100;
    for &z in &[1u32, 2, 4] {
        for &blocks in &[1u64, 5, 100, 1000] {
            for posmap in [PosMapMode::InMemory, PosMapMode::Recursive { max_in_memory_entries: 4 }]
            {
                for &cache in &[0u32, 2] {
                    let config = PathOramConfig::builder(blocks, 16)
                        .z(z)
                        .posmap(posmap)
                        .cache_levels(cache)
                        .stash_limit(1_000_000)
                        .build()
                        .unwrap();
                    seed += 1;
                    check(config, seed);
                }
            }
        }
    }
}

#[test]
fn overfull_tree_spills_into_the_stash() {
    // 64 blocks in 15 slots: 49 must wait in the stash, and the ORAM still works.
    let config = PathOramConfig::builder(64, 8).z(1).leaves(8).stash_limit(1_000).build().unwrap();
    let mut oram = PathOram::with_seed(config.clone(), 3);
    let mut driver = ToyDriver::default();
    driver.bulk_load(&mut oram, &mut |b| vec![b.0 as u8; 8], 4);
    assert_eq!(oram.stash_sizes(), vec![49]);
    for b in 0..64 {
        assert_eq!(driver.access(&mut oram, b, Op::Read).unwrap(), vec![b as u8; 8]);
    }
    // With a small bound the overflow is reported, as after an access.
    let small = PathOramConfig::builder(64, 8).z(1).leaves(8).stash_limit(10).build().unwrap();
    let mut oram = PathOram::with_seed(small, 3);
    ToyDriver::default().bulk_load(&mut oram, &mut |b| vec![b.0 as u8; 8], 4);
    assert!(matches!(oram.check_stash(), Err(OramError::StashOverflow { tree: 0, size: 49, .. })));
}

#[test]
fn store_view_is_independent_of_data_and_leaves() {
    for config in [
        PathOramConfig::builder(300, 16).build().unwrap(),
        PathOramConfig::builder(1000, 16)
            .z(2)
            .posmap(PosMapMode::Recursive { max_in_memory_entries: 4 })
            .cache_levels(2)
            .build()
            .unwrap(),
    ] {
        let bs = config.block_size();
        let mut a = PathOram::with_seed(config.clone(), 1);
        let mut b = PathOram::with_seed(config.clone(), 2);
        let ta = ToyDriver::default().bulk_load(&mut a, &mut |id| initial(id, bs, 10), 64);
        let tb = ToyDriver::default().bulk_load(&mut b, &mut |_| vec![0xAB; bs as usize], 64);
        assert_eq!(ta, tb, "batches and cell order must not depend on secrets");
        // The order is post-order within each tree, data tree first.
        let flat: Vec<CellId> = ta.concat();
        let t0 = config.trees()[0];
        let cached = (1u64 << config.cache_levels().min(t0.shape.levels())) - 1;
        let first_tree = (t0.shape.buckets() - cached) as usize;
        assert_eq!(flat[0], CellId(t0.base + t0.shape.leaves() - 1), "leftmost leaf first");
        assert!(flat[..first_tree].iter().all(|c| c.0 < t0.base + t0.shape.buckets()));
        if cached == 0 {
            assert_eq!(flat[first_tree - 1], CellId(t0.base), "root of the data tree last");
        }
        // Different seeds do place the blocks differently.
        assert_ne!(a.export_state().unwrap().top, b.export_state().unwrap().top);
    }
}

#[test]
fn refused_unless_fresh() {
    let config = PathOramConfig::builder(32, 16).build().unwrap();
    let mut data = |_: BlockId| vec![1u8; 16];

    // After an access.
    let mut oram = PathOram::with_seed(config.clone(), 1);
    ToyDriver::default().access(&mut oram, 3, Op::Read).unwrap();
    assert!(matches!(oram.bulk_load(), Err(OramError::Protocol(_))));

    // During an access.
    let mut oram = PathOram::with_seed(config.clone(), 1);
    oram.start(BlockId(3), Op::Read).unwrap();
    assert!(matches!(oram.bulk_load(), Err(OramError::Protocol(_))));

    // Twice, and accesses or export during a load.
    let mut oram = PathOram::with_seed(config.clone(), 1);
    let mut load = oram.bulk_load().unwrap();
    assert!(matches!(oram.bulk_load(), Err(OramError::Protocol(_))));
    assert!(matches!(oram.start(BlockId(0), Op::Read), Err(OramError::Protocol(_))));
    assert!(oram.export_state().is_err());
    // A load belongs to the ORAM that started it.
    let mut other = PathOram::with_seed(config.clone(), 2);
    let _other_load = other.bulk_load().unwrap();
    assert!(matches!(other.bulk_load_step(&mut load, &mut data, 8), Err(OramError::Protocol(_))));
    // After a load.
    while oram.bulk_load_step(&mut load, &mut data, 8).unwrap().is_some() {}
    assert!(matches!(oram.bulk_load(), Err(OramError::Protocol(_))));
    assert!(format!("{load:?}").contains("total_cells"));
}

#[test]
fn wrong_block_size_fails_the_load() {
    let config = PathOramConfig::builder(32, 16).build().unwrap();
    let mut oram = PathOram::with_seed(config, 1);
    let mut load: BulkLoad = oram.bulk_load().unwrap();
    let mut data = |b: BlockId| vec![0u8; if b.0 == 7 { 15 } else { 16 }];
    let mut err = None;
    loop {
        match oram.bulk_load_step(&mut load, &mut data, 4) {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    assert!(matches!(err, Some(OramError::WrongBlockSize { got: 15, expected: 16 })), "{err:?}");
    assert!(!load.is_finished());
    assert!(matches!(oram.bulk_load_step(&mut load, &mut data, 4), Err(OramError::Protocol(_))));
}

#[test]
fn stash_after_bulk_load_is_small_with_z4() {
    // Seed 002's utilisation (about twice as many slots as blocks): greedy placement leaves
    // (almost) nothing over, over many independent loads.
    let mut worst = 0;
    for seed in 0..20 {
        let config = PathOramConfig::builder(4096, 8).build().unwrap();
        let mut oram = PathOram::with_seed(config, seed);
        ToyDriver::default().bulk_load(&mut oram, &mut |_| vec![5; 8], 256);
        worst = worst.max(oram.stash_sizes()[0]);
        oram.check_stash().unwrap();
    }
    assert!(worst <= 4, "stash of {worst} blocks after a bulk load");
}

#[test]
fn position_map_blocks_hold_the_leaves() {
    // One position-map block covers 4 data blocks (16-byte blocks); reading the whole ORAM
    // twice exercises every entry that the load wrote, and every remapped one.
    let config = PathOramConfig::builder(37, 16)
        .posmap(PosMapMode::Recursive { max_in_memory_entries: 2 })
        .build()
        .unwrap();
    assert_eq!(config.trees().len(), 4);
    let mut oram = PathOram::with_seed(config, 8);
    let mut driver = ToyDriver::default();
    driver.bulk_load(&mut oram, &mut |b| vec![b.0 as u8 + 1; 16], 1);
    assert_eq!(oram.export_state().unwrap().top.len(), 1); // 37 -> 10 -> 3 -> 1 entries
    for _ in 0..2 {
        for b in 0..37u64 {
            assert_eq!(driver.access(&mut oram, b, Op::Read).unwrap(), vec![b as u8 + 1; 16]);
        }
    }
    assert_eq!(oram.stats().accesses, 74);
}

/// Measures a full-size load: 2^20 blocks of 4 KiB. Run by hand (release) to check memory:
/// `cargo test --release -p blindfold-oram --test bulk_load -- --ignored`.
#[test]
#[ignore]
fn million_blocks_of_4k() {
    let config = PathOramConfig::builder(1 << 20, 4096).build().unwrap();
    let mut oram = PathOram::with_seed(config.clone(), 1);
    let mut load = oram.bulk_load().unwrap();
    let mut cells = 0u64;
    let mut data = |b: BlockId| vec![b.0 as u8; 4096];
    while let Some(batch) = oram.bulk_load_step(&mut load, &mut data, 256).unwrap() {
        cells += batch.len() as u64;
    }
    assert_eq!(cells, config.total_cells());
    println!("stash after load: {:?}", oram.stash_sizes());
}
