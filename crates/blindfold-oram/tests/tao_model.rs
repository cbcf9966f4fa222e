//! TaoStore's processor ([`TaoScheme`]) alone, without I/O or tasks: a simulated driver keeps
//! many requests in flight over a plaintext store, lets an adversarial scheduler decide when
//! each path is read, when each arrives and when write-backs land, and checks every answer
//! against a `HashMap` model. The plans (paths read, buckets written back) are the store's
//! whole view; the obliviousness tests check them directly.

use std::collections::{BTreeSet, HashMap};

use blindfold_oram::{
    BlockId, BucketId, Leaf, Op, PathOramConfig, Reveal, TaoRequest, TaoScheme, TaoSchemeConfig,
    TaoStats, Ticket, WriteBack,
};
use rand::{Rng, SeedableRng};
use rand_chacha::{ChaCha20Rng, ChaCha8Rng};
use statrs::distribution::{ChiSquared, ContinuousCDF};

const BLOCK_SIZE: u32 = 16;

fn config(blocks: u64, z: u32, k: usize) -> TaoSchemeConfig {
    let tree = PathOramConfig::builder(blocks, BLOCK_SIZE).z(z).build().unwrap();
    TaoSchemeConfig::new(&tree, k, 10_000, 1 << 20).unwrap()
}

/// What the store sees, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Event {
    /// A request arrived and its path was fixed: the path to this leaf is read.
    Read(u64),
    /// A write-back of these buckets.
    Write(BTreeSet<u64>),
}

impl Event {
    /// The event without its leaves or buckets: what must not depend on them.
    fn shape(&self) -> (u8, usize) {
        match self {
            Event::Read(_) => (0, 0),
            Event::Write(_) => (1, 0),
        }
    }
}

/// A request in flight and, once the scheduler had its path read, the copies it got.
struct Flight {
    request: TaoRequest,
    fetched: Option<Vec<Option<Vec<u8>>>>,
}

/// A write-back in progress: its paths, its snapshot, its cells, and whether the store has
/// applied them yet.
struct Writing {
    paths: Vec<Leaf>,
    wb: WriteBack,
    cells: Vec<(u64, Vec<u8>)>,
    applied: bool,
}

struct Sim {
    scheme: TaoScheme,
    config: TaoSchemeConfig,
    /// Plaintext buckets; a missing one is empty.
    store: HashMap<u64, Vec<u8>>,
    model: HashMap<u64, Vec<u8>>,
    /// Expected answer of every request, by ticket (the model at its arrival).
    expected: HashMap<Ticket, Vec<u8>>,
    flights: Vec<Flight>,
    /// Closed batches waiting for the writer.
    queue: Vec<Vec<Leaf>>,
    writing: Option<Writing>,
    arrivals: u64,
    /// Arrival counts at which batches closed.
    closes: Vec<u64>,
    trace: Vec<Event>,
    answers: u64,
    /// What every request revealed, in arrival order.
    reveals: Vec<Reveal>,
    /// The store and the model as of the last [`Sim::drain`] (a commit).
    committed: HashMap<u64, Vec<u8>>,
    committed_model: HashMap<u64, Vec<u8>>,
}

impl Sim {
    fn new(config: TaoSchemeConfig, seed: u64) -> Self {
        let posmap = vec![0; config.blocks() as usize];
        let scheme = TaoScheme::new(
            config.clone(),
            posmap,
            Vec::new(),
            TaoStats::default(),
            ChaCha20Rng::seed_from_u64(seed),
        )
        .unwrap();
        Self {
            scheme,
            config,
            store: HashMap::new(),
            model: HashMap::new(),
            expected: HashMap::new(),
            flights: Vec::new(),
            queue: Vec::new(),
            writing: None,
            arrivals: 0,
            closes: Vec::new(),
            trace: Vec::new(),
            answers: 0,
            reveals: Vec::new(),
            committed: HashMap::new(),
            committed_model: HashMap::new(),
        }
    }

