//! The floor: the best time per logical operation this machine allows a scheme, measured in
//! the same run as the benchmark it sits beside (`blindfold bench floor`, and a `floor`
//! section in the output and JSON of `bench path`, `gateway`, `concurrency` and
//! `oblivistore`).
//!
//! Two halves. [`measure`] reads the machine's own limits for the cell size in use: sealing
//! and opening a cell with the project's [`CellSealer`] on one core, copying memory, the raw
//! store's write and read throughput and its one-cell round trip (the store URL under test,
//! without any emulated link), and the emulated link as configured (it is exact by
//! construction, so it is taken from the options rather than measured). [`Floor::of`] then
//! turns what a scheme must do per logical operation ([`PerOp`]: bytes sealed, opened, copied
//! and moved, round trips it waits for one after the other, operations in flight) into the
//! least time per operation. The model, term by term (docs/benchmarks.md, "The floor"):
//!
//! * **cpu** = (sealed / seal rate + opened / open rate + in-process store time, or for a
//!   store in another process the copies through its socket: (up + down) / copy rate) /
//!   cores. Every term is work on the same cores, so they add; they are spread perfectly over
//!   the cores the benchmark gives the engine (one for `bench path`). Sealing writes straight
//!   into the cell and an in-process store's own copies are inside its measured rates, so no
//!   other copy is charged.
//! * **store** = bytes up / store write rate + bytes down / store read rate, for a store in
//!   another process (MinIO, Redis, a storage server): it works beside the engine's cores, so
//!   this term overlaps the others. For `memory:` and `file://` it is part of **cpu**.
//! * **link** = max(bytes up / up bandwidth, bytes down / down bandwidth): the emulated link's
//!   two directions are independent, and it carries requests of many operations at once.
//! * **latency** = round trips × (link round trip + store round trip) / operations in flight:
//!   the round trips an operation must wait for one after another, overlapped across the
//!   operations in flight at once.
//!
//! The floor is the largest of the four (resources that work side by side overlap
//! perfectly), so it is a bound no engine moving those bytes can beat on this machine, not a
//! prediction. What it leaves out on purpose (trusted-state updates, the redo log, HTTP, the
//! scheme's own logic) is what the gap between a measured figure and its floor is made of.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use blindfold_crypto::{CellAd, CellSealer, MasterKey, StoreId};
use blindfold_store::{open_store, remove_array, CellId, Counts, Geometry, LinkConfig, StoreUrl};
use serde::Serialize;

/// Cells written or read per store request while measuring the store.
const STORE_BATCH: u64 = 16;
/// Store requests in flight at once while measuring its throughput.
const STORE_IN_FLIGHT: u64 = 4;
/// Cells of the scratch array the store measurement uses, at the least.
const STORE_CELLS: u64 = STORE_BATCH * STORE_IN_FLIGHT;
/// The largest scratch array an in-process store is measured over: past the last-level cache
/// of the machines we run on, so that the rates are those of cells no cache holds.
const SPREAD_MAX_BYTES: u64 = 1 << 30;
/// Random root-to-leaf paths prepared for the tree measurement (reused round after round).
const SPREAD_BATCHES: usize = 256;
/// Bytes of each buffer the copy measurement moves cells between.
const COPY_ARENA: usize = 8 << 20;

/// What to measure.
#[derive(Clone, Debug)]
pub struct FloorParams {
    /// Bytes of one sealed cell as the store holds it (the plaintext is
    /// [`CellSealer::OVERHEAD`] bytes shorter).
    pub cell_size: u32,
    /// The store under test (`None`: do not measure a store).
    pub store: Option<StoreUrl>,
    /// The emulated link in front of the store, if any.
    pub link: Option<LinkConfig>,
    /// Time given to each of the measurements (seal, open, copy, store write, store read,
    /// store round trip).
    pub each: Duration,
    /// Cells of the tree the benchmark's engine keeps in the store (0: unknown). An
    /// in-process store is then measured over a scratch tree as large (at most 1 GiB), one
    /// random root-to-leaf path per request, as a tree ORAM reads and writes: the deep levels
    /// of a large tree are in no cache, and 64 cells side by side would all be measured in
    /// it. A smaller scratch tree than the engine's keeps the floor a bound: it has fewer of
    /// the levels no cache holds.
    pub array_cells: u64,
}

impl FloorParams {
    /// Measures `cell_size`-byte cells for about a second in all, without a store or a link.
    pub fn new(cell_size: u32) -> Self {
        Self {
            cell_size,
            store: None,
            link: None,
            each: Duration::from_millis(150),
            array_cells: 0,
        }
    }

    /// The same, with the store the benchmark uses.
    pub fn with_store(mut self, store: &StoreUrl) -> Self {
        self.store = Some(store.clone());
        self
    }

