//! `blindfold bench schemes`: Path ORAM, Ring ORAM and XOR Ring ORAM side by side, as in seed
//! 002's experiment (section 6; Tables 4, 6, 7, 8, 9), and Onion ORAM's rows.
//!
//! Onion ORAM's rows come from its scheme (`blindfold_oram::onion`) run over the same workload
//! without cryptography: its blocks and metadata cells moved are counted from the plans, and
//! its link time is computed from them with the same round-trip time and speed (the seed's
//! "without AHE": computation free, plain-size blocks). "With AHE" adds ciphertext sizes at
//! 1024-bit keys and the processing time per request that `blindfold bench onion` measured
//! (`onion_ahe_ms`), as the seed's Table 8 added its Table 5 total.
//!
//! Each scheme gets a fresh store holding `blocks` real blocks (bulk loaded), then serves the
//! same seeded workload: `ops` requests for uniformly random blocks, `read_ratio` of them reads,
//! arriving as a Poisson process with a mean gap of `interarrival_ms` (the seed: one minute).
//! The store sits behind a [`LatencyStore`] emulating the link.
//!
//! # How time is measured
//!
//! Links are emulated on a *paused* tokio clock, scaled [`TIME_SCALE`] times slower (so the
//! timer's millisecond ticks become microseconds): the link's share of each request is exact
//! and costs no waiting, and the slowest link of the sweep runs as fast as the fastest. The
//! client's own work (sealing, opening, eviction) is measured on the wall clock and added. The
//! two are added serially, so overlap of computation with transfers is not credited (a small
//! overestimate, the same for every scheme). With a `remote://` store, the server's time is
//! part of the wall-clock share.
//!
//! * *response time*: from the start of an access until the block's contents are known (Ring:
//!   after the online read; Path: after the path read, i.e. before the write-back);
//! * *system latency*: until the block is back in the tree: the response time plus the time it
//!   then waits in the stash (including idle time between requests, as in the seed);
//! * *rounds in stash*: later requests served before the block left the stash.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use blindfold_crypto::{CellSealer, MasterKey, StoreId, XorPads};
use blindfold_oram::{
    BlockId, Op, PathOram, PathOramConfig, RingOram, RingOramConfig, RingVariant,
};
use blindfold_proxy::{RingData, RingPhaseTimes, SealedPathOram, SealedRingOram};
use blindfold_store::{
    open_store, open_xor_store, ByteRange, CellId, CountingStore, Counts, Geometry, LatencyStore,
    LinkConfig, Store, StoreUrl, XorStore,
};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::machine::Machine;
use crate::plots::{line_plot, Series};

/// Emulated links run this many times slower on the paused clock; times are divided back.
pub const TIME_SCALE: u32 = 1000;

/// The seed's link speeds (Table 8), bits per second.
pub const SEED_SPEEDS: [u64; 9] = [
    512_000,
    768_000,
    1_000_000,
    1_500_000,
    2_000_000,
    3_000_000,
    4_000_000,
    100_000_000,
    1_000_000_000,
];

/// Seed 002's numbers for comparison (Tables 4 and 7), in ms and blocks.
pub mod seed {
    /// Average response time at 1 Gbit/s: Path, Ring, XOR Ring.
    pub const RESPONSE_MS: [f64; 3] = [12.93, 103.65, 103.26];
    /// System latency at 1 Gbit/s.
    pub const SYSTEM_LATENCY_MS: [f64; 3] = [1642.93, 563_283.45, 317_973.243];
    /// Average stash occupancy after an access.
    pub const STASH: [f64; 3] = [0.027, 75.516, 73.384];
    /// Data blocks client → server over 600 requests.
    pub const BLOCKS_UP: [u64; 3] = [26_400, 30_794, 30_830];
    /// Data blocks server → client over 600 requests.
    pub const BLOCKS_DOWN: [u64; 3] = [26_400, 27_134, 21_158];
    /// Metadata blocks moved over 600 requests.
    pub const META: [u64; 3] = [0, 23_465, 23_476];
}

/// Which scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheme {
    /// Path ORAM.
    Path,
    /// Ring ORAM.
    Ring,
    /// XOR Ring ORAM.
    XorRing,
}

impl Scheme {
    /// All three, in table order.
    pub const ALL: [Scheme; 3] = [Scheme::Path, Scheme::Ring, Scheme::XorRing];

    /// Short name.
    pub fn name(&self) -> &'static str {
        match self {
            Scheme::Path => "Path",
            Scheme::Ring => "Ring",
            Scheme::XorRing => "XOR Ring",
        }
    }

    fn index(&self) -> usize {
        *self as usize
    }
}

/// Parameters of the comparison.
#[derive(Clone, Debug, Serialize)]
pub struct SchemesBench {
    /// Real blocks stored.
    pub blocks: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// Real slots per bucket (all schemes).
    pub z: u32,
    /// Dummy slots per bucket (Ring, XOR Ring).
    pub s: u32,
    /// Accesses between evictions (Ring, XOR Ring).
    pub a: u32,
    /// Requests per run.
    pub ops: u64,
    /// Share of reads.
    pub read_ratio: f64,
    /// Mean gap between request arrivals (Poisson process), ms.
    pub interarrival_ms: f64,
    /// Round-trip time of the emulated link, ms.
    pub rtt_ms: f64,
    /// Link speed of the main comparison (Tables 4, 6, 7), bits per second.
    pub main_speed: u64,
    /// Link speeds of the sweep (Table 8), bits per second.
    pub speeds: Vec<u64>,
    /// Bucket counts of the storage table (Table 9).
    pub storage_buckets: Vec<u64>,
    /// Where the cells live: `memory:` or `remote://host:port` (XOR Ring needs XOR).
    #[serde(serialize_with = "display")]
    pub store: StoreUrl,
    /// Workload and ORAM seed.
    pub seed: u64,
    /// Onion ORAM's measured processing time per request (`amortized_ms_per_access` of a
    /// `blindfold bench onion` report), for the "with AHE" rows; none: those rows are left out.
    pub onion_ahe_ms: Option<f64>,
    /// Print progress lines.
    #[serde(skip)]
    pub progress: bool,
}

fn display<S: serde::Serializer>(url: &StoreUrl, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(url)
}

impl Default for SchemesBench {
    fn default() -> Self {
        Self {
            blocks: 4096,
            block_size: 4096,
            z: 4,
            s: 2,
            a: 3,
            ops: 600,
            read_ratio: 0.75,
            interarrival_ms: 60_000.0,
            rtt_ms: 0.2,
            main_speed: 1_000_000_000,
            speeds: SEED_SPEEDS.to_vec(),
            storage_buckets: (10..=24).step_by(2).map(|k| 1u64 << k).collect(),
            store: StoreUrl::Memory,
            seed: 1,
            onion_ahe_ms: None,
            progress: true,
        }
    }
}

