//! The TEE-assisted tree's planner against a `HashMap`, in plaintext: a toy store carries out
//! the plans exactly as the trusted component and its host would (select one cell per query;
//! per round, permute each node with the blocks coming down and carry the rest on), and checks
//! what a hostile store could use: every query reads one cell of each node of one path, no cell
//! is read twice between two writes, the paths are uniform whatever the workload, and the
//! rounds follow the public schedule.

use std::collections::{HashMap, HashSet};

use blindfold_oram::tee::{QueryStep, RoundPlan, SlotTag, TeeOram, TeeOramConfig, DUMMY};
use blindfold_oram::{BlockId, OramError};
use blindfold_store::CellId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The store and the trusted component, in plaintext.
struct Toy {
    cells: HashMap<u64, (SlotTag, Vec<u8>)>,
    read_since_write: HashSet<u64>,
    /// Every query's cells, in order.
    queries: Vec<Vec<u64>>,
    /// Every round's nodes (reshuffles marked), in order.
    rounds: Vec<(bool, Vec<u32>)>,
}

impl Toy {
    fn new(oram: &TeeOram, data: impl Fn(SlotTag) -> Vec<u8>) -> Self {
        let cells = oram.initial_cells().map(|(c, t)| (c.0, (t, data(t)))).collect();
        Self { cells, read_since_write: HashSet::new(), queries: Vec::new(), rounds: Vec::new() }
    }

    fn query(&mut self, cells: &[CellId], target: u32, expected: SlotTag) -> Vec<u8> {
        for c in cells {
            assert!(self.read_since_write.insert(c.0), "cell {} read twice between writes", c.0);
        }
        self.queries.push(cells.iter().map(|c| c.0).collect());
        let (tag, data) = self.cells.get(&cells[target as usize].0).expect("cell written");
        assert_eq!(*tag, expected, "the planner's index disagrees with the store");
        data.clone()
    }

    fn round(&mut self, plan: &RoundPlan) {
        let mut carry: Vec<(SlotTag, Vec<u8>)> =
            plan.incoming.iter().map(|u| (u.tag, u.data.clone())).collect();
        for layer in &plan.layers {
            assert_eq!(layer.read.len(), layer.write.len());
            let mut buf: Vec<(SlotTag, Vec<u8>)> =
                layer.read.iter().map(|c| self.cells[&c.0].clone()).collect();
            buf.append(&mut carry);
            assert_eq!(buf.len(), layer.perm.len());
            let mut seen = vec![false; buf.len()];
            let mut out = vec![None; buf.len()];
            for (j, item) in buf.into_iter().enumerate() {
                let to = layer.perm[j] as usize;
                assert!(!seen[to], "not a permutation");
                seen[to] = true;
                out[to] = Some(item);
            }
            let mut out = out.into_iter().map(Option::unwrap);
            for c in &layer.write {
                self.cells.insert(c.0, out.next().unwrap());
                self.read_since_write.remove(&c.0);
            }
            carry = out.collect();
        }
        self.rounds.push((plan.incoming.is_empty(), plan.layers.iter().map(|l| l.node).collect()));
    }
}

/// Runs one access through the planner, with a round possibly in flight (executed after
/// `delay` more queries).
struct Harness {
    oram: TeeOram,
    toy: Toy,
    pending: Option<(RoundPlan, u32)>,
    rng: ChaCha8Rng,
    max_delay: u32,
}

impl Harness {
    fn new(config: TeeOramConfig, seed: u64, max_delay: u32) -> Self {
        let oram = TeeOram::with_seed(config, seed);
        let toy = Toy::new(&oram, |_| vec![0; oram.config().block_size() as usize]);
        Self { oram, toy, pending: None, rng: ChaCha8Rng::seed_from_u64(seed ^ 1), max_delay }
    }

    fn land_pending(&mut self) {
        if let Some((plan, _)) = self.pending.take() {
            self.toy.round(&plan);
            self.oram.finish_round().unwrap();
        }
    }