    /// The same, with the emulated link the benchmark uses.
    pub fn with_link(mut self, link: Option<LinkConfig>) -> Self {
        self.link = link;
        self
    }

    /// The same, for an engine whose tree holds `cells` cells (see
    /// [`FloorParams::array_cells`]).
    pub fn with_array(mut self, cells: u64) -> Self {
        self.array_cells = cells;
        self
    }
}

/// The cell of a Path ORAM bucket (default Z) of `block_size`-byte blocks, as `bench path`
/// stores it: `bench floor`'s default cell size.
pub fn path_oram_cell_size(block_size: u32) -> Result<u32> {
    let config = blindfold_oram::PathOramConfig::builder(1 << 16, block_size).build()?;
    Ok(blindfold_proxy::SealedPathOram::geometry(&config)?.cell_size())
}

/// This machine's limits, measured in this process.
#[derive(Clone, Debug, Serialize)]
pub struct Limits {
    /// Bytes of one sealed cell.
    pub cell_size: u32,
    /// Cores this process may use.
    pub cores: usize,
    /// Plaintext bytes sealed per second on one core (`CellSealer::seal_into`, AES-256-GCM).
    pub seal_bytes_per_sec: f64,
    /// Plaintext bytes opened per second on one core (`CellSealer::open_in_place`).
    pub open_bytes_per_sec: f64,
    /// Bytes copied per second on one core, one cell at a time between two 8 MiB buffers.
    pub copy_bytes_per_sec: f64,
    /// The raw store (no emulated link), if one was measured.
    pub store: Option<StoreLimits>,
    /// The emulated link, if any.
    pub link: Option<LinkLimits>,
    /// Seconds the measurements took.
    pub measure_seconds: f64,
}

/// The raw store's limits at the cell size in use.
#[derive(Clone, Debug, Serialize)]
pub struct StoreLimits {
    /// The store URL.
    pub url: String,
    /// `true` for stores served by this process's own cores (`memory:`, `file://`).
    pub in_process: bool,
    /// Bytes written per second, 16 cells per request, 4 requests in flight.
    pub write_bytes_per_sec: f64,
    /// Bytes read per second, likewise.
    pub read_bytes_per_sec: f64,
    /// Median time of a one-cell read, microseconds.
    pub round_trip_us: f64,
    /// Cells of the scratch array measured over (a tree, read and written one random
    /// root-to-leaf path per request, when larger than 64).
    pub scratch_cells: u64,
}

/// The emulated link, as configured.
#[derive(Clone, Debug, Serialize)]
pub struct LinkLimits {
    /// Round trip, milliseconds.
    pub rtt_ms: f64,
    /// Bandwidth towards the store, bits per second (`None`: unlimited).
    pub up_bits_per_sec: Option<u64>,
    /// Bandwidth from the store, bits per second (`None`: unlimited).
    pub down_bits_per_sec: Option<u64>,
}

impl From<LinkConfig> for LinkLimits {
    fn from(l: LinkConfig) -> Self {
        Self {
            rtt_ms: l.rtt.as_secs_f64() * 1e3,
            up_bits_per_sec: l.up_bits_per_sec,
            down_bits_per_sec: l.down_bits_per_sec,
        }
    }
}

/// What a scheme must do per logical operation, from the counts the benchmark already takes.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PerOp {
    /// Plaintext bytes sealed.
    pub sealed_bytes: f64,
    /// Plaintext bytes opened.
    pub opened_bytes: f64,
    /// Bytes copied on their way to or from a store in another process (through a socket;
    /// for an in-process store its own copies are inside its measured rates, and sealing
    /// writes straight into the cell, so the model charges no copy there).
    pub copied_bytes: f64,
    /// Bytes sent to the store.
    pub bytes_up: f64,
    /// Bytes received from the store.
    pub bytes_down: f64,
    /// Store round trips the operation waits for one after another.
    pub round_trips: f64,
    /// Operations in flight at once (clients, or 1 for one access at a time).
    pub in_flight: f64,
    /// Cores the benchmark gives the engine.
    pub cores: usize,
}

impl PerOp {
    /// Per-operation work from a [`CountingStore`](blindfold_store::CountingStore)'s totals
    /// over `ops` operations: every byte sent was sealed and every byte received opened (the
    /// seal overhead is a few dozen bytes a cell, left in), and each crossed the engine's
    /// buffers once (bucket encoding and decoding). `round_trips` is how many of the store
    /// calls an operation waits for in sequence: the measured calls per operation for an
    /// engine serving one access at a time, or the least the scheme allows when operations
    /// overlap.
    pub fn from_counts(
        c: &Counts,
        ops: u64,
        round_trips: RoundTrips,
        in_flight: usize,
        cores: usize,
    ) -> Self {
        let ops = ops.max(1) as f64;
        let (up, down) = (c.bytes_up() as f64 / ops, c.bytes_down() as f64 / ops);
        // A flush is not a round trip: the stores a link stands for have nothing to flush
        // (the emulated link charges it nothing either), and an in-process store's is local.
        let calls = c.round_trips.saturating_sub(c.flushes) as f64;
        Self::from_bytes(up, down, round_trips.per_op(calls / ops), in_flight, cores)
    }