    fn submit(&mut self, block: u64, op: Op) {
        let size = BLOCK_SIZE as usize;
        let before = self.model.get(&block).cloned().unwrap_or_else(|| vec![0; size]);
        if let Op::Write(d) = &op {
            self.model.insert(block, d.clone());
        }
        self.scheme.validate(BlockId(block), &op).unwrap();
        let request = self.scheme.start(BlockId(block), op);
        self.expected.insert(request.ticket(), before);
        self.reveals.push(request.reveal());
        self.trace.push(Event::Read(request.leaf().0));
        self.flights.push(Flight { request, fetched: None });
    }

    fn path(&self, leaf: Leaf) -> Vec<BucketId> {
        self.config.path(leaf).collect()
    }

    /// The store answers the read of flight `i`'s path with what it holds now.
    fn fetch(&mut self, i: usize) {
        let buckets = self.path(self.flights[i].request.leaf());
        let wanted = self.scheme.to_fetch(&buckets);
        assert_eq!(wanted.len(), buckets.len(), "no resident top: whole paths are read");
        let copies = buckets.iter().map(|b| self.store.get(&b.0).cloned()).collect();
        self.flights[i].fetched = Some(copies);
    }

    /// Flight `i`'s path arrives.
    fn arrive(&mut self, i: usize) {
        let Flight { request, fetched } = self.flights.swap_remove(i);
        let mut fetched = fetched.expect("read before it arrives");
        let buckets = self.path(request.leaf());
        let opened = self
            .scheme
            .to_open(&buckets)
            .into_iter()
            .map(|i| {
                let blocks = match fetched[i].take() {
                    Some(plain) => self.config.decode_bucket(&plain).unwrap(),
                    None => Vec::new(),
                };
                (buckets[i], blocks)
            })
            .collect();
        let ticket = request.ticket();
        let fake = request.is_fake();
        let sweep = request.is_sweep();
        let arrived = self.scheme.arrive(request, opened);
        self.arrivals += 1;
        assert_eq!(arrived.over, None);
        match arrived.answer {
            Some(data) if sweep => assert!(data.is_empty()),
            Some(data) => self.check(ticket, data),
            None => assert!(fake, "only fake reads are answered later"),
        }
        for (t, data) in arrived.answered {
            self.check(t, data);
        }
        if let Some(paths) = arrived.closed {
            assert_eq!(paths.len(), self.config.write_back_every());
            self.closes.push(self.arrivals);
            self.queue.push(paths);
        }
    }

    fn check(&mut self, ticket: Ticket, data: Vec<u8>) {
        let want = self.expected.remove(&ticket).expect("answered once");
        assert_eq!(data, want, "request {ticket:?}");
        self.answers += 1;
    }

    /// The writer takes every queued batch and snapshots their buckets.
    fn start_write(&mut self) {
        let batches = std::mem::take(&mut self.queue);
        let paths: Vec<Leaf> = batches.into_iter().flatten().collect();
        let mut wb = self.scheme.snapshot(&paths);
        let union: BTreeSet<u64> =
            paths.iter().flat_map(|&l| self.config.path(l)).map(|b| b.0).collect();
        let written: BTreeSet<u64> = wb.buckets.iter().map(|(b, _)| b.0).collect();
        assert_eq!(written, union, "a write-back covers exactly its paths' buckets");
        assert_eq!(wb.unchanged, 0);
        let cells = std::mem::take(&mut wb.buckets)
            .into_iter()
            .map(|(b, blocks)| {
                assert!(blocks.len() <= self.config.z() as usize);
                let plain =
                    self.config.encode_bucket(blocks.iter().map(|e| (e.id, e.leaf, &e.data[..])));
                (b.0, plain)
            })
            .collect();
        self.trace.push(Event::Write(union));
        self.writing = Some(Writing { paths, wb, cells, applied: false });
    }

    /// The store applies the write in progress (the driver does not know yet).
    fn apply_write(&mut self) {
        let w = self.writing.as_mut().expect("a write in progress");
        for (b, plain) in std::mem::take(&mut w.cells) {
            self.store.insert(b, plain);
        }
        w.applied = true;
    }

    /// The driver learns that the write in progress completed.
    fn finish_write(&mut self) {
        let w = self.writing.take().expect("a write in progress");
        assert!(w.applied);
        self.scheme.written(&w.paths, &w.wb);
    }