    fn access(&mut self, block: u64, write: Option<Vec<u8>>) -> Result<Vec<u8>, OramError> {
        let plan = loop {
            match self.oram.plan_query(BlockId(block))? {
                QueryStep::Query(p) => break p,
                QueryStep::Wait => self.land_pending(),
                QueryStep::Reshuffle(r) => {
                    assert!(self.pending.is_none());
                    self.toy.round(&r);
                    self.oram.finish_round()?;
                }
            }
        };
        assert_eq!(plan.cells.len() as u32, self.oram.config().layers());
        let got = self.toy.query(&plan.cells, plan.target, plan.expected);
        let data = self
            .oram
            .finish_query(
                BlockId(block),
                if plan.real { Some(got) } else { plan.data.clone() },
                write,
            )?
            .data;
        if let Some((_, left)) = &mut self.pending {
            if *left == 0 {
                self.land_pending();
            } else {
                *left -= 1;
            }
        }
        if self.oram.round_due() {
            let plan = self.oram.plan_round()?;
            let delay = self.rng.gen_range(0..=self.max_delay);
            self.pending = Some((plan, delay));
            if delay == 0 {
                self.land_pending();
            }
        }
        Ok(data)
    }
}

fn small(blocks: u64) -> TeeOramConfig {
    TeeOramConfig::builder(blocks, 16).arity(4).round_queries(8).build().unwrap()
}

fn block_of(v: u64) -> Vec<u8> {
    let mut d = vec![0u8; 16];
    d[..8].copy_from_slice(&v.to_le_bytes());
    d
}

#[test]
fn matches_a_hashmap_with_rounds_in_flight() {
    let config = small(300);
    assert!(config.layers() >= 3, "{config:?}");
    let mut h = Harness::new(config, 11, 6);
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for i in 0..6000u64 {
        // Mostly a hot set of 20 blocks, sometimes anywhere.
        let b = if rng.gen_bool(0.7) { rng.gen_range(0..20) } else { rng.gen_range(0..300) };
        if rng.gen_bool(0.4) {
            let d = block_of(i);
            let old = h.access(b, Some(d.clone())).unwrap();
            assert_eq!(old, model.get(&b).cloned().unwrap_or(vec![0; 16]), "block {b}");
            model.insert(b, d);
        } else {
            let got = h.access(b, None).unwrap();
            assert_eq!(got, model.get(&b).cloned().unwrap_or(vec![0; 16]), "block {b}");
        }
    }
    h.land_pending();
    for (b, d) in &model {
        assert_eq!(&h.access(*b, None).unwrap(), d, "block {b} at the end");
    }
    let s = h.oram.stats();
    assert!(s.rounds >= 700, "{s:?}");
    assert!(s.real_queries > 1000, "{s:?}");
    // The ring stays near one round's worth of blocks.
    assert!(s.max_waiting <= 3 * h.oram.config().round_blocks() as usize, "{s:?}");
}

#[test]
fn bulk_loaded_blocks_read_back() {
    let config = small(200);
    let mut oram = TeeOram::with_seed(config.clone(), 3);
    oram.bulk_place(200).unwrap();
    let toy =
        Toy::new(&oram, |t| if t.block == DUMMY { vec![0; 16] } else { block_of(t.block + 1) });
    let mut h =
        Harness { oram, toy, pending: None, rng: ChaCha8Rng::seed_from_u64(2), max_delay: 3 };
    for round in 0..3 {
        for b in 0..200u64 {
            let expect = if round == 0 { block_of(b + 1) } else { block_of(b + 1000) };
            let got = h.access(b, (round == 0).then(|| block_of(b + 1000))).unwrap();
            assert_eq!(got, expect, "block {b} pass {round}");
        }
    }
    assert!(TeeOram::with_seed(config, 1).bulk_place(201).is_err(), "more blocks than the tree");
}

/// Which node (index in creation order) and layer a cell belongs to.
fn locate(config: &TeeOramConfig, cell: u64) -> (u32, u32) {
    let mut base = 0u64;
    let mut node = 0u32;
    for layer in 0..config.layers() {
        let z = u64::from(config.slots_at(layer));
        let count = u64::from(config.arity()).pow(layer);
        if cell < base + count * 2 * z {
            return (node + ((cell - base) / (2 * z)) as u32, layer);
        }
        base += count * 2 * z;
        node += count as u32;
    }
    panic!("cell {cell} outside the tree")
}

fn layer_start(config: &TeeOramConfig, layer: u32) -> u32 {
    (0..layer).map(|i| config.arity().pow(i)).sum()
}

