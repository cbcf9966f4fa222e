//! The ObliviStore planner against a `HashMap`, with a simulated store that checks every cell
//! read holds what the planner says (serial and holder), plus the invariants after each step.

use std::collections::HashMap;

use blindfold_oram::oblivistore::{
    ObliviStoreConfig, ObliviStoreOram, ReadPlan, Shuffle, SlotRead, DUMMY,
};
use blindfold_oram::Op;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// cell → (serial, holder, data)
type Sim = HashMap<u64, (u64, u64, Vec<u8>)>;

/// A new planner of `config` and the store it starts with.
fn fresh(config: ObliviStoreConfig, seed: u64) -> (ObliviStoreOram, Sim) {
    let o = ObliviStoreOram::seeded(config, seed);
    let sim = o.initial_cells().map(|c| (c.cell.0, (c.serial, c.holder, vec![0; 8]))).collect();
    (o, sim)
}

fn run_shuffle(o: &mut ObliviStoreOram, sim: &mut Sim, sh: Shuffle) {
    let got = shuffle_reads(sim, &sh);
    land_shuffle(o, sim, sh, got);
}

/// A shuffle's reads, each checked against the simulated store: the live blocks' data.
fn shuffle_reads(sim: &Sim, sh: &Shuffle) -> HashMap<u64, Vec<u8>> {
    let mut got = HashMap::new();
    for (r, &live) in sh.reads.iter().zip(&sh.live) {
        let (serial, holder, data) = sim.get(&r.cell.0).cloned().expect("cell written");
        assert_eq!((serial, holder), (r.serial, r.holder), "shuffle read of {:?}", r.cell);
        if live {
            got.insert(holder, data);
        }
    }
    got
}

/// A shuffle's writes reach the simulated store and the planner learns it landed.
fn land_shuffle(o: &mut ObliviStoreOram, sim: &mut Sim, sh: Shuffle, got: HashMap<u64, Vec<u8>>) {
    write_shuffle(sim, &sh, &got);
    let spilled = sh.spill.iter().map(|b| (*b, got[b].clone())).collect();
    o.finish_shuffle(sh, spilled).unwrap();
}

/// A shuffle's writes reach the simulated store (`got`: its reads' live blocks).
fn write_shuffle(sim: &mut Sim, sh: &Shuffle, got: &HashMap<u64, Vec<u8>>) {
    for &(cell, h) in &sh.writes {
        let data = if h == DUMMY {
            vec![0; 8]
        } else if let Some((_, d)) = sh.evicted.iter().find(|(b, _)| *b == h) {
            d.clone()
        } else {
            got[&h].clone()
        };
        sim.insert(cell.0, (sh.serial, h, data));
    }
}

/// An access's read of block `b`, each cell checked against the simulated store: the block
/// (and, from a Path ORAM partition, every block the read takes) handed to the planner.
fn serve_read(o: &mut ObliviStoreOram, sim: &Sim, plan: &ReadPlan, b: u64) {
    for (i, s) in plan.slots.iter().enumerate() {
        let (serial, holder, data) = sim.get(&s.cell.0).cloned().expect("cell written");
        assert_eq!((serial, holder), (s.serial, s.holder), "read of {:?}", s.cell);
        if plan.real == Some(i) {
            assert_eq!(holder, b);
            o.fill(b, data);
        } else if plan.keep.contains(&i) {
            assert_ne!(holder, DUMMY);
            o.fill(holder, data);
        }
    }
}