    /// As [`from_counts`](Self::from_counts), from bytes per operation.
    pub fn from_bytes(
        bytes_up: f64,
        bytes_down: f64,
        round_trips: f64,
        in_flight: usize,
        cores: usize,
    ) -> Self {
        Self {
            sealed_bytes: bytes_up,
            opened_bytes: bytes_down,
            copied_bytes: bytes_up + bytes_down,
            bytes_up,
            bytes_down,
            round_trips,
            in_flight: in_flight.max(1) as f64,
            cores: cores.max(1),
        }
    }
}

/// The `floor` section of a benchmark's report: the limits measured in its run, and the
/// floor of the engine (and of its baseline, where it has one) under them.
#[derive(Clone, Debug, Serialize)]
pub struct FloorReport {
    /// This machine's limits, measured in the benchmark's run.
    pub limits: Limits,
    /// The engine's floor and the share of it reached.
    pub engine: Floor,
    /// The baseline's, when the benchmark has one.
    pub baseline: Option<Floor>,
}

impl FloorReport {
    /// Lines for a benchmark's table (two-space indent, key column `width` wide).
    pub fn render(&self, width: usize) -> String {
        let mut s = format!("  {:<width$} {}\n", "engine vs floor", self.engine.summary());
        if let Some(b) = &self.baseline {
            s.push_str(&format!("  {:<width$} {}\n", "baseline vs floor", b.summary()));
        }
        let l = &self.limits;
        s.push_str(&format!(
            "  {:<width$} seal {:.2} / open {:.2} / copy {:.2} GB/s per core at {} B cells{}\n",
            "floor: this machine",
            l.seal_bytes_per_sec / 1e9,
            l.open_bytes_per_sec / 1e9,
            l.copy_bytes_per_sec / 1e9,
            l.cell_size,
            store_summary(l).map_or(String::new(), |st| format!("; {st}")),
        ));
        s
    }
}

/// How many round trips one operation waits for in sequence.
#[derive(Clone, Copy, Debug)]
pub enum RoundTrips {
    /// Every store call counted (an engine serving one access at a time).
    Measured,
    /// A fixed least number (an engine with operations in flight together, whose calls
    /// overlap; e.g. 1: an answer needs at least one read from the store).
    AtLeast(f64),
}

impl RoundTrips {
    fn per_op(self, measured: f64) -> f64 {
        match self {
            RoundTrips::Measured => measured,
            RoundTrips::AtLeast(n) => n,
        }
    }
}

/// The floor of one operation, term by term (seconds per operation).
#[derive(Clone, Debug, Serialize)]
pub struct Floor {
    /// What was assumed per operation.
    pub per_op: PerOp,
    /// Sealing, opening, copying (and an in-process store) over the cores.
    pub cpu_seconds: f64,
    /// A store in another process (0 for an in-process one or none measured).
    pub store_seconds: f64,
    /// The emulated link's bandwidth (0 when unlimited or absent).
    pub link_seconds: f64,
    /// Round trips over operations in flight.
    pub latency_seconds: f64,
    /// The largest term: the least time per operation.
    pub seconds_per_op: f64,
    /// `1 / seconds_per_op`.
    pub ops_per_sec: f64,
    /// Which term sets it: `cpu`, `store`, `link` or `latency`.
    pub bound: &'static str,
    /// The benchmark's measured operations per second.
    pub measured_ops_per_sec: f64,
    /// `measured_ops_per_sec / ops_per_sec`: the share of the floor the engine reached.
    pub of_floor: f64,
}