/// The leaf-layer node index (0..leaves) each query's path ends at; checks the path shape.
fn query_leaves(config: &TeeOramConfig, toy: &Toy) -> Vec<u32> {
    let m = config.arity();
    toy.queries
        .iter()
        .map(|cells| {
            let mut prev: Option<u32> = None;
            for (i, &c) in cells.iter().enumerate() {
                let (node, layer) = locate(config, c);
                assert_eq!(layer, i as u32, "cell {i} of a query is on layer {layer}");
                let idx = node - layer_start(config, layer);
                if let Some(p) = prev {
                    assert_eq!(idx / m, p, "the query's cells are not on one path");
                }
                prev = Some(idx);
            }
            prev.unwrap()
        })
        .collect()
}

fn chi_square_ok(counts: &[u64]) -> bool {
    let n: u64 = counts.iter().sum();
    let e = n as f64 / counts.len() as f64;
    let chi: f64 = counts.iter().map(|&c| (c as f64 - e).powi(2) / e).sum();
    let df = (counts.len() - 1) as f64;
    // Far beyond the 99.9th percentile for these degrees of freedom (mean df, sd √(2df)).
    chi < df + 6.0 * (2.0 * df).sqrt()
}

fn run_workload(pick: impl Fn(u64) -> u64, seed: u64) -> (TeeOramConfig, Toy) {
    let config = small(256);
    let mut h = Harness::new(config.clone(), seed, 0);
    for i in 0..4000u64 {
        let b = pick(i);
        h.access(b, (i % 3 == 0).then(|| block_of(i))).unwrap();
    }
    h.land_pending();
    (config, h.toy)
}

#[test]
fn query_paths_are_uniform_whatever_the_workload() {
    let (config, hammer) = run_workload(|_| 7, 21);
    let (_, scan) = run_workload(|i| i % 256, 22);
    let leaves = config.leaves() as usize;
    for (name, toy) in [("hammer", &hammer), ("scan", &scan)] {
        let mut counts = vec![0u64; leaves];
        for l in query_leaves(&config, toy) {
            counts[l as usize] += 1;
        }
        assert!(chi_square_ok(&counts), "{name}: leaves of query paths not uniform: {counts:?}");
    }
    // Same shape: the same number of queries and the same eviction rounds, in the same order
    // (reshuffles aside, which follow the public read counts).
    assert_eq!(hammer.queries.len(), scan.queries.len());
    let rounds =
        |t: &Toy| t.rounds.iter().filter(|r| !r.0).map(|r| r.1.clone()).collect::<Vec<_>>();
    assert_eq!(rounds(&hammer), rounds(&scan), "eviction paths depend on the workload");
    assert!(!rounds(&hammer).is_empty());
}

#[test]
fn eviction_paths_follow_reverse_lexicographic_order() {
    let (config, toy) = run_workload(|i| i % 50, 4);
    let m = config.arity();
    let leaf_layer = config.layers() - 1;
    let start = layer_start(&config, leaf_layer);
    let leaves: Vec<u32> =
        toy.rounds.iter().filter(|r| !r.0).map(|r| *r.1.last().unwrap() - start).collect();
    for (i, &leaf) in leaves.iter().enumerate() {
        // Reverse the base-m digits of i (mod leaves).
        let mut r = i as u64 % config.leaves();
        let mut want = 0u64;
        for _ in 0..leaf_layer {
            want = want * u64::from(m) + r % u64::from(m);
            r /= u64::from(m);
        }
        assert_eq!(u64::from(leaf), want, "round {i}");
    }
}

#[test]
fn reshuffles_happen_and_keep_data() {
    // Few reads allowed per node: the root is reshuffled often.
    let config =
        TeeOramConfig::builder(64, 16).arity(2).round_queries(8).dummy_reads(3).build().unwrap();
    let mut h = Harness::new(config, 9, 2);
    let mut model = HashMap::new();
    for i in 0..2000u64 {
        let b = (i * 7) % 64;
        let old = h.access(b, Some(block_of(i))).unwrap();
        assert_eq!(old, model.get(&b).cloned().unwrap_or(vec![0; 16]));
        model.insert(b, block_of(i));
    }
    assert!(h.oram.stats().reshuffles > 100, "{:?}", h.oram.stats());
}