impl SchemesBench {
    /// The `--quick` variant: the same parameters and tables, a third of the requests.
    pub fn quick() -> Self {
        Self { ops: 200, ..Self::default() }
    }
}

/// Per-phase client processing time of Ring / XOR Ring per request, ms (Table 6).
#[derive(Clone, Debug, Default, Serialize)]
pub struct PhaseRow {
    /// Reading (opening) slots.
    pub read_bucket_ms: f64,
    /// Choosing and permuting bucket contents for evictions and reshuffles.
    pub reshuffle_ms: f64,
    /// Sealing and writing whole buckets.
    pub write_bucket_ms: f64,
    /// Working out which slot to read.
    pub get_offset_ms: f64,
    /// Reading (opening) metadata.
    pub read_meta_ms: f64,
    /// Sealing and writing metadata.
    pub write_meta_ms: f64,
    /// Their sum.
    pub total_ms: f64,
}

impl PhaseRow {
    fn from(p: &RingPhaseTimes, ops: u64) -> Self {
        let ms = |d: Duration| d.as_secs_f64() * 1e3 / ops as f64;
        let mut r = Self {
            read_bucket_ms: ms(p.read_blocks),
            reshuffle_ms: ms(p.reshuffle),
            write_bucket_ms: ms(p.write_buckets),
            get_offset_ms: ms(p.get_offsets),
            read_meta_ms: ms(p.read_meta),
            write_meta_ms: ms(p.write_meta),
            total_ms: 0.0,
        };
        r.total_ms = r.read_bucket_ms
            + r.reshuffle_ms
            + r.write_bucket_ms
            + r.get_offset_ms
            + r.read_meta_ms
            + r.write_meta_ms;
        r
    }
}

/// One scheme at one link speed.
#[derive(Clone, Debug, Serialize)]
pub struct SchemeRun {
    /// The scheme.
    pub scheme: Scheme,
    /// Link speed, bits per second.
    pub speed_bps: u64,
    /// Requests measured.
    pub ops: u64,
    /// Average response time, ms.
    pub response_ms: f64,
    /// Average system latency (until the block is back in the tree), ms.
    pub system_latency_ms: f64,
    /// Average number of later requests a block waits in the stash.
    pub stash_rounds: f64,
    /// Average time a block waits in the stash, ms.
    pub stash_wait_ms: f64,
    /// Average stash occupancy after a request.
    pub stash_mean: f64,
    /// Largest stash after a request.
    pub stash_max: usize,
    /// Blocks still in the stash when the run ended (their wait is counted until then).
    pub still_waiting: u64,
    /// Data blocks client → server.
    pub data_blocks_up: u64,
    /// Data blocks server → client.
    pub data_blocks_down: u64,
    /// Metadata cells client → server.
    pub meta_up: u64,
    /// Metadata cells server → client.
    pub meta_down: u64,
    /// Bytes client → server (everything, sealing included).
    pub bytes_up: u64,
    /// Bytes server → client.
    pub bytes_down: u64,
    /// Round trips (storage calls).
    pub round_trips: u64,
    /// Evictions (Ring, XOR Ring).
    pub evictions: u64,
    /// Early reshuffles, buckets (Ring, XOR Ring).
    pub early_reshuffles: u64,
    /// Client wall-clock processing time per request, ms.
    pub cpu_ms: f64,
    /// Per-phase processing time (Ring, XOR Ring).
    pub phases: Option<PhaseRow>,
}

impl SchemeRun {
    /// Data blocks moved per request, both directions.
    pub fn blocks_per_access(&self) -> f64 {
        (self.data_blocks_up + self.data_blocks_down) as f64 / self.ops as f64
    }
}

/// Expected data blocks per access by the published formulas, and ours with early reshuffles.
#[derive(Clone, Debug, Serialize)]
pub struct FormulaRow {
    /// The scheme.
    pub scheme: Scheme,
    /// The paper's formula: Path `2Z(L+1)`; Ring `(L+1)(1 + (2Z+S)/A)`; XOR Ring
    /// `1 + (L+1)(2Z+S)/A` (Ren et al. leave early reshuffles out).
    pub paper: f64,
    /// Plus the expected early reshuffles of this run times `2Z+S` (see
    /// [`expected_reshuffles_in_run`]).
    pub with_reshuffles: f64,
    /// Measured at the main speed.
    pub measured: f64,
    /// Expected early reshuffles per access (buckets).
    pub expected_reshuffles: f64,
    /// Measured early reshuffles per access.
    pub measured_reshuffles: f64,
}

/// Server storage for `buckets` buckets (Table 9), bytes.
#[derive(Clone, Debug, Serialize)]
pub struct StorageRow {
    /// Buckets in the tree.
    pub buckets: u64,
    /// Path ORAM.
    pub path: u64,
    /// Ring ORAM (metadata and data arrays).
    pub ring: u64,
    /// XOR Ring ORAM.
    pub xor_ring: u64,
    /// Whether this size was built and filled in this run (otherwise computed from the same
    /// geometry functions the drivers allocate with).
    pub measured: bool,
}

/// Everything one run of the comparison produced.
#[derive(Clone, Debug, Serialize)]
pub struct SchemesReport {
    /// The machine.
    pub machine: Machine,
    /// The parameters.
    pub params: SchemesBench,
    /// Tree height `L` (levels `L + 1`).
    pub height: u32,
    /// Buckets.
    pub buckets: u64,
    /// Tables 4, 6, 7: each scheme at the main speed.
    pub main: Vec<SchemeRun>,
    /// Table 8: each scheme at each speed.
    pub sweep: Vec<SchemeRun>,
    /// Blocks per access against the formulas.
    pub formula: Vec<FormulaRow>,
    /// Table 9.
    pub storage: Vec<StorageRow>,
    /// Onion ORAM's rows of Tables 4, 7, 8 and 9, without and with the cost of homomorphic
    /// encryption.
    pub onion: OnionRows,
    /// Wall-clock seconds the whole comparison took.
    pub elapsed_s: f64,
}

// ---- a wrapper that times write calls (Path ORAM's write-back) ------------------------------

/// Records the duration of the last write call on both clocks.
#[derive(Debug)]
struct WriteTimer<S> {
    inner: S,
    last: Mutex<(Duration, Duration)>,
}

#[async_trait]
impl<S: Store> Store for WriteTimer<S> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, cells: &[CellId]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        self.inner.read(cells).await
    }
    async fn read_ranges(&self, r: &[ByteRange]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        self.inner.read_ranges(r).await
    }
    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> blindfold_store::Result<()> {
        let t = (tokio::time::Instant::now(), Instant::now());
        let out = self.inner.write(cells).await;
        *self.last.lock() = (t.0.elapsed(), t.1.elapsed());
        out
    }
    async fn flush(&self) -> blindfold_store::Result<()> {
        self.inner.flush().await
    }
}

type Link<S> = CountingStore<LatencyStore<S>>;