impl Floor {
    /// The floor of `op` under `limits`, beside the `measured` rate.
    pub fn of(limits: &Limits, op: &PerOp, measured_ops_per_sec: f64) -> Self {
        let rate = |bytes: f64, per_sec: f64| if bytes > 0.0 { bytes / per_sec } else { 0.0 };
        let mut cpu = rate(op.sealed_bytes, limits.seal_bytes_per_sec)
            + rate(op.opened_bytes, limits.open_bytes_per_sec);
        let mut store = 0.0;
        let mut store_rt = 0.0;
        match &limits.store {
            Some(s) if s.in_process => {
                // The store's own copies are inside its measured rates.
                cpu += rate(op.bytes_up, s.write_bytes_per_sec)
                    + rate(op.bytes_down, s.read_bytes_per_sec);
                store_rt = s.round_trip_us / 1e6;
            }
            other => {
                // Bytes for a store in another process cross a socket: one copy each.
                cpu += rate(op.copied_bytes, limits.copy_bytes_per_sec);
                if let Some(s) = other {
                    store = rate(op.bytes_up, s.write_bytes_per_sec)
                        + rate(op.bytes_down, s.read_bytes_per_sec);
                    store_rt = s.round_trip_us / 1e6;
                }
            }
        }
        cpu /= op.cores.max(1) as f64;
        let (link, rtt) = match &limits.link {
            Some(l) => {
                let dir = |bytes: f64, bits: Option<u64>| match bits {
                    Some(b) if b > 0 => bytes * 8.0 / b as f64,
                    _ => 0.0,
                };
                (
                    dir(op.bytes_up, l.up_bits_per_sec)
                        .max(dir(op.bytes_down, l.down_bits_per_sec)),
                    l.rtt_ms / 1e3,
                )
            }
            None => (0.0, 0.0),
        };
        let latency = op.round_trips * (rtt + store_rt) / op.in_flight.max(1.0);
        let terms = [("cpu", cpu), ("store", store), ("link", link), ("latency", latency)];
        let (bound, seconds_per_op) =
            terms.into_iter().fold(("cpu", 0.0), |best, t| if t.1 > best.1 { t } else { best });
        let ops_per_sec = if seconds_per_op > 0.0 { 1.0 / seconds_per_op } else { f64::INFINITY };
        Self {
            per_op: op.clone(),
            cpu_seconds: cpu,
            store_seconds: store,
            link_seconds: link,
            latency_seconds: latency,
            seconds_per_op,
            ops_per_sec,
            bound,
            measured_ops_per_sec,
            of_floor: if ops_per_sec.is_finite() {
                measured_ops_per_sec / ops_per_sec
            } else {
                0.0
            },
        }
    }

    /// One line: the floor, what sets it, and the share reached.
    pub fn summary(&self) -> String {
        format!(
            "{:.1} % of a floor of {} ops/s (bound: {}; cpu {}, store {}, link {}, latency {} per op)",
            self.of_floor * 100.0,
            fmt_rate(self.ops_per_sec),
            self.bound,
            fmt_secs(self.cpu_seconds),
            fmt_secs(self.store_seconds),
            fmt_secs(self.link_seconds),
            fmt_secs(self.latency_seconds),
        )
    }
}

fn fmt_rate(r: f64) -> String {
    if r >= 100.0 {
        format!("{r:.0}")
    } else {
        format!("{r:.1}")
    }
}

/// A duration in seconds, in the unit that reads best.
fn fmt_secs(s: f64) -> String {
    if s == 0.0 {
        "0".into()
    } else if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

/// Runs `f` repeatedly for about `budget` (at least `min` times); calls per second.
/// The best of four slices, so that a moment of contention on a shared machine does not lower
/// a limit.
fn rate_of(budget: Duration, min: u64, mut f: impl FnMut()) -> f64 {
    let mut best = 0.0f64;
    for _ in 0..4 {
        let start = Instant::now();
        let mut n = 0u64;
        while n < min || start.elapsed() < budget / 4 {
            for _ in 0..8 {
                f();
            }
            n += 8;
        }
        best = best.max(n as f64 / start.elapsed().as_secs_f64());
    }
    best
}

/// Sealing and opening `cell_size`-byte cells on this core: plaintext bytes per second each.
fn crypto_rates(cell_size: u32, each: Duration) -> Result<(f64, f64)> {
    let plain_len = (cell_size as usize).saturating_sub(CellSealer::OVERHEAD).max(1);
    let sealer = CellSealer::new(&MasterKey::generate(), StoreId::random(), 0);
    let ad = CellAd { cell: 1, version: 1, segment: 0 };
    let plain = vec![0x5au8; plain_len];
    let mut buf = vec![0u8; plain_len + CellSealer::OVERHEAD];
    let mut failed = None;
    let seals = rate_of(each, 16, || {
        if let Err(e) = sealer.seal_into(&ad, std::hint::black_box(&plain), &mut buf) {
            failed = Some(e);
        }
    });
    // Opening decrypts in place, so each round seals afresh: time seal + open, then take the
    // seal away.
    let pairs = rate_of(each, 16, || {
        let r = sealer
            .seal_into(&ad, &plain, &mut buf)
            .and_then(|()| sealer.open_in_place(&ad, &mut buf).map(|p| p.len()));
        match r {
            Ok(n) => {
                std::hint::black_box(n);
            }
            Err(e) => failed = Some(e),
        }
    });
    if let Some(e) = failed {
        return Err(e).context("measuring the cell sealer");
    }
    let open_secs = (1.0 / pairs - 1.0 / seals).max(0.5 / seals);
    Ok((plain_len as f64 * seals, plain_len as f64 / open_secs))
}

/// Copying `cell_size`-byte chunks between two buffers larger than the caches: bytes/s.
fn copy_rate(cell_size: u32, each: Duration) -> f64 {
    let chunk = (cell_size as usize).clamp(64, COPY_ARENA);
    let src = vec![0xa5u8; COPY_ARENA];
    let mut dst = vec![0u8; COPY_ARENA];
    let chunks = COPY_ARENA / chunk;
    let mut i = 0usize;
    let per_sec = rate_of(each, 16, || {
        let at = (i % chunks) * chunk;
        dst[at..at + chunk].copy_from_slice(std::hint::black_box(&src[at..at + chunk]));
        i += 1;
    });
    std::hint::black_box(&dst);
    per_sec * chunk as f64
}

/// Whether `url`'s store works on this process's cores.
fn in_process(url: &StoreUrl) -> bool {
    matches!(url, StoreUrl::Memory | StoreUrl::File { .. })
}

/// Cells of the scratch array `url`'s store is measured over. An in-process store is measured
/// over as many cells as the engine's array (at most 1 GiB): its copies then come from memory,
/// not from the cache, as the engine's do. A store in another process keeps the small array
/// (its cache is its own business, and filling GiBs over a socket would take the benchmark's
/// time).
fn scratch_cells(url: &StoreUrl, cell_size: u32, array_cells: u64) -> u64 {
    let cells = array_cells.min(SPREAD_MAX_BYTES / u64::from(cell_size).max(1));
    if in_process(url) && cells > STORE_CELLS {
        cells
    } else {
        STORE_CELLS
    }
}

/// `n` random root-to-leaf paths of a binary tree of `cells` cells in heap order (cell i's
/// children are 2i+1 and 2i+2), as the tree engines lay theirs out, each from the root down. A
/// leaf is a cell without children: the last level, and the end of the one above when the
/// last is not full.
fn tree_paths(cells: u64, n: usize, seed: u64) -> Vec<Vec<CellId>> {
    use rand::{Rng, SeedableRng};
    let first_leaf = cells / 2;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let mut at = rng.gen_range(first_leaf..cells);
            let mut path = vec![CellId(at)];
            while at > 0 {
                at = (at - 1) / 2;
                path.push(CellId(at));
            }
            path.reverse();
            path
        })
        .collect()
}