#[test]
fn defaults_for_the_papers_sizes() {
    // 1 GB of 1 KiB blocks, the paper's rounds of 800 queries, m = 8 (Table I's first row).
    let c = TeeOramConfig::builder(1 << 20, 1024).round_queries(800).build().unwrap();
    assert_eq!((c.arity(), c.round_queries(), c.round_blocks()), (8, 800, 1600));
    assert_eq!(c.layers(), 4, "{c:?}");
    // Our default rounds: every layer of the same tree permutes at most 4,096 blocks (the
    // trusted component's cheaper layout), still in four layers.
    let d = TeeOramConfig::builder(1 << 20, 1024).build().unwrap();
    assert_eq!((d.arity(), d.round_queries(), d.round_blocks()), (8, 450, 900));
    assert_eq!(d.layers(), 4, "{d:?}");
    for z in [d.node_slots(), d.leaf_slots()] {
        assert!(z as usize + 900 <= 4096, "{d:?}");
    }
    assert!(c.node_slots() as usize + 1600 <= blindfold_oram::tee::MAX_PERMUTED, "{c:?}");
    assert!(c.leaf_slots() > 2048 + c.dummy_reads(), "{c:?}");
    // Too many blocks per round for the trusted component's pages.
    assert!(TeeOramConfig::builder(1 << 20, 1024).round_queries(3000).build().is_err());
    assert!(TeeOramConfig::builder(100, 16).round_queries(8).round_blocks(4).build().is_err());
    assert!(TeeOramConfig::builder(0, 16).build().is_err());
}

#[test]
fn out_of_range_and_wrong_sizes_are_refused() {
    let mut oram = TeeOram::with_seed(small(10), 1);
    assert!(matches!(oram.plan_query(BlockId(10)), Err(OramError::BlockOutOfRange { .. })));
    let Ok(QueryStep::Query(_)) = oram.plan_query(BlockId(1)) else { panic!() };
    assert!(matches!(
        oram.finish_query(BlockId(1), None, Some(vec![0; 3])).map(|f| f.data),
        Err(OramError::WrongBlockSize { .. })
    ));
    assert!(oram.finish_round().is_err(), "no round in flight");
}

/// What the driver's redo log keeps, in the order it keeps it.
#[derive(Clone, Debug)]
enum Logged {
    Ring(u64, Vec<u8>),
    Round(blindfold_oram::tee::RoundRecord),
    Done,
}

/// A gateway that logs as the durable driver does (every access committed), crashes at random
/// instants and recovers from its last checkpoint and the log, over a store that remembers
/// which cells it saw read.
struct Crashy {
    oram: TeeOram,
    toy: Toy,
    log: Vec<Logged>,
    checkpoint: (blindfold_oram::tee::TeeOramState, usize),
    pending: Option<RoundPlan>,
}

impl Crashy {
    fn run_round(&mut self, plan: RoundPlan) {
        self.toy.round(&plan);
        self.oram.finish_round().unwrap();
        self.log.push(Logged::Done);
    }

    fn access(&mut self, block: u64, write: Option<Vec<u8>>, rng: &mut ChaCha8Rng) -> Vec<u8> {
        let plan = loop {
            match self.oram.plan_query(BlockId(block)).unwrap() {
                QueryStep::Query(p) => break p,
                QueryStep::Wait => {
                    let p = self.pending.take().unwrap();
                    self.run_round(p);
                }
                QueryStep::Reshuffle(r) => {
                    self.log.push(Logged::Round(r.record()));
                    self.run_round(r);
                }
            }
        };
        let got = self.toy.query(&plan.cells, plan.target, plan.expected);
        let done = self
            .oram
            .finish_query(
                BlockId(block),
                if plan.real { Some(got) } else { plan.data.clone() },
                write,
            )
            .unwrap();
        if done.ring_changed {
            let data = self.oram.ring_data(block).unwrap().to_vec();
            self.log.push(Logged::Ring(block, data));
        }
        if self.pending.is_some() && rng.gen_bool(0.3) {
            let p = self.pending.take().unwrap();
            self.run_round(p);
        }
        if self.oram.round_due() {
            let p = self.oram.plan_round().unwrap();
            self.log.push(Logged::Round(p.record()));
            self.pending = Some(p);
        }
        self.oram.check_invariants().unwrap();
        if rng.gen_bool(0.01) && self.pending.is_none() {
            self.checkpoint = (self.oram.state().unwrap(), self.log.len());
        }
        done.data
    }