fn link(speed: u64, rtt_ms: f64) -> LinkConfig {
    let scale = u64::from(TIME_SCALE);
    let rtt = Duration::from_secs_f64(rtt_ms / 1e3) * TIME_SCALE;
    LinkConfig::symmetric(rtt, (speed / scale).max(1))
}

type TimedLink = Arc<WriteTimer<Arc<Link<Arc<dyn Store>>>>>;

enum Client {
    Path { oram: Box<SealedPathOram>, store: TimedLink },
    Ring { oram: Box<SealedRingOram>, meta: Arc<Link<Arc<dyn Store>>>, data: DataLink },
}

enum DataLink {
    Plain(Arc<Link<Arc<dyn Store>>>),
    Xor(Arc<Link<Arc<dyn XorStore>>>),
}

impl DataLink {
    fn counts(&self) -> Counts {
        match self {
            DataLink::Plain(s) => s.counts(),
            DataLink::Xor(s) => s.counts(),
        }
    }
    fn reset(&self) {
        match self {
            DataLink::Plain(s) => s.reset(),
            DataLink::Xor(s) => s.reset(),
        }
    }
}

/// One measured access: response and completion (ms, link + processing), processing (ms).
struct Timing {
    response: f64,
    complete: f64,
    cpu: f64,
}

fn ms(virt: Duration, wall: Duration) -> f64 {
    virt.as_secs_f64() * 1e3 / f64::from(TIME_SCALE) + wall.as_secs_f64() * 1e3
}

impl Client {
    async fn build(bench: &SchemesBench, scheme: Scheme, speed: u64, run: usize) -> Result<Self> {
        let key = MasterKey::generate();
        let id = StoreId::random();
        let sealer = CellSealer::new(&key, id, 1);
        let link = link(speed, bench.rtt_ms);
        let name = |part: &str| format!("schemes-{run}-{part}");
        let bs = bench.block_size;
        let fill = |b: BlockId| {
            let mut d = vec![0u8; bs as usize];
            d[..8].copy_from_slice(&b.0.to_le_bytes());
            d
        };
        Ok(match scheme {
            Scheme::Path => {
                let config = PathOramConfig::builder(bench.blocks, bs).z(bench.z).build()?;
                let inner =
                    open_store(&bench.store, &name("path"), SealedPathOram::geometry(&config)?)
                        .await?;
                let counted = Arc::new(CountingStore::new(LatencyStore::new(inner, link)));
                let store = Arc::new(WriteTimer { inner: counted, last: Mutex::default() });
                let oram = PathOram::with_seed(config, bench.seed);
                let mut oram = SealedPathOram::with_oram(oram, store.clone(), sealer)?;
                oram.bulk_load(fill, |_, _| {}).await?;
                store.inner.reset();
                Client::Path { oram: Box::new(oram), store }
            }
            Scheme::Ring | Scheme::XorRing => {
                let variant =
                    if scheme == Scheme::Ring { RingVariant::Ring } else { RingVariant::XorRing };
                let config = RingOramConfig::builder(bench.blocks, bs)
                    .z(bench.z)
                    .s(bench.s)
                    .a(bench.a)
                    .variant(variant)
                    .stash_limit(100_000)
                    .build()?;
                let meta_inner = open_store(
                    &bench.store,
                    &name(&format!("{}-meta", variant.name())),
                    SealedRingOram::meta_geometry(&config)?,
                )
                .await?;
                let meta = Arc::new(CountingStore::new(LatencyStore::new(meta_inner, link)));
                let data_name = name(&format!("{}-data", variant.name()));
                let data_g = SealedRingOram::data_geometry(&config)?;
                let (data, ring_data, pads) = match variant {
                    RingVariant::Ring => {
                        let inner = open_store(&bench.store, &data_name, data_g).await?;
                        let d = Arc::new(CountingStore::new(LatencyStore::new(inner, link)));
                        (DataLink::Plain(d.clone()), RingData::Plain(d), None)
                    }
                    RingVariant::XorRing => {
                        let inner = open_xor_store(&bench.store, &data_name, data_g)
                            .await
                            .context(
                            "XOR Ring ORAM needs a store that can XOR (memory:, file:, remote://)",
                        )?;
                        let d = Arc::new(CountingStore::new(LatencyStore::new(inner, link)));
                        (
                            DataLink::Xor(d.clone()),
                            RingData::Xor(d),
                            Some(XorPads::new(&key, id, 1)),
                        )
                    }
                };
                let oram = RingOram::with_seed(config, bench.seed);
                let mut oram =
                    SealedRingOram::with_oram(oram, meta.clone(), ring_data, sealer, pads)?;
                oram.bulk_load(fill).await?;
                meta.reset();
                data.reset();
                Client::Ring { oram: Box::new(oram), meta, data }
            }
        })
    }

    async fn access(&mut self, block: BlockId, op: Op) -> Result<Timing> {
        match self {
            Client::Path { oram, store } => {
                let t = (tokio::time::Instant::now(), Instant::now());
                oram.access(block, op).await?;
                let (v, w) = (t.0.elapsed(), t.1.elapsed());
                let (wv, ww) = *store.last.lock();
                Ok(Timing {
                    response: ms(v.saturating_sub(wv), w.saturating_sub(ww)),
                    complete: ms(v, w),
                    cpu: w.as_secs_f64() * 1e3,
                })
            }
            Client::Ring { oram, .. } => {
                oram.access(block, op).await?;
                let t = oram.last_timing();
                Ok(Timing {
                    response: ms(t.response, t.response_wall),
                    complete: ms(t.complete, t.complete_wall),
                    cpu: t.complete_wall.as_secs_f64() * 1e3,
                })
            }
        }
    }

    fn in_stash(&self, block: BlockId) -> Result<bool> {
        Ok(match self {
            Client::Path { oram, .. } => {
                oram.oram().stash_sizes()[0] > 0
                    && oram.oram().export_state()?.stashes[0].iter().any(|e| e.0 == block.0)
            }
            Client::Ring { oram, .. } => oram.oram().in_stash(block),
        })
    }

    fn stash_len(&self) -> usize {
        match self {
            Client::Path { oram, .. } => oram.oram().stash_sizes()[0],
            Client::Ring { oram, .. } => oram.oram().stash_len(),
        }
    }
}

/// Runs one scheme at one speed.
/// One request of the seeded workload every scheme serves.
struct Request {
    /// Time since the previous arrival (Poisson process), ms.
    gap_ms: f64,
    /// The block.
    block: u64,
    /// A read (else a write).
    read: bool,
}

/// The workload: `ops` requests for uniformly random blocks, `read_ratio` of them reads,
/// arriving as a Poisson process; the same sequence for every scheme and speed.
fn requests(bench: &SchemesBench) -> impl Iterator<Item = Request> + '_ {
    let mut rng = ChaCha8Rng::seed_from_u64(bench.seed ^ 0x05c4_e3e5);
    (0..bench.ops).map(move |_| {
        let gap_ms = -bench.interarrival_ms * (1.0 - rng.gen::<f64>()).ln();
        let block = rng.gen_range(0..bench.blocks);
        Request { gap_ms, block, read: rng.gen_bool(bench.read_ratio) }
    })
}