/// What the store sees of one step: an access's read or a shuffle.
enum Seen<'a> {
    Read(&'a [SlotRead]),
    Shuffle(&'a Shuffle),
}

fn access(
    o: &mut ObliviStoreOram,
    sim: &mut Sim,
    rng: &mut ChaCha8Rng,
    debt: &mut f64,
    b: u64,
    op: Op,
) -> Vec<u8> {
    access_watched(o, sim, rng, debt, b, op, &mut |_| {})
}

/// [`access`], showing `watch` every read and shuffle before it runs.
fn access_watched(
    o: &mut ObliviStoreOram,
    sim: &mut Sim,
    rng: &mut ChaCha8Rng,
    debt: &mut f64,
    b: u64,
    op: Op,
    watch: &mut dyn FnMut(Seen<'_>),
) -> Vec<u8> {
    let (p, real) = o.begin(b).unwrap();
    let plan = o.plan_read(b, p, real).unwrap();
    watch(Seen::Read(&plan.slots));
    serve_read(o, sim, &plan, b);
    assert!(o.ready(b));
    let old = o.finish(b, op).unwrap();
    let sh = o.plan_evict(p);
    watch(Seen::Shuffle(&sh));
    run_shuffle(o, sim, sh);
    // ν background evictions per access, on the driver's schedule (a running debt).
    *debt += o.config().evict_rate();
    while *debt >= 1.0 {
        *debt -= 1.0;
        let q = rng.gen_range(0..o.config().partitions());
        let sh = o.plan_evict(q);
        watch(Seen::Shuffle(&sh));
        run_shuffle(o, sim, sh);
    }
    old
}

/// A shuffle that retires the level an access read from, landing before that read's data has
/// reached the planner, would drop the block's only copy the log knows of (the record rescues
/// cached data, and there is none yet): the planner refuses to finish it, naming the block,
/// rather than return a record a replay would lose the block by. The driver hands a read's
/// data over in the same step that lets such a shuffle write.
#[test]
fn a_shuffle_does_not_retire_a_read_that_has_not_landed() {
    for config in
        [ObliviStoreConfig::new(64, 8).unwrap(), ObliviStoreConfig::curious(64, 8, 3).unwrap()]
    {
        let (mut o, mut sim) = fresh(config.clone(), 7);
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut debt = 0.0;
        for b in 0..64u64 {
            access(&mut o, &mut sim, &mut rng, &mut debt, b, Op::Write(b.to_le_bytes().to_vec()));
        }
        // A block stored in a partition's levels (not cached), read and not filled.
        let (b, p) = (0..64u64)
            .find_map(|b| {
                let (p, real) = o.begin(b).unwrap();
                let plan = o.plan_read(b, p, real).unwrap();
                if plan.real.is_some() {
                    return Some((b, p));
                }
                serve_read(&mut o, &sim, &plan, b);
                o.finish(b, Op::Read).unwrap();
                None
            })
            .expect("some block is stored");
        let mut refused = None;
        for _ in 0..(2u32 << config.levels()) {
            let sh = o.plan_evict(p);
            let got = shuffle_reads(&sim, &sh);
            write_shuffle(&mut sim, &sh, &got);
            let spilled = sh.spill.iter().map(|x| (*x, got[x].clone())).collect();
            if let Err(e) = o.finish_shuffle(sh, spilled) {
                refused = Some(e.to_string());
                break;
            }
        }
        let refused = refused.unwrap_or_else(|| {
            panic!(
                "{config:?}: every level of partition {p} was merged while block {b}'s read was \
                 in flight, and no shuffle refused: a record retired its only logged copy"
            )
        });
        assert!(refused.contains(&format!("block {b}")), "{refused}");
    }
}

#[test]
fn planner_matches_a_hashmap() {
    for seed in 0..9u64 {
        let blocks = 200;
        // ObliviStore's setting, CURIOUS's (three blocks per eviction, none in the
        // background), and CURIOUS over Path ORAM partitions (z = 5).
        let config = match seed % 3 {
            0 => ObliviStoreConfig::new(blocks, 8).unwrap(),
            1 => ObliviStoreConfig::curious(blocks, 8, 3).unwrap(),
            _ => ObliviStoreConfig::curious_path(blocks, 8, 3, 5).unwrap(),
        };
        let (mut o, mut sim) = fresh(config, seed);
        let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut real_evictions = 0;
        let mut debt = 0.0;
        for i in 0..4000u64 {
            let b = if rng.gen_bool(0.3) { rng.gen_range(0..5) } else { rng.gen_range(0..blocks) };
            if rng.gen_bool(0.5) {
                let data = i.to_le_bytes().to_vec();
                let old = access(&mut o, &mut sim, &mut rng, &mut debt, b, Op::Write(data.clone()));
                assert_eq!(old, model.get(&b).cloned().unwrap_or(vec![0; 8]));
                model.insert(b, data);
            } else {
                let got = access(&mut o, &mut sim, &mut rng, &mut debt, b, Op::Read);
                assert_eq!(got, model.get(&b).cloned().unwrap_or(vec![0; 8]), "block {b}");
            }
            o.check_invariants().unwrap();
            if i % 500 == 0 {
                real_evictions += o.stats().real_evictions;
                let s = o.state().unwrap();
                o = ObliviStoreOram::from_state(s).unwrap();
            }
        }
        assert!(o.cached() < 200, "cache grew to {}", o.cached());
        assert!(real_evictions + o.stats().real_evictions > 1000);
    }
}

/// Accesses read a partition while its shuffle is in flight (the driver's asynchrony, here
/// with every step interleaved at random): each read skips the levels the shuffle merges, a
/// block in one of them comes with the shuffle's reads, evictions queue behind the shuffle,
/// and reads wait only while [`ObliviStoreOram::readable`] says a level's public read count
/// has reached its dummies. Checked against a `HashMap` (in the order the accesses finish),
/// every cell read against the simulated store, and the invariants whenever nothing is in
/// flight. Few partitions, so that most accesses meet a shuffle.
#[test]
fn reads_during_shuffles_match_a_hashmap() {
    struct Pending {
        b: u64,
        op: Op,
        p: u32,
        real: bool,
        planned: Option<Option<u64>>,
    }
    for seed in 0..6u64 {
        let blocks = 120;
        let config = match seed % 2 {
            0 => ObliviStoreConfig::with_partitions(blocks, 8, 3, 0.5).unwrap(),
            _ => ObliviStoreConfig::curious(blocks, 8, 3).unwrap(),
        };
        let partitions = config.partitions();
        let (mut o, mut sim) = fresh(config.clone(), seed);
        let mut rng = ChaCha8Rng::seed_from_u64(seed + 100);
        let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
        // partition → (the shuffle in flight, whether its reads arrived); evictions queued.
        let mut flying: HashMap<u32, (Shuffle, bool)> = HashMap::new();
        let mut queued: HashMap<u32, u32> = HashMap::new();
        let mut pending: Vec<Pending> = Vec::new();
        let mut debt = 0.0;
        let mut finished = 0u64;
        let evict = |o: &mut ObliviStoreOram,
                     flying: &mut HashMap<u32, (Shuffle, bool)>,
                     queued: &mut HashMap<u32, u32>,
                     p: u32| {
            match flying.entry(p) {
                std::collections::hash_map::Entry::Occupied(_) => {
                    *queued.entry(p).or_default() += 1
                }
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert((o.plan_evict(p), false));
                }
            }
        };
        let mut step = 0u64;
        while finished < 3000 || !pending.is_empty() || !flying.is_empty() {
            step += 1;
            assert!(step < 200_000, "no progress");
            let roll = rng.gen_range(0..10);
            if roll < 3 && finished < 3000 && pending.len() < 12 {
                // A new access.
                let b =
                    if rng.gen_bool(0.3) { rng.gen_range(0..4) } else { rng.gen_range(0..blocks) };
                let op = if rng.gen_bool(0.5) {
                    Op::Write((step << 8 | b).to_le_bytes().to_vec())
                } else {
                    Op::Read
                };
                let (p, real) = o.begin(b).unwrap();
                pending.push(Pending { b, op, p, real, planned: None });
            } else if roll < 6 {
                // Plan the read of an access that has not read yet, if its partition allows.
                let Some(i) = pending.iter().position(|a| a.planned.is_none()) else { continue };
                let a = &mut pending[i];
                if !o.readable(a.p) {
                    assert!(flying.contains_key(&a.p), "a read waits with no shuffle in flight");
                    continue;
                }
                let plan = o.plan_read(a.b, a.p, a.real).unwrap();
                serve_read(&mut o, &sim, &plan, a.b);
                a.planned = Some(plan.after);
                let p = a.p;
                evict(&mut o, &mut flying, &mut queued, p);
                debt += config.evict_rate();
                while debt >= 1.0 {
                    debt -= 1.0;
                    let q = rng.gen_range(0..partitions);
                    evict(&mut o, &mut flying, &mut queued, q);
                }
            } else if roll < 8 {
                // A shuffle's reads arrive, or its writes land.
                let keys: Vec<u32> = flying.keys().copied().collect();
                let Some(&p) = keys.get(rng.gen_range(0..keys.len().max(1))) else { continue };
                let (sh, arrived) = flying.remove(&p).unwrap();
                let got = shuffle_reads(&sim, &sh);
                if !arrived {
                    o.shuffle_fetched(p, sh.serial, got);
                    flying.insert(p, (sh, true));
                    continue;
                }
                land_shuffle(&mut o, &mut sim, sh, got);
                if let Some(n) = queued.get_mut(&p).filter(|n| **n > 0) {
                    *n -= 1;
                    flying.insert(p, (o.plan_evict(p), false));
                }
            } else {
                // An access that has read finishes once its block is known and any shuffle it
                // must wait for has read.
                let Some(i) = pending.iter().position(|a| {
                    a.planned.is_some_and(|after| {
                        after.is_none_or(|s| o.shuffle_arrived(a.p, s)) && o.ready(a.b)
                    })
                }) else {
                    continue;
                };
                let a = pending.swap_remove(i);
                let old = o.finish(a.b, a.op.clone()).unwrap();
                let want = model.get(&a.b).cloned().unwrap_or(vec![0; 8]);
                assert_eq!(old, want, "seed {seed}: block {}", a.b);
                if let Op::Write(d) = a.op {
                    model.insert(a.b, d);
                }
                finished += 1;
            }
            if pending.is_empty() && flying.is_empty() {
                o.check_invariants().unwrap();
            }
        }
        o.check_invariants().unwrap();
        let st = o.stats();
        eprintln!(
            "seed {seed}: {} of {} accesses read around a shuffle, {} carried",
            st.reads_during_shuffles, st.accesses, st.carried
        );
        assert!(st.reads_during_shuffles > 300, "{st:?}");
        assert!(st.carried > 10, "{st:?}");
        // Everything reads back, one access at a time.
        let mut debt = 0.0;
        for b in 0..blocks {
            let got = access(&mut o, &mut sim, &mut rng, &mut debt, b, Op::Read);
            assert_eq!(got, model.get(&b).cloned().unwrap_or(vec![0; 8]), "block {b}");
        }
    }
}

/// The eviction cache stays a small queue, whatever the workload: for ObliviStore (ν = 0.05
/// background evictions per access, where it settles near `5P` blocks after draining what the
/// first writes left) within `8P`, for CURIOUS (`b = 3` blocks per eviction, no background
/// ones) within `3P`.
#[test]
fn the_eviction_cache_stays_small() {
    let blocks = 4096;
    for (name, hot, curious) in [
        ("uniform", false, 0),
        ("hammer", true, 0),
        ("curious", false, 1),
        ("curious-path", false, 2),
        ("curious-path hammer", true, 2),
    ] {
        let config = match curious {
            1 => ObliviStoreConfig::curious(blocks, 8, 3).unwrap(),
            2 => ObliviStoreConfig::curious_path(blocks, 8, 3, 5).unwrap(),
            _ => ObliviStoreConfig::new(blocks, 8).unwrap(),
        };
        let partitions = config.partitions() as usize;
        let bound = if config.evict_rate() > 0.0 { 8 } else { 3 } * partitions;
        let (mut o, mut sim) = fresh(config, 3);
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let mut debt = 0.0;
        // Every block written once, then reads.
        for b in 0..blocks {
            access(&mut o, &mut sim, &mut rng, &mut debt, b, Op::Write(b.to_le_bytes().to_vec()));
        }
        let mut max = 0;
        for i in 0..20_000u64 {
            let b = if hot { i % 4 } else { rng.gen_range(0..blocks) };
            let got = access(&mut o, &mut sim, &mut rng, &mut debt, b, Op::Read);
            assert_eq!(got, b.to_le_bytes().to_vec());
            max = max.max(o.cached());
        }
        o.check_invariants().unwrap();
        eprintln!("{name}: largest cache {max} blocks ({partitions} partitions)");
        assert!(max <= bound, "{name}: the cache reached {max} blocks (bound {bound})");
    }
}

/// A bulk load (what `recover` and a growth build) places every block where reads find it,
/// writes exactly the cells a new ORAM starts with, and the ORAM then behaves like a fresh
/// one: a `HashMap` model over thousands of accesses, invariants after every step.
#[test]
fn a_bulk_loaded_oram_serves_every_loaded_block() {
    for seed in 0..6u64 {
        let blocks = 300;
        let config = match seed % 3 {
            0 => ObliviStoreConfig::new(blocks, 8).unwrap(),
            1 => ObliviStoreConfig::curious(blocks, 8, 3).unwrap(),
            _ => ObliviStoreConfig::curious_path(blocks, 8, 3, 5).unwrap(),
        };
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // Every block but a few (never written: they read as zeros).
        let loaded: Vec<u64> = (0..blocks).filter(|_| rng.gen_bool(0.9)).collect();
        let mut model: HashMap<u64, Vec<u8>> =
            loaded.iter().map(|&b| (b, (b * 7 + 1).to_le_bytes().to_vec())).collect();
        let serial = 1 << 40;
        let (mut o, cells, left) = ObliviStoreOram::bulk_loaded_seeded(
            config.clone(),
            loaded.iter().copied(),
            serial,
            seed,
        )
        .unwrap();
        let fresh = ObliviStoreOram::seeded(config, seed);
        let shape: Vec<_> = fresh.initial_cells().map(|c| c.cell).collect();
        assert_eq!(cells.iter().map(|c| c.cell).collect::<Vec<_>>(), shape);
        assert!(cells.iter().all(|c| c.serial == serial));
        let held = cells.iter().filter(|c| c.holder != DUMMY).count();
        assert_eq!(held + left.len(), loaded.len(), "every block placed or left over");
        for b in left {
            o.load_cached(b, model[&b].clone()).unwrap();
        }
        o.check_invariants().unwrap();
        assert!(o.next_serial() > serial);
        let mut sim = Sim::new();
        for c in &cells {
            let data = model.get(&c.holder).cloned().unwrap_or(vec![0; 8]);
            sim.insert(c.cell.0, (c.serial, c.holder, data));
        }
        // Through a checkpoint, as the rebuild saves it.
        o = ObliviStoreOram::from_state(o.state().unwrap()).unwrap();
        let mut debt = 0.0;
        for i in 0..2000u64 {
            let b = rng.gen_range(0..blocks);
            if rng.gen_bool(0.3) {
                let data = (i << 20).to_le_bytes().to_vec();
                let old = access(&mut o, &mut sim, &mut rng, &mut debt, b, Op::Write(data.clone()));
                assert_eq!(old, model.get(&b).cloned().unwrap_or(vec![0; 8]));
                model.insert(b, data);
            } else {
                let got = access(&mut o, &mut sim, &mut rng, &mut debt, b, Op::Read);
                assert_eq!(got, model.get(&b).cloned().unwrap_or(vec![0; 8]), "block {b}");
            }
            o.check_invariants().unwrap();
        }
    }
}

/// The partitions of a bulk load are uniform whatever the blocks are: chi-square over the
/// partitions of 2,000 consecutive blocks.
#[test]
fn a_bulk_load_spreads_blocks_uniformly() {
    let config = ObliviStoreConfig::new(4096, 8).unwrap();
    let parts = config.partitions() as usize;
    let (o, _, left) = ObliviStoreOram::bulk_loaded_seeded(config, 0..2000, 1 << 40, 9).unwrap();
    assert!(left.is_empty());
    let mut counts = vec![0f64; parts];
    for (_, cell) in o.blocks_stored() {
        counts[(cell.0 / o.config().partition_cells()) as usize] += 1.0;
    }
    let expected = 2000.0 / parts as f64;
    let chi2: f64 = counts.iter().map(|c| (c - expected).powi(2) / expected).sum();
    // 63 degrees of freedom: the 99.9th percentile is about 103.4.
    assert!(chi2 < 103.4, "chi-square {chi2:.1} over {parts} partitions");
}

/// What a shuffle reads is a uniformly random set of a public size: from each level it merges,
/// as many cells as the level can hold real blocks (or every unread one, if fewer), none that
/// an access read since the level was written, in cell order; and over many shuffles the cells
/// read are spread evenly over the levels' slots (chi-square), whatever the workload. Reading
/// the live cells plus the lowest unread others would fail the spread; reading only the live
/// ones, the count.
#[test]
fn a_shuffle_reads_a_public_number_of_uniformly_placed_cells() {
    let blocks = 1024;
    for (name, hot, curious) in
        [("uniform", false, false), ("hammer", true, false), ("curious", false, true)]
    {
        let config = if curious {
            ObliviStoreConfig::curious(blocks, 8, 3).unwrap()
        } else {
            ObliviStoreConfig::new(blocks, 8).unwrap()
        };
        let top = config.levels();
        // Every cell of the store → (partition, level, slot), from the public layout.
        let mut where_is = HashMap::new();
        for p in 0..config.partitions() {
            for l in 0..=top {
                for area in 0..if l == top { 2 } else { 1 } {
                    for s in 0..config.level_slots(l) {
                        where_is.insert(config.cell(p, l, area, s).0, (p, l, s));
                    }
                }
            }
        }
        // The slots of each level that accesses read since the level was written.
        let mut read: HashMap<(u32, u32), std::collections::HashSet<u64>> = HashMap::new();
        let mut bins = [0u64; 8];
        let mut sampled = 0;
        let mut watch = |seen: Seen<'_>| match seen {
            Seen::Read(slots) => {
                for r in slots {
                    let (p, l, s) = where_is[&r.cell.0];
                    assert!(read.entry((p, l)).or_default().insert(s), "{name}: slot read twice");
                }
            }
            Seen::Shuffle(sh) => {
                let mut by_level: HashMap<u32, Vec<u64>> = HashMap::new();
                for r in &sh.reads {
                    let (p, l, s) = where_is[&r.cell.0];
                    assert_eq!(p, sh.partition);
                    by_level.entry(l).or_default().push(s);
                }
                for (l, slots) in by_level {
                    let done = read.get(&(sh.partition, l)).map_or(0, |r| r.len() as u64);
                    let unread = config.level_slots(l) - done;
                    let want = unread.min(config.level_reals(l));
                    assert_eq!(slots.len() as u64, want, "{name}: cells read from level {l}");
                    assert!(slots.windows(2).all(|w| w[0] < w[1]), "{name}: not in slot order");
                    for s in &slots {
                        assert!(
                            !read.get(&(sh.partition, l)).is_some_and(|r| r.contains(s)),
                            "{name}: a shuffle read a slot an access had read"
                        );
                    }
                    if want < unread && config.level_slots(l) >= 8 {
                        sampled += 1;
                        for s in slots {
                            bins[(s * 8 / config.level_slots(l)) as usize] += 1;
                        }
                    }
                }
                // The merged levels go away and the new level is written.
                for l in 0..=top {
                    if l <= sh.level {
                        read.remove(&(sh.partition, l));
                    }
                }
            }
        };
        let (mut o, mut sim) = fresh(config.clone(), 5);
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut debt = 0.0;
        for b in 0..blocks {
            let data = Op::Write(b.to_le_bytes().to_vec());
            access_watched(&mut o, &mut sim, &mut rng, &mut debt, b, data, &mut watch);
        }
        for i in 0..20_000u64 {
            let b = if hot { i % 3 } else { rng.gen_range(0..blocks) };
            access_watched(&mut o, &mut sim, &mut rng, &mut debt, b, Op::Read, &mut watch);
        }
        let total: u64 = bins.iter().sum();
        let expected = total as f64 / 8.0;
        let chi2: f64 = bins.iter().map(|&c| (c as f64 - expected).powi(2) / expected).sum();
        eprintln!("{name}: {sampled} partial level reads, {total} cells, bins {bins:?}");
        if !curious {
            assert!(sampled > 1000, "{name}: only {sampled} shuffles read part of a level");
        }
        // 7 degrees of freedom: the 99.9th percentile is about 24.3. (CURIOUS's levels take
        // `b` blocks per eviction and lose a dummy per read: a shuffle reads all that is left.)
        assert!(
            total == 0 || chi2 < 24.3,
            "{name}: chi-square {chi2:.1} over slot positions {bins:?}"
        );
    }
}