    /// One move of an adversarial scheduler; `submit` is called when it lets a request in.
    /// The choice of move depends only on `sched` and on public counts.
    fn step(
        &mut self,
        sched: &mut ChaCha8Rng,
        max_flights: usize,
        submit: &mut dyn FnMut(&mut Sim),
    ) {
        loop {
            match sched.gen_range(0..5) {
                0 if self.flights.len() < max_flights => {
                    submit(self);
                    return;
                }
                1 => {
                    let unread: Vec<usize> = (0..self.flights.len())
                        .filter(|&i| self.flights[i].fetched.is_none())
                        .collect();
                    if !unread.is_empty() {
                        let i = unread[sched.gen_range(0..unread.len())];
                        self.fetch(i);
                        return;
                    }
                }
                2 => {
                    let read: Vec<usize> = (0..self.flights.len())
                        .filter(|&i| self.flights[i].fetched.is_some())
                        .collect();
                    if !read.is_empty() {
                        let i = read[sched.gen_range(0..read.len())];
                        self.arrive(i);
                        return;
                    }
                }
                3 => match &self.writing {
                    None if !self.queue.is_empty() => {
                        self.start_write();
                        return;
                    }
                    Some(w) if !w.applied => {
                        self.apply_write();
                        return;
                    }
                    _ => {}
                },
                _ => {
                    if self.writing.as_ref().is_some_and(|w| w.applied) {
                        self.finish_write();
                        return;
                    }
                }
            }
        }
    }

    /// Lets every request arrive and everything be written back, an incomplete batch too.
    fn drain(&mut self) {
        while !self.flights.is_empty() {
            let i = 0;
            if self.flights[i].fetched.is_none() {
                self.fetch(i);
            }
            self.arrive(i);
        }
        if let Some(paths) = self.scheme.close_batch() {
            self.queue.push(paths);
        }
        if self.writing.is_some() {
            if !self.writing.as_ref().unwrap().applied {
                self.apply_write();
            }
            self.finish_write();
        }
        if !self.queue.is_empty() {
            self.start_write();
            self.apply_write();
            self.finish_write();
        }
        assert!(self.scheme.settled(), "everything written back leaves nothing held");
        assert_eq!(self.scheme.subtree_buckets(), 0);
        self.committed = self.store.clone();
        self.committed_model = self.model.clone();
    }
}

/// Workloads the tests run; the address of request `i` (of `n` blocks).
#[derive(Clone, Copy, Debug)]
enum Workload {
    /// Every request on block 0.
    Hammer,
    /// Uniformly random blocks.
    Uniform,
    /// Blocks in order, over and over.
    Scan,
    /// Two blocks, alternating: many fake reads, and blocks leave and re-enter the stash.
    PingPong,
}

const WORKLOADS: [Workload; 4] =
    [Workload::Hammer, Workload::Uniform, Workload::Scan, Workload::PingPong];

fn address(w: Workload, i: u64, n: u64, rng: &mut ChaCha8Rng) -> u64 {
    match w {
        Workload::Hammer => 0,
        Workload::Uniform => rng.gen_range(0..n),
        Workload::Scan => i % n,
        Workload::PingPong => i % 2,
    }
}

/// Runs `requests` requests of workload `w` (reads and writes mixed by the workload's own
/// generator) under a scheduler seeded with `sched_seed`, then drains.
fn run(w: Workload, config: TaoSchemeConfig, requests: u64, seed: u64, sched_seed: u64) -> Sim {
    let mut sim = Sim::new(config.clone(), seed);
    let mut sched = ChaCha8Rng::seed_from_u64(sched_seed);
    let mut data = ChaCha8Rng::seed_from_u64(seed ^ 0xda7a);
    let n = config.blocks();
    let mut issued = 0u64;
    let mut submit = |sim: &mut Sim| {
        let block = address(w, issued, n, &mut data);
        let op = if data.gen_bool(0.5) {
            let mut d = vec![0u8; BLOCK_SIZE as usize];
            data.fill(&mut d[..]);
            Op::Write(d)
        } else {
            Op::Read
        };
        sim.submit(block, op);
        issued += 1;
    };
    while sim.scheme.stats().requests < requests {
        sim.step(&mut sched, 12, &mut submit);
    }
    sim.drain();
    sim
}