/// The raw store's write and read throughput and one-cell round trip at `cell_size`.
async fn store_limits(
    url: &StoreUrl,
    cell_size: u32,
    each: Duration,
    array_cells: u64,
) -> Result<StoreLimits> {
    let cells = scratch_cells(url, cell_size, array_cells);
    let geometry = Geometry::new(cells, cell_size)?;
    let store = open_store(url, "bench-floor", geometry)
        .await
        .with_context(|| format!("opening store {url} (bench-floor)"))?;
    let cell = vec![0x3cu8; cell_size as usize];
    let batches: Vec<Vec<CellId>> = if cells == STORE_CELLS {
        (0..STORE_IN_FLIGHT)
            .map(|b| (0..STORE_BATCH).map(|i| CellId(b * STORE_BATCH + i)).collect())
            .collect()
    } else {
        // Every cell written once first (untimed): the engine's array exists in full.
        for group in (0..cells).step_by(STORE_CELLS as usize) {
            let writes = (group..(group + STORE_CELLS).min(cells)).step_by(STORE_BATCH as usize);
            let writes = writes.map(|first| {
                let store = Arc::clone(&store);
                let batch: Vec<(CellId, Vec<u8>)> = (first..(first + STORE_BATCH).min(cells))
                    .map(|c| (CellId(c), cell.clone()))
                    .collect();
                async move { store.write(batch).await }
            });
            for r in futures::future::join_all(writes).await {
                r.context("floor: filling the scratch array")?;
            }
        }
        tree_paths(cells, SPREAD_BATCHES, cells)
    };
    let in_flight = STORE_IN_FLIGHT as usize;
    let mut next = 0usize;
    let mut take = || {
        let group: Vec<&Vec<CellId>> =
            (0..in_flight).map(|i| &batches[(next + i) % batches.len()]).collect();
        next = (next + in_flight) % batches.len();
        group
    };

    // Writes hand the store cells already built (an engine seals straight into them), so only
    // the calls are timed.
    let mut written = 0u64;
    let mut rounds = 0u64;
    let mut writing = Duration::ZERO;
    let start = Instant::now();
    while rounds < 2 || start.elapsed() < each {
        let built: Vec<Vec<(CellId, Vec<u8>)>> = take()
            .into_iter()
            .map(|ids| ids.iter().map(|&c| (c, cell.clone())).collect())
            .collect();
        written += built.iter().map(|b| b.len() as u64).sum::<u64>();
        let t = Instant::now();
        let writes = built.into_iter().map(|cells| {
            let store = Arc::clone(&store);
            async move { store.write(cells).await }
        });
        for r in futures::future::join_all(writes).await {
            r.context("floor: writing to the store")?;
        }
        writing += t.elapsed();
        rounds += 1;
    }
    let t = Instant::now();
    store.flush().await.context("floor: flushing the store")?;
    writing += t.elapsed();
    let write_bytes_per_sec = (written * u64::from(cell_size)) as f64 / writing.as_secs_f64();

    let mut read = 0u64;
    let mut rounds = 0u64;
    let start = Instant::now();
    while rounds < 2 || start.elapsed() < each {
        let group = take();
        read += group.iter().map(|ids| ids.len() as u64).sum::<u64>();
        let reads = group.into_iter().map(|ids| store.read(ids));
        for r in futures::future::join_all(reads).await {
            std::hint::black_box(r.context("floor: reading from the store")?);
        }
        rounds += 1;
    }
    let read_bytes_per_sec = (read * u64::from(cell_size)) as f64 / start.elapsed().as_secs_f64();

    // One cell at a time, in the order the requests above named them (every level of the
    // tree in proportion, not only its root).
    let one_by_one: Vec<CellId> = batches.iter().flatten().copied().collect();
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 5 || (start.elapsed() < each && times.len() < 10_000) {
        let cell = one_by_one[times.len() % one_by_one.len()];
        let t = Instant::now();
        store.read(&[cell]).await?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    drop(store);
    remove_array(url, "bench-floor").await.context("floor: removing the scratch array")?;
    Ok(StoreLimits {
        url: url.to_string(),
        in_process: in_process(url),
        write_bytes_per_sec,
        read_bytes_per_sec,
        round_trip_us: times[times.len() / 2],
        scratch_cells: cells,
    })
}

/// Measures this machine's limits (about six times `p.each`).
pub async fn measure(p: &FloorParams) -> Result<Limits> {
    anyhow::ensure!(p.cell_size > 0, "the cell size must be at least one byte");
    let start = Instant::now();
    let (seal_bytes_per_sec, open_bytes_per_sec) = crypto_rates(p.cell_size, p.each)?;
    let copy_bytes_per_sec = copy_rate(p.cell_size, p.each);
    let store = match &p.store {
        Some(url) => Some(store_limits(url, p.cell_size, p.each, p.array_cells).await?),
        None => None,
    };
    Ok(Limits {
        cell_size: p.cell_size,
        cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        seal_bytes_per_sec,
        open_bytes_per_sec,
        copy_bytes_per_sec,
        store,
        link: p.link.map(LinkLimits::from),
        measure_seconds: start.elapsed().as_secs_f64(),
    })
}

/// Where the store's rates were measured: a small array, or root-to-leaf paths of a tree.
fn scratch(st: &StoreLimits, cell_size: u32) -> String {
    if st.scratch_cells <= STORE_CELLS {
        format!("{} cells side by side", st.scratch_cells)
    } else {
        format!(
            "root-to-leaf paths of a {:.0} MiB tree",
            (st.scratch_cells * u64::from(cell_size)) as f64 / f64::from(1u32 << 20)
        )
    }
}

/// The measured store in a few words (rates, where, round trip), if one was measured.
pub fn store_summary(l: &Limits) -> Option<String> {
    l.store.as_ref().map(|st| {
        format!(
            "store {:.2} / {:.2} GB/s write / read ({}), {} round trip",
            st.write_bytes_per_sec / 1e9,
            st.read_bytes_per_sec / 1e9,
            scratch(st, l.cell_size),
            fmt_secs(st.round_trip_us / 1e6)
        )
    })
}

/// The limits as a table (`blindfold bench floor`).
pub fn render(l: &Limits) -> String {
    let gb = |b: f64| format!("{:.2} GB/s", b / 1e9);
    let mut s = String::new();
    let mut line = |k: &str, v: String| s.push_str(&format!("  {k:<34} {v}\n"));
    line("cell size", format!("{} B", l.cell_size));
    line("cores", l.cores.to_string());
    line("seal (AES-256-GCM), one core", gb(l.seal_bytes_per_sec));
    line("open (AES-256-GCM), one core", gb(l.open_bytes_per_sec));
    line("memory copy, one core", gb(l.copy_bytes_per_sec));
    let cell = f64::from(l.cell_size);
    line(
        "one cell sealed + opened",
        fmt_secs(cell / l.seal_bytes_per_sec + cell / l.open_bytes_per_sec),
    );
    match &l.store {
        Some(st) => {
            line(
                "store",
                format!(
                    "{}{}",
                    st.url,
                    if st.in_process { " (on this process's cores)" } else { "" }
                ),
            );
            line(
                "store write / read",
                format!(
                    "{} / {} ({})",
                    gb(st.write_bytes_per_sec),
                    gb(st.read_bytes_per_sec),
                    scratch(st, l.cell_size)
                ),
            );
            line("store one-cell round trip (p50)", fmt_secs(st.round_trip_us / 1e6));
        }
        None => line("store", "not measured".into()),
    }
    match &l.link {
        Some(k) => {
            let bw = |b: Option<u64>| {
                b.map_or("unlimited".to_string(), |b| format!("{:.1} Mbit/s", b as f64 / 1e6))
            };
            line(
                "emulated link",
                format!(
                    "{} ms round trip, {} up, {} down",
                    k.rtt_ms,
                    bw(k.up_bits_per_sec),
                    bw(k.down_bits_per_sec)
                ),
            );
        }
        None => line("emulated link", "none".into()),
    }
    line("measured in", format!("{:.1} s", l.measure_seconds));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            cell_size: 1000,
            cores: 2,
            seal_bytes_per_sec: 1e9,
            open_bytes_per_sec: 2e9,
            copy_bytes_per_sec: 4e9,
            store: None,
            link: None,
            measure_seconds: 0.0,
        }
    }

    fn op(up: f64, down: f64, round_trips: f64, in_flight: usize, cores: usize) -> PerOp {
        PerOp::from_bytes(up, down, round_trips, in_flight, cores)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 + 1e-9 * b.abs()
    }

    #[test]
    fn cpu_terms_add_and_spread_over_the_cores() {
        // 1 MB sealed (1 ms), 2 MB opened (1 ms), 3 MB copied (0.75 ms): 2.75 ms on one core.
        let f = Floor::of(&limits(), &op(1e6, 2e6, 0.0, 1, 1), 100.0);
        assert!(close(f.cpu_seconds, 2.75e-3), "{}", f.cpu_seconds);
        assert_eq!(f.bound, "cpu");
        assert!(close(f.ops_per_sec, 1.0 / 2.75e-3));
        assert!(close(f.of_floor, 100.0 * 2.75e-3));
        let two = Floor::of(&limits(), &op(1e6, 2e6, 0.0, 1, 2), 100.0);
        assert!(close(two.cpu_seconds, 2.75e-3 / 2.0), "{}", two.cpu_seconds);
    }

    #[test]
    fn an_in_process_store_adds_to_the_cpu_and_a_remote_one_overlaps() {
        let store = |in_process| StoreLimits {
            url: "x".into(),
            in_process,
            write_bytes_per_sec: 1e8,
            read_bytes_per_sec: 2e8,
            round_trip_us: 100.0,
            scratch_cells: 64,
        };
        let mut l = limits();
        l.store = Some(store(true));
        // Store: 1 MB up at 100 MB/s (10 ms) + 2 MB down at 200 MB/s (10 ms) = 20 ms, on the
        // same core as the 2 ms of crypto; its copies are inside its rates, so none is added.
        let f = Floor::of(&l, &op(1e6, 2e6, 0.0, 1, 1), 1.0);
        assert!(close(f.cpu_seconds, 22e-3), "{}", f.cpu_seconds);
        assert_eq!(f.store_seconds, 0.0);
        // In another process: 2 ms of crypto + 0.75 ms of copies through its socket.
        l.store = Some(store(false));
        let f = Floor::of(&l, &op(1e6, 2e6, 0.0, 1, 1), 1.0);
        assert!(close(f.cpu_seconds, 2.75e-3));
        assert!(close(f.store_seconds, 20e-3));
        assert_eq!(f.bound, "store");
        assert!(close(f.seconds_per_op, 20e-3));
    }

    #[test]
    fn round_trips_wait_in_sequence_but_overlap_across_operations() {
        let mut l = limits();
        l.link = Some(LinkLimits { rtt_ms: 50.0, up_bits_per_sec: None, down_bits_per_sec: None });
        l.store = Some(StoreLimits {
            url: "memory:".into(),
            in_process: true,
            write_bytes_per_sec: 1e12,
            read_bytes_per_sec: 1e12,
            round_trip_us: 1000.0,
            scratch_cells: 64,
        });
        // Two round trips of 50 ms + 1 ms each, one operation at a time: 102 ms.
        let f = Floor::of(&l, &op(1e3, 1e3, 2.0, 1, 1), 5.0);
        assert!(close(f.latency_seconds, 0.102), "{}", f.latency_seconds);
        assert_eq!(f.bound, "latency");
        // Thirty in flight share the wait.
        let f = Floor::of(&l, &op(1e3, 1e3, 2.0, 30, 1), 5.0);
        assert!(close(f.latency_seconds, 0.102 / 30.0));
    }

    #[test]
    fn the_link_directions_are_separate() {
        let mut l = limits();
        l.link = Some(LinkLimits {
            rtt_ms: 0.0,
            up_bits_per_sec: Some(8_000_000),
            down_bits_per_sec: Some(16_000_000),
        });
        // 1 MB up at 1 MB/s: 1 s; 1 MB down at 2 MB/s: 0.5 s; the link needs the larger.
        let f = Floor::of(&l, &op(1e6, 1e6, 1.0, 100, 2), 0.5);
        assert!(close(f.link_seconds, 1.0), "{}", f.link_seconds);
        assert_eq!(f.bound, "link");
        assert!(close(f.of_floor, 0.5));
    }

    #[test]
    fn counts_become_bytes_and_round_trips_per_operation() {
        let c =
            Counts { bytes_written: 4000, bytes_read: 6000, round_trips: 20, ..Counts::default() };
        let p = PerOp::from_counts(&c, 10, RoundTrips::Measured, 1, 1);
        assert_eq!(p, op(400.0, 600.0, 2.0, 1, 1));
        assert_eq!(p.copied_bytes, 1000.0);
        let p = PerOp::from_counts(&c, 10, RoundTrips::AtLeast(1.0), 8, 2);
        assert_eq!(p.round_trips, 1.0);
        assert_eq!(p.in_flight, 8.0);
        // Flushes are counted among the store's calls but are no round trip.
        let c = Counts { flushes: 10, ..c };
        let p = PerOp::from_counts(&c, 10, RoundTrips::Measured, 1, 1);
        assert_eq!(p.round_trips, 1.0);
    }

    #[test]
    fn no_work_is_no_floor() {
        let f = Floor::of(&limits(), &PerOp::default(), 10.0);
        assert_eq!(f.seconds_per_op, 0.0);
        assert!(f.ops_per_sec.is_infinite());
        assert_eq!(f.of_floor, 0.0);
    }

    #[tokio::test]
    async fn the_machine_is_measured_through_the_real_sealer_and_store() {
        let p = FloorParams {
            each: Duration::from_millis(20),
            ..FloorParams::new(4096 + CellSealer::OVERHEAD as u32).with_store(&StoreUrl::Memory)
        };
        let l = measure(&p).await.unwrap();
        assert!(l.seal_bytes_per_sec > 1e6 && l.open_bytes_per_sec > 1e6, "{l:?}");
        assert!(l.copy_bytes_per_sec > 1e6, "{l:?}");
        let s = l.store.as_ref().unwrap();
        assert!(s.in_process && s.write_bytes_per_sec > 0.0 && s.read_bytes_per_sec > 0.0);
        assert!(render(&l).contains("seal (AES-256-GCM)"));
        assert_eq!(s.scratch_cells, STORE_CELLS);
        assert!(render(&l).contains("64 cells side by side"), "{}", render(&l));
    }

    #[tokio::test]
    async fn an_in_process_store_is_measured_over_an_array_as_large_as_the_engines() {
        let cell = 4096 + CellSealer::OVERHEAD as u32;
        let p = FloorParams {
            each: Duration::from_millis(8),
            ..FloorParams::new(cell).with_store(&StoreUrl::Memory).with_array(3000)
        };
        let l = measure(&p).await.unwrap();
        let s = l.store.as_ref().unwrap();
        assert_eq!(s.scratch_cells, 3000);
        assert!(s.write_bytes_per_sec > 0.0 && s.read_bytes_per_sec > 0.0, "{s:?}");
        assert!(render(&l).contains("root-to-leaf paths of a 12 MiB tree"), "{}", render(&l));
        // Past 1 GiB the scratch tree stops growing; below 64 cells nothing spreads; a store
        // in another process is measured over 64 cells whatever the engine's array.
        assert_eq!(scratch_cells(&StoreUrl::Memory, cell, u64::MAX), (1 << 30) / u64::from(cell));
        assert_eq!(scratch_cells(&StoreUrl::Memory, cell, 10), 64);
        assert_eq!(scratch_cells(&StoreUrl::Memory, cell, 127), 127);
        let redis: StoreUrl = "redis://127.0.0.1:6379/".parse().unwrap();
        assert_eq!(scratch_cells(&redis, cell, 3000), 64);
    }

    #[test]
    fn the_tree_is_read_along_root_to_leaf_paths() {
        for cells in [65u64, 100, 127, 128, 3000] {
            let paths = tree_paths(cells, 200, 7);
            let mut leaves = std::collections::HashSet::new();
            for p in &paths {
                assert_eq!(p[0], CellId(0), "{cells}: every path starts at the root");
                for w in p.windows(2) {
                    let (parent, child) = (w[0].0, w[1].0);
                    assert!(child == 2 * parent + 1 || child == 2 * parent + 2, "{cells}: {p:?}");
                }
                let leaf = p.last().unwrap().0;
                assert!(leaf < cells && 2 * leaf + 1 >= cells, "{cells}: ends at a leaf: {p:?}");
                leaves.insert(leaf);
            }
            // Depth: the last level's leaves lie ceil(log2(cells + 1)) cells down.
            let deepest = paths.iter().map(Vec::len).max().unwrap();
            assert_eq!(deepest as u32, 64 - cells.leading_zeros(), "{cells}");
            assert!(leaves.len() > 10, "{cells}: paths to many leaves, not one");
        }
    }
}