async fn run_one(
    bench: &SchemesBench,
    scheme: Scheme,
    speed: u64,
    run: usize,
) -> Result<SchemeRun> {
    let mut client = Client::build(bench, scheme, speed, run).await?;
    let bs = bench.block_size as usize;
    let (mut clock, mut done_prev) = (0.0f64, 0.0f64);
    let (mut resp_sum, mut cpu_sum, mut stash_sum, mut stash_max) = (0.0, 0.0, 0u64, 0usize);
    // Blocks waiting in the stash: block -> (request index, time its answer was given).
    let mut pending: HashMap<u64, (u64, f64)> = HashMap::new();
    let (mut waits, mut rounds) = (Vec::new(), Vec::new());
    for (i, r) in (0u64..).zip(requests(bench)) {
        clock += r.gap_ms;
        let start = clock.max(done_prev);
        let block = r.block;
        let op = if r.read { Op::Read } else { Op::Write(vec![(i % 251) as u8; bs]) };
        let t = client.access(BlockId(block), op).await?;
        let answered = start + t.response;
        let done = start + t.complete;
        done_prev = done;
        resp_sum += t.response;
        cpu_sum += t.cpu;
        let stash = client.stash_len();
        stash_sum += stash as u64;
        stash_max = stash_max.max(stash);
        // Blocks that left the stash during this request.
        let mut left = Vec::new();
        for (&b, &(since, at)) in &pending {
            if !client.in_stash(BlockId(b))? {
                left.push((b, since, at));
            }
        }
        for (b, since, at) in left {
            pending.remove(&b);
            rounds.push((i - since) as f64);
            waits.push(done - at);
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = pending.entry(block) {
            if client.in_stash(BlockId(block))? {
                slot.insert((i, answered));
            } else {
                rounds.push(0.0);
                waits.push(done - answered);
            }
        }
    }
    let still_waiting = pending.len() as u64;
    for (_, (since, at)) in pending {
        rounds.push((bench.ops - since) as f64);
        waits.push(done_prev - at);
    }
    let n = bench.ops as f64;
    let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    let response_ms = resp_sum / n;
    let stash_wait_ms = mean(&waits);
    let (data_up, data_down, meta_up, meta_down, counts, evictions, reshuffles, phases) =
        match &client {
            Client::Path { store, oram } => {
                let c = store.inner.counts();
                let z = u64::from(oram.oram().config().z());
                (c.cells_written * z, c.cells_read * z, 0, 0, c, 0, 0, None)
            }
            Client::Ring { oram, meta, data } => {
                let (m, d) = (meta.counts(), data.counts());
                let slots = u64::from(oram.oram().config().slots());
                let mut c = d.clone();
                c.bytes_written += m.bytes_written;
                c.bytes_read += m.bytes_read;
                c.round_trips += m.round_trips;
                let st = oram.oram().stats();
                (
                    d.cells_written * slots,
                    d.ranges_read + d.xor_requests,
                    m.cells_written,
                    m.cells_read,
                    c,
                    st.evictions,
                    st.early_reshuffles,
                    Some(PhaseRow::from(oram.phase_times(), bench.ops)),
                )
            }
        };
    Ok(SchemeRun {
        scheme,
        speed_bps: speed,
        ops: bench.ops,
        response_ms,
        system_latency_ms: response_ms + stash_wait_ms,
        stash_rounds: mean(&rounds),
        stash_wait_ms,
        stash_mean: stash_sum as f64 / n,
        stash_max,
        still_waiting,
        data_blocks_up: data_up,
        data_blocks_down: data_down,
        meta_up,
        meta_down,
        bytes_up: counts.bytes_up(),
        bytes_down: counts.bytes_down(),
        round_trips: counts.round_trips,
        evictions,
        early_reshuffles: reshuffles,
        cpu_ms: cpu_sum / n,
        phases,
    })
}

/// Runs one measurement on its own paused, current-thread runtime.
fn measure(bench: &SchemesBench, scheme: Scheme, speed: u64, run: usize) -> Result<SchemeRun> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .context("starting a runtime")?;
    rt.block_on(run_one(bench, scheme, speed, run))
}

/// `E[⌊R / s⌋]` for `R ~ Bin(n, p)`.
fn floor_div_mean(n: u64, p: f64, s: u32) -> f64 {
    if n == 0 {
        return 0.0;
    }
    if p >= 1.0 {
        return (n / u64::from(s)) as f64;
    }
    // The pmf by recurrence, in logs for large n, until the rest is negligible.
    let q = 1.0 - p;
    let mut log_pmf = n as f64 * q.ln();
    let (mut e, mut mass) = (0.0, log_pmf.exp());
    let mut k = 0u64;
    while k < n && mass < 1.0 - 1e-12 {
        log_pmf += ((n - k) as f64 / (k + 1) as f64).ln() + (p / q).ln();
        k += 1;
        let pmf = log_pmf.exp();
        mass += pmf;
        e += pmf * (k / u64::from(s)) as f64;
    }
    e
}

/// Expected early reshuffles per access in the steady state: `Σ_l E[⌊R_l / S⌋] / A` with
/// `R_l ~ Bin(A·2^l, 2^-l)` reads of a level-`l` bucket between two of its evictions.
pub fn expected_reshuffles(levels: u32, s: u32, a: u32) -> f64 {
    (0..levels)
        .map(|l| floor_div_mean(u64::from(a) << l, 0.5f64.powi(l as i32), s) / f64::from(a))
        .sum()
}

/// Expected early reshuffles per access over a run of `ops` accesses starting from a freshly
/// written tree (every counter at zero), following the public eviction schedule bucket by
/// bucket. A run shorter than an eviction cycle of the leaves sees fewer than the steady state.
pub fn expected_reshuffles_in_run(height: u32, s: u32, a: u32, ops: u64) -> f64 {
    let leaves = 1u64 << height;
    let mut total = 0.0;
    for l in 0..=height {
        let p = 0.5f64.powi(l as i32);
        // Eviction k (at access A(k+1)) passes the level-l bucket above leaf bitrev(k).
        let mut evictions_at: Vec<Vec<u64>> = vec![Vec::new(); 1 << l];
        let mut k = 0u64;
        while u64::from(a) * (k + 1) <= ops {
            let leaf = if height == 0 { 0 } else { (k % leaves).reverse_bits() >> (64 - height) };
            evictions_at[(leaf >> (height - l)) as usize].push(u64::from(a) * (k + 1));
            k += 1;
        }
        for times in evictions_at {
            let mut last = 0u64;
            for t in times.into_iter().chain([ops]) {
                total += floor_div_mean(t - last, p, s);
                last = t;
            }
        }
    }
    total / ops as f64
}