#[test]
fn concurrent_requests_match_a_hashmap_model_over_a_grid() {
    for (blocks, z, k) in [(64, 4, 1), (64, 4, 5), (200, 4, 8), (200, 2, 3), (31, 3, 40)] {
        for (seed, w) in WORKLOADS.iter().enumerate() {
            let config = config(blocks, z, k);
            let mut sim = run(*w, config, 600, seed as u64, 100 + seed as u64);
            assert_eq!(sim.answers, 600, "{w:?}: every request answered once");
            assert!(sim.expected.is_empty());
            // Afterwards every block reads back as the model says, one request at a time.
            for b in 0..blocks {
                sim.submit(b, Op::Read);
                sim.drain();
            }
            let stats = sim.scheme.stats();
            assert_eq!(stats.paths_fetched, stats.requests);
            if matches!(w, Workload::Hammer | Workload::PingPong) {
                assert!(
                    stats.fake_reads > 100,
                    "{w:?}: concurrent requests of one block: {stats:?}"
                );
            }
        }
    }
}

/// p-value of a chi-square goodness-of-fit test of `counts` against equal bins.
fn uniform_p(counts: &[u64]) -> f64 {
    let total: u64 = counts.iter().sum();
    let expected = total as f64 / counts.len() as f64;
    let chi2: f64 = counts.iter().map(|&c| (c as f64 - expected).powi(2) / expected).sum();
    1.0 - ChiSquared::new((counts.len() - 1) as f64).unwrap().cdf(chi2)
}

/// p-value of a chi-square test that the rows of `table` come from one distribution.
fn homogeneity_p(table: &[Vec<u64>]) -> f64 {
    let cols = table[0].len();
    let row_sums: Vec<f64> = table.iter().map(|r| r.iter().sum::<u64>() as f64).collect();
    let total: f64 = row_sums.iter().sum();
    let mut chi2 = 0.0;
    let mut dof_cols = 0;
    for c in 0..cols {
        let col: f64 = table.iter().map(|r| r[c] as f64).sum();
        if col == 0.0 {
            continue;
        }
        dof_cols += 1;
        for (r, row) in table.iter().enumerate() {
            let e = row_sums[r] * col / total;
            chi2 += (row[c] as f64 - e).powi(2) / e;
        }
    }
    let dof = ((table.len() - 1) * (dof_cols - 1)) as f64;
    1.0 - ChiSquared::new(dof).unwrap().cdf(chi2)
}

const ALPHA: f64 = 1e-4;

/// The paths read are uniform, independent of each other and of the workload: hammering one
/// block (nearly every request a fake read), two blocks, a scan and uniform addresses give the
/// same leaf distribution; and the trace's shape — when paths are read, when write-backs
/// happen — is the same for every workload under the same scheduler.
#[test]
fn paths_read_are_uniform_and_independent_of_the_addresses() {
    let config = config(256, 4, 10);
    let leaves = config.shape().leaves() as usize;
    let requests = 6000;
    let mut table = Vec::new();
    let mut shapes = Vec::new();
    for (i, w) in WORKLOADS.iter().enumerate() {
        let sim = run(*w, config.clone(), requests, 7 + i as u64, 99);
        let reads: Vec<u64> = sim
            .trace
            .iter()
            .filter_map(|e| if let Event::Read(l) = e { Some(*l) } else { None })
            .collect();
        assert_eq!(reads.len() as u64, requests, "{w:?}: one path per request");
        let mut counts = vec![0u64; leaves];
        for &l in &reads {
            counts[l as usize] += 1;
        }
        let p = uniform_p(&counts);
        assert!(p > ALPHA, "{w:?}: leaves read are not uniform (p = {p})");
        // Consecutive paths are independent: pairs of top-3-bit prefixes are uniform.
        let shift = config.shape().height() - 3;
        let mut pairs = vec![0u64; 64];
        for pair in reads.windows(2) {
            pairs[((pair[0] >> shift) * 8 + (pair[1] >> shift)) as usize] += 1;
        }
        let p = uniform_p(&pairs);
        assert!(p > ALPHA, "{w:?}: consecutive leaves are not independent (p = {p})");
        table.push(counts);
        shapes.push(sim.trace.iter().map(Event::shape).collect::<Vec<_>>());
        if matches!(w, Workload::Hammer) {
            assert!(sim.scheme.stats().fake_reads > requests / 2);
        }
    }
    let p = homogeneity_p(&table);
    assert!(p > ALPHA, "leaf distributions differ between workloads (p = {p})");
    assert!(shapes.windows(2).all(|s| s[0] == s[1]), "the trace's shape depends on the workload");
}