    /// Loses everything in memory; the store may or may not have carried out the round in
    /// flight.
    fn crash_and_recover(&mut self, rng: &mut ChaCha8Rng, seed: u64) {
        if let Some(p) = self.pending.take() {
            if rng.gen_bool(0.5) {
                self.toy.round(&p); // the store finished it; the gateway never heard
            }
        }
        let (state, from) = self.checkpoint.clone();
        let mut oram = TeeOram::from_state(state, Some(seed)).unwrap();
        let entries = self.log[from..].to_vec();
        for (i, e) in entries.iter().enumerate() {
            match e {
                Logged::Ring(b, d) => oram.replay_ring(*b, d.clone()).unwrap(),
                Logged::Round(r) => {
                    let landed = matches!(
                        entries[i + 1..].iter().find(|e| !matches!(e, Logged::Ring(..))),
                        Some(Logged::Done)
                    );
                    if !landed {
                        // Carry it out again, from the areas it reads (still intact).
                        let plan = RoundPlan {
                            round: r.round,
                            incoming: r
                                .incoming
                                .iter()
                                .map(|t| blindfold_oram::tee::Upload {
                                    tag: *t,
                                    data: if t.block == DUMMY {
                                        vec![0; 16]
                                    } else {
                                        oram.ring_data(t.block).unwrap().to_vec()
                                    },
                                })
                                .collect(),
                            layers: r
                                .layers
                                .iter()
                                .map(|(node, perm)| {
                                    let (read, write) = oram.node_areas(*node).unwrap();
                                    blindfold_oram::tee::LayerPlan {
                                        node: *node,
                                        read,
                                        write,
                                        perm: perm.clone(),
                                    }
                                })
                                .collect(),
                            leaves: r.leaves.clone(),
                        };
                        self.toy.round(&plan);
                    }
                    oram.replay_round(r).unwrap();
                }
                Logged::Done => {}
            }
        }
        // The round left in flight has now landed.
        let last_round = self.log.iter().rposition(|e| !matches!(e, Logged::Ring(..)));
        if last_round.is_some_and(|i| matches!(self.log[i], Logged::Round(_))) {
            self.log.push(Logged::Done);
        }
        oram.check_invariants().unwrap();
        oram.exhaust_all();
        for (cell, tag) in oram.current_cells() {
            assert_eq!(self.toy.cells[&cell.0].0, tag, "after recovery, cell {}", cell.0);
        }
        if rng.gen_bool(0.5) {
            self.checkpoint = (oram.state().unwrap(), self.log.len());
        }
        self.oram = oram;
    }
}

#[test]
fn crashes_lose_no_committed_write_and_never_reread_a_slot() {
    for seed in [77, 78, 79, 80] {
        crash_run(seed);
    }
}

fn crash_run(seed: u64) {
    let config = small(200);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let oram = TeeOram::with_seed(config, 5);
    let toy = Toy::new(&oram, |_| vec![0; 16]);
    let checkpoint = (oram.state().unwrap(), 0);
    let mut g = Crashy { oram, toy, log: Vec::new(), checkpoint, pending: None };
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut crashes = 0;
    for i in 0..5000u64 {
        let b = if rng.gen_bool(0.6) { rng.gen_range(0..15) } else { rng.gen_range(0..200) };
        if rng.gen_bool(0.5) {
            let old = g.access(b, Some(block_of(i)), &mut rng);
            assert_eq!(old, model.get(&b).cloned().unwrap_or(vec![0; 16]), "block {b} at {i}");
            model.insert(b, block_of(i));
        } else {
            let got = g.access(b, None, &mut rng);
            assert_eq!(got, model.get(&b).cloned().unwrap_or(vec![0; 16]), "block {b} at {i}");
        }
        if rng.gen_bool(0.01) {
            g.crash_and_recover(&mut rng, i);
            crashes += 1;
        }
    }
    assert!(crashes > 20);
    assert!(g.oram.stats().reshuffles > 0);
}