fn storage_row(bench: &SchemesBench, buckets: u64, measured: bool) -> Result<StorageRow> {
    let leaves = buckets.div_ceil(2).max(1);
    let path = PathOramConfig::builder(bench.blocks, bench.block_size)
        .z(bench.z)
        .leaves(leaves)
        .build()?;
    let ring = |variant| {
        RingOramConfig::builder(bench.blocks, bench.block_size)
            .z(bench.z)
            .s(bench.s)
            .a(bench.a)
            .leaves(leaves)
            .variant(variant)
            .build()
    };
    let ring_bytes = |c: &RingOramConfig| -> Result<u64> {
        Ok(SealedRingOram::meta_geometry(c)?.total_bytes()
            + SealedRingOram::data_geometry(c)?.total_bytes())
    };
    Ok(StorageRow {
        buckets,
        path: SealedPathOram::geometry(&path)?.total_bytes(),
        ring: ring_bytes(&ring(RingVariant::Ring)?)?,
        xor_ring: ring_bytes(&ring(RingVariant::XorRing)?)?,
        measured,
    })
}

/// Runs the whole comparison.
/// Onion ORAM at one link speed.
#[derive(Clone, Debug, Serialize)]
pub struct OnionSpeedRow {
    /// Link speed, bits per second.
    pub speed_bps: u64,
    /// Average response time without the cost of homomorphic encryption (plain-size blocks,
    /// free computation, as the seed's Table 4 assumed), ms.
    pub response_ms: f64,
    /// Average system latency without it (until the block is back in the root), ms.
    pub system_latency_ms: f64,
    /// Response time with it: ciphertext-size transfers at 1024-bit keys plus the measured
    /// processing per request ([`SchemesBench::onion_ahe_ms`]), ms; none without a measurement.
    pub response_with_ahe_ms: Option<f64>,
}

/// Onion ORAM's rows (no stash: response time and system latency differ only by the write into
/// the root).
#[derive(Clone, Debug, Serialize)]
pub struct OnionRows {
    /// Slots per half bucket.
    pub half_slots: u32,
    /// Slots of a leaf's stripped area.
    pub leaf_slots: u32,
    /// Data blocks client → server over the run (Table 7).
    pub data_blocks_up: u64,
    /// Data blocks server → client over the run.
    pub data_blocks_down: u64,
    /// Metadata cells moved over the run.
    pub meta_blocks: u64,
    /// Evictions.
    pub evictions: u64,
    /// Tables 4 and 8.
    pub sweep: Vec<OnionSpeedRow>,
    /// Table 9: `(buckets, bytes without AHE, bytes with AHE at 1024-bit keys)`.
    pub storage: Vec<(u64, u64, u64)>,
}

/// Bytes of a Damgård–Jurik ciphertext of layer `s` under a 1024-bit modulus.
fn dj_ct_len(s: u32) -> u64 {
    u64::from(s + 1) * 128
}

/// Bytes of a sealed block of `config` as stored at onion depth `d` (1024-bit keys: pieces of
/// `128·s0 - 1` bytes for the first layer `s0`, ciphertexts of layer `config.layer(d)`).
fn onion_slot_len(config: &blindfold_oram::OnionOramConfig, d: u32) -> u64 {
    let piece = u64::from(config.first_layer()) * 128 - 1;
    let chunks = (u64::from(config.block_size()) + CellSealer::OVERHEAD as u64).div_ceil(piece);
    chunks * dj_ct_len(config.layer(d))
}