/// Batches close after exactly every `k` arrivals, whatever the workload and the scheduling;
/// each write-back covers the union of its batches' paths (checked in `start_write`).
#[test]
fn write_backs_follow_the_arrival_count_alone() {
    for k in [1, 4, 10] {
        let config = config(128, 4, k);
        for (i, w) in WORKLOADS.iter().enumerate() {
            for sched in [1, 2] {
                let sim = run(*w, config.clone(), 500, i as u64, sched);
                let want: Vec<u64> = (1..=500 / k as u64).map(|j| j * k as u64).collect();
                assert_eq!(sim.closes, want, "{w:?} k {k}");
            }
        }
    }
}

/// A sweep reads the public path it is given, changes nothing a read returns, and leaves the
/// position map alone.
#[test]
fn a_sweep_reads_its_path_and_changes_nothing() {
    let config = config(64, 4, 4);
    let mut sim = run(Workload::Uniform, config.clone(), 300, 3, 4);
    let before = sim.scheme.export();
    for leaf in 0..config.shape().leaves() {
        let request = sim.scheme.start_sweep(Leaf(leaf)).unwrap();
        assert_eq!(request.leaf(), Leaf(leaf));
        sim.trace.push(Event::Read(leaf));
        sim.flights.push(Flight { request, fetched: None });
        sim.fetch(0);
        sim.arrive(0);
    }
    sim.drain();
    let after = sim.scheme.export();
    assert_eq!(before.0, after.0, "a sweep remaps nothing");
    assert!(sim.scheme.start_sweep(Leaf(config.shape().leaves())).is_err());
    for b in 0..64 {
        sim.submit(b, Op::Read);
        sim.drain();
    }
}

#[test]
fn invalid_requests_and_configs_are_refused() {
    let config = config(10, 4, 2);
    let sim = Sim::new(config.clone(), 1);
    assert!(sim.scheme.validate(BlockId(10), &Op::Read).is_err());
    assert!(sim.scheme.validate(BlockId(0), &Op::Write(vec![0; 3])).is_err());
    let tree = PathOramConfig::builder(10, BLOCK_SIZE).build().unwrap();
    assert!(TaoSchemeConfig::new(&tree, 0, 10, 10).is_err());
    assert!(TaoSchemeConfig::new(&tree, 1, 0, 10).is_err());
    let recursive = PathOramConfig::builder(1000, BLOCK_SIZE)
        .posmap(blindfold_oram::PosMapMode::Recursive { max_in_memory_entries: 10 })
        .build()
        .unwrap();
    assert!(TaoSchemeConfig::new(&recursive, 1, 10, 10).is_err());
    let bad_posmap = TaoScheme::new(
        config,
        vec![0; 3],
        Vec::new(),
        TaoStats::default(),
        ChaCha20Rng::seed_from_u64(0),
    );
    assert!(bad_posmap.is_err());
}