/// CURIOUS over Path ORAM partitions takes more partitions (at most `2⌈√N⌉`) only where that
/// makes its trees a level lower, and every tree keeps room for its partition's capacity at
/// its leaves.
#[test]
fn curious_path_trades_partitions_for_shorter_paths() {
    for blocks in [64u64, 200, 256, 1000, 4096, 1 << 16, 100_000, 1 << 20] {
        let c = ObliviStoreConfig::curious_path(blocks, 8, 3, 5).unwrap();
        let (z, height) = c.path_shape().unwrap();
        let root = (blocks as f64).sqrt().ceil() as u32;
        let plain = ObliviStoreConfig::curious(blocks, 8, 3).unwrap();
        let plain_height =
            (plain.capacity() as u64).div_ceil(z as u64).next_power_of_two().trailing_zeros();
        assert!(c.partitions() >= root && c.partitions() <= 2 * root, "{blocks}: {c:?}");
        assert!(c.capacity() as u64 <= (z as u64) << height, "{blocks}: no room at the leaves");
        assert!(c.partitions() as u64 * c.capacity() as u64 >= blocks);
        if c.partitions() > root {
            assert_eq!(height + 1, plain_height, "{blocks}: more partitions for nothing");
        } else {
            assert_eq!(height, plain_height);
        }
    }
    let c = ObliviStoreConfig::curious_path(1 << 16, 4096, 3, 5).unwrap();
    assert_eq!((c.partitions(), c.path_shape()), (497, Some((5, 5))));
}