fn onion_rows(bench: &SchemesBench) -> Result<OnionRows> {
    use blindfold_oram::onion::BucketMeta;
    use blindfold_oram::{BucketId, OnionOram, OnionOramConfig};
    let config = OnionOramConfig::builder(bench.blocks, bench.block_size).a(bench.a).build()?;
    let h = config.shape().height();
    let mut oram = OnionOram::with_seed(config.clone(), bench.seed);
    let mut metas: HashMap<BucketId, BucketMeta> = HashMap::new();
    for (b, m) in oram.bulk_place(bench.blocks)?.metas {
        metas.insert(b, m);
    }
    let base = oram.stats().clone();
    let get = |metas: &HashMap<BucketId, BucketMeta>, bs: &[BucketId]| -> Vec<BucketMeta> {
        bs.iter()
            .map(|b| {
                metas.get(b).cloned().unwrap_or_else(|| BucketMeta::empty(config.slots_of(*b)))
            })
            .collect()
    };
    for r in requests(bench) {
        let (block, write) = (r.block, !r.read);
        let path = oram.start(BlockId(block))?;
        let m = get(&metas, &path);
        oram.plan_select(m)?;
        let fin = oram.finish(write)?;
        metas.extend(fin.metas);
        if fin.evict {
            let bs = oram.start_eviction()?;
            let m = get(&metas, &bs);
            metas.extend(oram.plan_eviction(m)?.metas);
        }
    }
    let st = oram.stats();
    let meta_cell = (config.meta_bytes() + CellSealer::OVERHEAD) as f64;
    let block = f64::from(bench.block_size) + CellSealer::OVERHEAD as f64;
    let levels = f64::from(h + 1);
    // Selection vectors and answer with AHE: one element per slot of the path at its depth + 1,
    // one per group at layer 1; the answer is one layer-1 select over the deepest group's answer.
    let path_slots: Vec<(u32, u32)> = {
        let mut v = vec![(config.a(), 1)];
        v.extend((1..h).map(|l| (2 * config.half_slots(), l + 1)));
        v.push((2 * config.half_slots(), h + 1));
        v.push((config.leaf_slots(), 1));
        v
    };
    let selector_bytes: f64 = path_slots
        .iter()
        .map(|&(n, d)| f64::from(n) * dj_ct_len(config.layer(d) + 1) as f64)
        .sum::<f64>()
        + path_slots.len() as f64 * dj_ct_len(1) as f64;
    let answer_bytes = (onion_slot_len(&config, h + 2) as f64 / 127.0).ceil() * 256.0;
    let sweep = std::iter::once(bench.main_speed)
        .chain(bench.speeds.iter().copied())
        .collect::<std::collections::BTreeSet<u64>>()
        .into_iter()
        .map(|speed| {
            let rtt = bench.rtt_ms;
            let t = |bytes: f64| bytes * 8.0 / speed as f64 * 1e3;
            // Metadata of the path, then the select, then the root and the path's metadata.
            let response = 2.0 * rtt + t(levels * meta_cell) + t(block);
            let latency = response + rtt + t(block) + t(levels * meta_cell);
            let with = bench.onion_ahe_ms.map(|ahe| {
                2.0 * rtt + t(levels * meta_cell) + t(selector_bytes) + t(answer_bytes) + ahe
            });
            OnionSpeedRow {
                speed_bps: speed,
                response_ms: response,
                system_latency_ms: latency,
                response_with_ahe_ms: with,
            }
        })
        .collect();
    let storage = bench
        .storage_buckets
        .iter()
        .chain(std::iter::once(&config.buckets()))
        .map(|&n| -> Result<(u64, u64, u64)> {
            let height = (n + 1).max(2).ilog2() - 1;
            let c = OnionOramConfig::builder(bench.blocks, bench.block_size)
                .a(bench.a)
                .height(height.max(1))
                .leaf_slots(config.leaf_slots())
                .build()?;
            let meta = c.buckets() * (c.meta_bytes() + CellSealer::OVERHEAD) as u64;
            let plain =
                c.data_cells() * (u64::from(bench.block_size) + CellSealer::OVERHEAD as u64);
            let ahe = c.data_cells() * onion_slot_len(&c, c.max_depth());
            Ok((c.buckets(), plain + meta, ahe + meta))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut storage = storage;
    storage.sort_unstable();
    storage.dedup();
    Ok(OnionRows {
        half_slots: config.half_slots(),
        leaf_slots: config.leaf_slots(),
        data_blocks_up: st.blocks_up - base.blocks_up,
        data_blocks_down: st.blocks_down - base.blocks_down,
        meta_blocks: (st.meta_reads - base.meta_reads) + (st.meta_writes - base.meta_writes),
        evictions: st.evictions - base.evictions,
        sweep,
        storage,
    })
}

pub fn run(bench: &SchemesBench) -> Result<SchemesReport> {
    if bench.blocks == 0 || bench.ops == 0 {
        bail!("need at least one block and one request");
    }
    let started = Instant::now();
    let say = |m: String| {
        if bench.progress {
            eprintln!("{m}");
        }
    };
    let mut run_no = 0;
    let mut main = Vec::new();
    for scheme in Scheme::ALL {
        say(format!("main comparison: {} at {}", scheme.name(), speed_name(bench.main_speed)));
        main.push(measure(bench, scheme, bench.main_speed, run_no)?);
        run_no += 1;
    }
    let mut sweep = Vec::new();
    for &speed in &bench.speeds {
        for scheme in Scheme::ALL {
            if speed == bench.main_speed {
                sweep.push(main[scheme.index()].clone());
                continue;
            }
            say(format!("link sweep: {} at {}", scheme.name(), speed_name(speed)));
            sweep.push(measure(bench, scheme, speed, run_no)?);
            run_no += 1;
        }
    }
    let config = RingOramConfig::builder(bench.blocks, bench.block_size)
        .z(bench.z)
        .s(bench.s)
        .a(bench.a)
        .build()?;
    let levels = config.shape().levels();
    let (z, s, a) = (f64::from(bench.z), f64::from(bench.s), f64::from(bench.a));
    let lv = f64::from(levels);
    let resh = expected_reshuffles_in_run(levels - 1, bench.s, bench.a, bench.ops);
    let formula = main
        .iter()
        .map(|r| {
            let (paper, extra) = match r.scheme {
                Scheme::Path => (2.0 * z * lv, 0.0),
                Scheme::Ring => (lv * (1.0 + (2.0 * z + s) / a), resh * (2.0 * z + s)),
                Scheme::XorRing => (1.0 + lv * (2.0 * z + s) / a, resh * (2.0 * z + s)),
            };
            FormulaRow {
                scheme: r.scheme,
                paper,
                with_reshuffles: paper + extra,
                measured: r.blocks_per_access(),
                expected_reshuffles: if r.scheme == Scheme::Path { 0.0 } else { resh },
                measured_reshuffles: r.early_reshuffles as f64 / r.ops as f64,
            }
        })
        .collect();
    let buckets = config.buckets();
    let mut storage = Vec::new();
    for &n in &bench.storage_buckets {
        storage.push(storage_row(bench, n, false)?);
    }
    let mut built = storage_row(bench, buckets + 1, true)?;
    built.buckets = buckets;
    storage.push(built);
    storage.sort_by_key(|r| r.buckets);
    let onion = onion_rows(bench)?;
    Ok(SchemesReport {
        machine: Machine::current(),
        params: bench.clone(),
        height: config.shape().height(),
        buckets,
        main,
        sweep,
        formula,
        storage,
        onion,
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}

/// `512 kbit/s`, `1.5 Mbit/s`, `1 Gbit/s`.
pub fn speed_name(bps: u64) -> String {
    let (v, unit) = if bps >= 1_000_000_000 {
        (bps as f64 / 1e9, "Gbit/s")
    } else if bps >= 1_000_000 {
        (bps as f64 / 1e6, "Mbit/s")
    } else {
        (bps as f64 / 1e3, "kbit/s")
    };
    format!("{} {unit}", trim(v))
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn f(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{v:.0}")
    } else if v >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

fn table(out: &mut String, head: &[&str], rows: &[Vec<String>]) {
    let widths: Vec<usize> = (0..head.len())
        .map(|i| rows.iter().map(|r| r[i].len()).chain([head[i].len()]).max().unwrap_or(0))
        .collect();
    let line = |cells: Vec<String>| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i == 0 {
                let _ = write!(l, "{c:<w$}", w = widths[i]);
            } else {
                let _ = write!(l, "  {c:>w$}", w = widths[i]);
            }
        }
        l.trim_end().to_string()
    };
    let _ = writeln!(out, "{}", line(head.iter().map(|s| s.to_string()).collect()));
    let _ =
        writeln!(out, "{}", widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("  "));
    for r in rows {
        let _ = writeln!(out, "{}", line(r.clone()));
    }
    let _ = writeln!(out);
}

/// The report as text tables.
pub fn render(r: &SchemesReport) -> String {
    let p = &r.params;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Path vs Ring vs XOR Ring ORAM — {} blocks of {} B, Z={} S={} A={}, {} buckets (L={}), \
         {} requests ({:.0}% reads), Poisson arrivals every {} ms on average, RTT {} ms, store {}",
        p.blocks,
        p.block_size,
        p.z,
        p.s,
        p.a,
        r.buckets,
        r.height,
        p.ops,
        p.read_ratio * 100.0,
        p.interarrival_ms,
        p.rtt_ms,
        p.store
    );
    let _ = writeln!(out, "machine: {}\n", r.machine.summary());
    let _ = writeln!(
        out,
        "Table 4 — at {} (times in ms; seed's values in brackets)",
        speed_name(p.main_speed)
    );
    let col = |g: &dyn Fn(&SchemeRun) -> String| r.main.iter().map(g).collect::<Vec<_>>();
    let mut rows = Vec::new();
    let mut push = |name: &str, vals: Vec<String>| {
        let mut row = vec![name.to_string()];
        row.extend(vals);
        rows.push(row);
    };
    push(
        "average response time",
        col(&|x| format!("{} [{}]", f(x.response_ms), seed::RESPONSE_MS[x.scheme.index()])),
    );
    push(
        "system latency",
        col(&|x| {
            format!("{} [{}]", f(x.system_latency_ms), seed::SYSTEM_LATENCY_MS[x.scheme.index()])
        }),
    );
    push("rounds a block waits in the stash", col(&|x| f(x.stash_rounds)));
    push("time a block waits in the stash", col(&|x| f(x.stash_wait_ms)));
    push(
        "blocks in the stash after a request",
        col(&|x| format!("{} [{}]", f(x.stash_mean), seed::STASH[x.scheme.index()])),
    );
    push("largest stash", col(&|x| x.stash_max.to_string()));
    push("client processing per request", col(&|x| f(x.cpu_ms)));
    let head: Vec<&str> =
        std::iter::once("").chain(r.main.iter().map(|x| x.scheme.name())).collect();
    table(&mut out, &head, &rows);

    let _ = writeln!(
        out,
        "Table 7 — blocks moved over {} requests (seed's 600-request values in brackets)",
        p.ops
    );
    let mut rows = Vec::new();
    let mut push = |name: &str, vals: Vec<String>| {
        let mut row = vec![name.to_string()];
        row.extend(vals);
        rows.push(row);
    };
    push(
        "data blocks client → server",
        col(&|x| format!("{} [{}]", x.data_blocks_up, seed::BLOCKS_UP[x.scheme.index()])),
    );
    push(
        "data blocks server → client",
        col(&|x| format!("{} [{}]", x.data_blocks_down, seed::BLOCKS_DOWN[x.scheme.index()])),
    );
    push("data blocks total", col(&|x| (x.data_blocks_up + x.data_blocks_down).to_string()));
    push(
        "metadata blocks total",
        col(&|x| format!("{} [{}]", x.meta_up + x.meta_down, seed::META[x.scheme.index()])),
    );
    push("metadata up / down", col(&|x| format!("{} / {}", x.meta_up, x.meta_down)));
    push(
        "MiB up / down",
        col(&|x| {
            format!("{:.1} / {:.1}", x.bytes_up as f64 / 1048576.0, x.bytes_down as f64 / 1048576.0)
        }),
    );
    push("storage calls per request", col(&|x| f(x.round_trips as f64 / x.ops as f64)));
    push(
        "evictions / early reshuffles",
        col(&|x| format!("{} / {}", x.evictions, x.early_reshuffles)),
    );
    table(&mut out, &head, &rows);

    let _ = writeln!(out, "Blocks moved per request against the formulas (L+1 = {})", r.height + 1);
    let rows: Vec<Vec<String>> = r
        .formula
        .iter()
        .map(|x| {
            vec![
                x.scheme.name().to_string(),
                f(x.paper),
                f(x.with_reshuffles),
                f(x.measured),
                format!("{:.3} / {:.3}", x.expected_reshuffles, x.measured_reshuffles),
            ]
        })
        .collect();
    table(
        &mut out,
        &[
            "scheme",
            "paper formula",
            "+ expected early reshuffles",
            "measured",
            "reshuffles/request exp. / meas.",
        ],
        &rows,
    );

    let _ = writeln!(out, "Table 6 — client processing per request, ms (Ring, XOR Ring)");
    let ph: Vec<&SchemeRun> = r.main.iter().filter(|x| x.phases.is_some()).collect();
    let pcol = |g: &dyn Fn(&PhaseRow) -> f64| {
        ph.iter().map(|x| f(g(x.phases.as_ref().unwrap()))).collect::<Vec<_>>()
    };
    let mut rows = Vec::new();
    for (name, vals) in [
        ("read bucket (slots)", pcol(&|p| p.read_bucket_ms)),
        ("reshuffle bucket", pcol(&|p| p.reshuffle_ms)),
        ("write bucket", pcol(&|p| p.write_bucket_ms)),
        ("get offset", pcol(&|p| p.get_offset_ms)),
        ("read metadata", pcol(&|p| p.read_meta_ms)),
        ("write metadata", pcol(&|p| p.write_meta_ms)),
        ("total", pcol(&|p| p.total_ms)),
    ] {
        let mut row = vec![name.to_string()];
        row.extend(vals);
        rows.push(row);
    }
    let head6: Vec<&str> = std::iter::once("").chain(ph.iter().map(|x| x.scheme.name())).collect();
    table(&mut out, &head6, &rows);

    let _ = writeln!(out, "Table 8 — response time / system latency by link speed, ms");
    let mut rows = Vec::new();
    for &speed in &p.speeds {
        let mut row = vec![speed_name(speed)];
        for s in Scheme::ALL {
            if let Some(x) = r.sweep.iter().find(|x| x.speed_bps == speed && x.scheme == s) {
                row.push(format!("{} / {}", f(x.response_ms), f(x.system_latency_ms)));
            }
        }
        rows.push(row);
    }
    table(&mut out, &["link", "Path", "Ring", "XOR Ring"], &rows);

    let _ = writeln!(
        out,
        "Table 9 — server storage, MB (10^6 bytes, sealing and metadata included; N buckets \
         means N/2 leaves; * = the tree this run built)"
    );
    let rows: Vec<Vec<String>> = r
        .storage
        .iter()
        .map(|x| {
            vec![
                format!("{}{}", x.buckets, if x.measured { "*" } else { "" }),
                format!("{:.2}", x.path as f64 / 1e6),
                format!("{:.2}", x.ring as f64 / 1e6),
                format!("{:.2}", x.xor_ring as f64 / 1e6),
                format!("{:.2}", x.ring as f64 / x.path as f64),
            ]
        })
        .collect();
    table(&mut out, &["buckets", "Path", "Ring", "XOR Ring", "Ring / Path"], &rows);
    let o = &r.onion;
    let _ = writeln!(
        out,
        "Onion ORAM (no stash; halves of {} slots, leaves of {} + 2×{}; {} evictions): data blocks \
         up / down {} / {} [seed 1 400 / 1 400], metadata cells {} [25 800]",
        o.half_slots, o.leaf_slots, o.half_slots, o.evictions, o.data_blocks_up, o.data_blocks_down, o.meta_blocks
    );
    let rows: Vec<Vec<String>> = o
        .sweep
        .iter()
        .map(|x| {
            vec![
                speed_name(x.speed_bps),
                format!("{} / {}", f(x.response_ms), f(x.system_latency_ms)),
                x.response_with_ahe_ms.map_or("- (run bench onion, pass --onion-json)".into(), f),
            ]
        })
        .collect();
    table(
        &mut out,
        &["link", "Onion w/o AHE: response / latency", "Onion with AHE: response"],
        &rows,
    );
    let rows: Vec<Vec<String>> = o
        .storage
        .iter()
        .map(|&(n, plain, ahe)| {
            vec![
                n.to_string(),
                format!("{:.2}", plain as f64 / 1e6),
                format!("{:.2}", ahe as f64 / 1e6),
            ]
        })
        .collect();
    table(&mut out, &["buckets", "Onion w/o AHE (MB)", "Onion with AHE, 1024-bit (MB)"], &rows);
    let path = &r.main[0];
    let _ = writeln!(
        out,
        "Path ORAM response time at {}: {} ms (seed: 12.93 ms, ratio {:.2}). Whole run: {:.1} s.",
        speed_name(p.main_speed),
        f(path.response_ms),
        path.response_ms / seed::RESPONSE_MS[0],
        r.elapsed_s
    );
    out
}

/// Writes `main.csv`, `sweep.csv`, `storage.csv` and the plots into `dir`.
pub fn save(r: &SchemesReport, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    let runs_csv = |runs: &[SchemeRun]| {
        let mut s = String::from(
            "scheme,speed_bps,ops,response_ms,system_latency_ms,stash_rounds,stash_wait_ms,stash_mean,stash_max,\
             data_blocks_up,data_blocks_down,meta_up,meta_down,bytes_up,bytes_down,round_trips,evictions,\
             early_reshuffles,cpu_ms\n",
        );
        for x in runs {
            let _ = writeln!(
                s,
                "{},{},{},{:.4},{:.4},{:.4},{:.4},{:.4},{},{},{},{},{},{},{},{},{},{},{:.4}",
                x.scheme.name(),
                x.speed_bps,
                x.ops,
                x.response_ms,
                x.system_latency_ms,
                x.stash_rounds,
                x.stash_wait_ms,
                x.stash_mean,
                x.stash_max,
                x.data_blocks_up,
                x.data_blocks_down,
                x.meta_up,
                x.meta_down,
                x.bytes_up,
                x.bytes_down,
                x.round_trips,
                x.evictions,
                x.early_reshuffles,
                x.cpu_ms
            );
        }
        s
    };
    let mut put = |name: &str, body: String| -> Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, body).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
        Ok(())
    };
    put("main.csv", runs_csv(&r.main))?;
    put("sweep.csv", runs_csv(&r.sweep))?;
    let mut s = String::from("buckets,path_bytes,ring_bytes,xor_ring_bytes,measured\n");
    for x in &r.storage {
        let _ = writeln!(s, "{},{},{},{},{}", x.buckets, x.path, x.ring, x.xor_ring, x.measured);
    }
    put("storage.csv", s)?;
    let mut s = String::from(
        "scheme,paper,with_reshuffles,measured,expected_reshuffles,measured_reshuffles\n",
    );
    for x in &r.formula {
        let _ = writeln!(
            s,
            "{},{:.4},{:.4},{:.4},{:.4},{:.4}",
            x.scheme.name(),
            x.paper,
            x.with_reshuffles,
            x.measured,
            x.expected_reshuffles,
            x.measured_reshuffles
        );
    }
    put("formula.csv", s)?;
    written.extend(draw_plots(r, dir)?);
    Ok(written)
}