/// After a crash, the requests whose reveals were logged are replayed over the store as last
/// committed: the replay reads exactly the logged paths, in order, and nothing else; every
/// block named moves to its last logged new leaf (the next request of it reads that leaf, which
/// the store never saw), and every block reads back as committed.
#[test]
fn a_replay_reads_only_logged_paths_and_keeps_the_committed_state() {
    let config = config(128, 4, 8);
    for seed in 0..4 {
        let mut sim = run(Workload::Uniform, config.clone(), 400, seed, seed + 50);
        let (posmap, stash) = sim.scheme.export();
        let stats = sim.scheme.stats().clone();
        // Requests logged before the crash, a third of them of one block (fake reads); some
        // arrive, none is written back.
        let mut sched = ChaCha8Rng::seed_from_u64(seed);
        let first = sim.reveals.len();
        for i in 0..40u64 {
            let block = if i % 3 == 0 { 5 } else { sched.gen_range(0..config.blocks()) };
            sim.submit(block, Op::Write(vec![0xee; BLOCK_SIZE as usize]));
            if sched.gen_bool(0.3) {
                let i = sched.gen_range(0..sim.flights.len());
                sim.fetch(i);
                sim.arrive(i);
            }
        }
        let reveals = sim.reveals[first..].to_vec();

        // A fresh engine from the committed state, over the committed store.
        let mut after = Sim::new(config.clone(), seed + 1000);
        after.scheme = TaoScheme::new(
            config.clone(),
            posmap,
            stash,
            stats,
            ChaCha20Rng::seed_from_u64(seed + 2000),
        )
        .unwrap();
        after.store = std::mem::take(&mut sim.committed);
        after.model = std::mem::take(&mut sim.committed_model);
        after.scheme.replay_check(&reveals).unwrap();
        let mut read = Vec::new();
        for r in &reveals {
            let buckets = after.scheme.replay_read(r);
            read.push(buckets.last().map(|b| b.0));
            let opened = after
                .scheme
                .to_open(&buckets)
                .into_iter()
                .map(|i| {
                    let blocks = match after.store.get(&buckets[i].0) {
                        Some(plain) => config.decode_bucket(plain).unwrap(),
                        None => Vec::new(),
                    };
                    (buckets[i], blocks)
                })
                .collect();
            after.scheme.replay_arrive(opened);
        }
        let want: Vec<Option<u64>> = reveals
            .iter()
            .map(|r| config.path(Leaf(u64::from(r.read))).last().map(|b| b.0))
            .collect();
        assert_eq!(read, want, "the replay reads the logged paths, in order");
        after.scheme.replay_settle(&reveals).unwrap();
        after.drain();
        // Each named block is on its last logged new leaf.
        let mut last = HashMap::new();
        for r in &reveals {
            last.insert(r.block, r.new);
        }
        for (&block, &leaf) in &last {
            after.submit(block, Op::Read);
            assert_eq!(after.flights[0].request.leaf(), Leaf(u64::from(leaf)), "block {block}");
            after.drain();
        }
        for b in 0..config.blocks() {
            after.submit(b, Op::Read);
            after.drain();
        }
        assert!(after.scheme.replay_check(&reveals).is_ok());
    }
}

/// A bucket encoded after a prefix (the room a sealer wants before the plaintext) is the
/// prefix and the same bytes as encoded alone, and decodes to its blocks: full, partly full
/// and empty buckets.
#[test]
fn a_bucket_encoded_after_a_prefix_is_the_same_bucket() {
    let tree = PathOramConfig::builder(64, 16).build().unwrap();
    let config = TaoSchemeConfig::new(&tree, 4, 100, 100).unwrap();
    for n in [0usize, 1, 3, 4] {
        let blocks: Vec<(u64, u32, Vec<u8>)> =
            (0..n as u64).map(|i| (i * 7, i as u32 + 1, vec![i as u8 + 1; 16])).collect();
        let iter = || blocks.iter().map(|(id, leaf, d)| (*id, *leaf, &d[..]));
        let alone = config.encode_bucket(iter());
        let mut prefixed = vec![0xab; 16];
        config.encode_bucket_into(iter(), &mut prefixed);
        assert_eq!(&prefixed[..16], &[0xab; 16], "{n} blocks: the prefix is kept");
        assert_eq!(&prefixed[16..], &alone[..], "{n} blocks");
        let decoded = config.decode_bucket(&alone).unwrap();
        let got: Vec<(u64, u32, Vec<u8>)> =
            decoded.into_iter().map(|b| (b.id, b.leaf, b.data.to_vec())).collect();
        assert_eq!(got, blocks, "{n} blocks");
    }
}