/// Draws the SVG plots (seed 002's Figures 2 and 3, and latency by link speed) into `dir`;
/// returns their paths.
fn draw_plots(r: &SchemesReport, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let by_speed = |g: fn(&SchemeRun) -> f64| -> Vec<Series> {
        Scheme::ALL
            .iter()
            .map(|&s| {
                let mut pts: Vec<(f64, f64)> = r
                    .sweep
                    .iter()
                    .filter(|x| x.scheme == s)
                    .map(|x| (x.speed_bps as f64 / 1e6, g(x)))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                (s.name().to_string(), pts)
            })
            .collect()
    };
    let p = dir.join("response-time-by-link-speed.svg");
    line_plot(
        &p,
        "Average response time by link speed",
        "link speed (Mbit/s)",
        "ms",
        &by_speed(|x| x.response_ms),
    )?;
    out.push(p);
    let p = dir.join("system-latency-by-link-speed.svg");
    line_plot(
        &p,
        "System latency by link speed",
        "link speed (Mbit/s)",
        "ms",
        &by_speed(|x| x.system_latency_ms),
    )?;
    out.push(p);
    let storage: Vec<Series> = [
        ("Path", r.storage.iter().map(|x| (x.buckets as f64, x.path as f64 / 1e6)).collect()),
        ("Ring", r.storage.iter().map(|x| (x.buckets as f64, x.ring as f64 / 1e6)).collect()),
        (
            "XOR Ring",
            r.storage.iter().map(|x| (x.buckets as f64, x.xor_ring as f64 / 1e6)).collect(),
        ),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), v))
    .collect();
    let p = dir.join("server-storage.svg");
    line_plot(&p, "Server storage by number of buckets", "buckets", "MB", &storage)?;
    out.push(p);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshuffle_expectations() {
        // The root is read by every access: with A = 3, S = 2 it is reshuffled once per cycle.
        assert!((expected_reshuffles(1, 2, 3) - 1.0 / 3.0).abs() < 1e-9);
        assert!(
            (floor_div_mean(4, 0.5, 2) - (6.0 / 16.0 + 2.0 * 1.0 / 16.0 + 4.0 / 16.0)).abs() < 1e-9
        );
        // A long run approaches the steady state.
        let steady = expected_reshuffles(5, 2, 3);
        let run = expected_reshuffles_in_run(4, 2, 3, 30_000);
        assert!((run - steady).abs() / steady < 0.02, "{run} vs {steady}");
    }

    /// Onion ORAM's counts follow from its schedule: one block each way per request, and per
    /// eviction the leaf's halves and stripped area down, its stripped area up; with AHE adds
    /// the measured time to every speed.
    #[test]
    fn onion_rows_count_what_the_schedule_moves() {
        let bench = SchemesBench {
            blocks: 64,
            block_size: 512,
            ops: 30,
            speeds: vec![1_000_000, 100_000_000],
            storage_buckets: vec![31, 127],
            onion_ahe_ms: Some(1000.0),
            progress: false,
            ..SchemesBench::default()
        };
        let o = onion_rows(&bench).unwrap();
        assert_eq!(o.evictions, 10);
        let (zh, zl) = (u64::from(o.half_slots), u64::from(o.leaf_slots));
        assert_eq!(o.data_blocks_up, 30 + 10 * zl);
        assert_eq!(o.data_blocks_down, 30 + 10 * (2 * zh + zl));
        assert_eq!(o.sweep.len(), 3, "main speed and the two of the sweep");
        for w in o.sweep.windows(2) {
            assert!(w[0].response_ms > w[1].response_ms, "slower links take longer");
        }
        for x in &o.sweep {
            assert!(x.system_latency_ms > x.response_ms);
            assert!(x.response_with_ahe_ms.unwrap() > 1000.0 + x.response_ms);
        }
        assert!(o.storage.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
        assert!(o.storage.iter().all(|&(_, plain, ahe)| ahe > plain));
    }

    #[test]
    fn speeds_print() {
        assert_eq!(speed_name(512_000), "512 kbit/s");
        assert_eq!(speed_name(1_500_000), "1.5 Mbit/s");
        assert_eq!(speed_name(1_000_000_000), "1 Gbit/s");
    }
}
