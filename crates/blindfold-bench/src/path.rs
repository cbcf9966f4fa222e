//! `blindfold bench path`: Path ORAM against the same blocks sealed without ORAM.
//!
//! Both sides run the same seeded workload (uniform random blocks, a configurable share of
//! reads) on the same kind of backend, one access at a time, after filling every block. The
//! baseline is a [`SealedDirect`] store: same AEAD, same version checks, block `i` in cell `i`.
//! The ratio of their throughputs is the price of obliviousness on this machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use blindfold_crypto::{CellSealer, MasterKey, StoreId};
use blindfold_oram::{BlockId, Op, PathOram, PathOramConfig, PosMapMode};
use blindfold_proxy::{SealedDirect, SealedPathOram};
use blindfold_store::{
    open_store, CountingStore, Geometry, LatencyStore, LinkConfig, Store, StoreUrl,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::floor::{Floor, FloorParams, FloorReport, PerOp, RoundTrips};
use crate::machine::{peak_rss_bytes, Machine};
use crate::progress::bar;
use crate::slow::SlowStore;

/// Parameters of one Path ORAM benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct PathBench {
    /// Logical blocks.
    pub blocks: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// Measured logical accesses.
    pub ops: u64,
    /// Where cells go.
    #[serde(serialize_with = "display")]
    pub store: StoreUrl,
    /// Slots per bucket.
    pub z: u32,
    /// Top levels kept in trusted memory.
    pub cache_levels: u32,
    /// Recursive position map with this many entries left in memory (`None`: in memory).
    pub recursive: Option<u64>,
    /// Share of reads in the workload.
    pub read_ratio: f64,
    /// Workload and ORAM seed.
    pub seed: u64,
    /// Emulated round-trip time to the store, if any.
    pub rtt_ms: Option<f64>,
    /// Emulated link bandwidth (both directions), if any.
    pub bandwidth_mbit: Option<f64>,
    /// Fill every block before measuring (a realistic, full tree).
    pub fill: bool,
    /// Test hook (`bench regress --inject-slowdown`): makes the engine's side about this many
    /// times slower ([`crate::slow::SlowStore`] on its store), never the baseline's. `None` in
    /// every real measurement.
    pub inject_slowdown: Option<f64>,
    /// Draw progress bars.
    #[serde(skip)]
    pub progress: bool,
    /// Prices for the cost table (the report carries their date and source).
    #[serde(skip)]
    pub prices: crate::cost::PriceTable,
}

fn display<S: serde::Serializer>(url: &StoreUrl, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(url)
}

impl Default for PathBench {
    fn default() -> Self {
        Self {
            blocks: 1 << 16,
            block_size: 4096,
            ops: 20_000,
            store: StoreUrl::Memory,
            z: 4,
            cache_levels: 0,
            recursive: None,
            read_ratio: 0.75,
            seed: 1,
            rtt_ms: None,
            bandwidth_mbit: None,
            fill: true,
            inject_slowdown: None,
            progress: true,
            prices: crate::cost::PriceTable::builtin(),
        }
    }
}

/// Results of [`run`]. Field names are the JSON keys.
#[derive(Clone, Debug, Serialize)]
pub struct PathReport {
    /// Always `"path"`.
    pub scheme: &'static str,
    /// Where it ran.
    pub machine: Machine,
    /// The parameters.
    pub params: PathBench,
    /// Logical accesses per second through Path ORAM.
    pub ops_per_sec: f64,
    /// Logical payload megabytes (10^6) per second.
    pub mb_per_sec: f64,
    /// Mean latency of one access, microseconds.
    pub mean_latency_us: f64,
    /// Median latency, microseconds.
    pub p50_latency_us: f64,
    /// 99th-percentile latency, microseconds.
    pub p99_latency_us: f64,
    /// Bytes moved to and from the store per logical access.
    pub physical_bytes_per_op: f64,
    /// Bytes sent to the store per logical access.
    pub bytes_up_per_op: f64,
    /// Bytes received from the store per logical access.
    pub bytes_down_per_op: f64,
    /// Physical bytes per logical byte (`physical_bytes_per_op / block_size`).
    pub blowup: f64,
    /// Store round trips per logical access.
    pub round_trips_per_op: f64,
    /// Largest data-tree stash between accesses.
    pub max_stash: usize,
    /// Mean data-tree stash between accesses.
    pub mean_stash: f64,
    /// Peak trusted state (position map, stash, cache, versions), bytes.
    pub trusted_bytes: u64,
    /// Trusted state over dataset size.
    pub outsource_ratio: f64,
    /// Peak resident memory of the whole process (includes an in-memory store), bytes.
    pub peak_rss_bytes: u64,
    /// Logical dataset, bytes.
    pub dataset_bytes: u64,
    /// Bytes the store holds for the ORAM.
    pub server_bytes: u64,
    /// Seconds spent filling the ORAM (bulk load).
    pub fill_seconds: f64,
    /// Same workload, sealed without ORAM: accesses per second.
    pub baseline_ops_per_sec: f64,
    /// Same workload, sealed without ORAM: bytes moved per access.
    pub baseline_physical_bytes_per_op: f64,
    /// `baseline_ops_per_sec / ops_per_sec`.
    pub slowdown: f64,
    /// Requests and bytes by kind, priced per provider, with the cost multiplier over the
    /// baseline.
    pub cost: crate::cost::CostReport,
    /// This machine's limits and the floor they set for both sides (one core, one access at a
    /// time: every store call is a round trip the access waits for).
    pub floor: FloorReport,
}

fn block_data(id: u64, size: usize) -> Vec<u8> {
    let mut v = vec![(id % 251) as u8; size];
    v[..8.min(size)].copy_from_slice(&id.to_le_bytes()[..8.min(size)]);
    v
}

/// Opens one side's store behind the emulated link, if any; `slowdown` is the test hook of
/// [`PathBench::inject_slowdown`] (the ORAM side only).
async fn open(
    params: &PathBench,
    name: &str,
    geometry: Geometry,
    slowdown: Option<f64>,
) -> Result<Arc<CountingStore<Arc<dyn Store>>>> {
    let raw = open_store(&params.store, name, geometry)
        .await
        .with_context(|| format!("opening store {} ({name})", params.store))?;
    let mut store: Arc<dyn Store> = match link(params) {
        Some(link) => Arc::new(LatencyStore::new(raw, link)),
        None => raw,
    };
    if let Some(factor) = slowdown {
        store = Arc::new(SlowStore::new(store, factor)?);
    }
    Ok(Arc::new(CountingStore::new(store)))
}

/// The emulated link of `--rtt-ms` and `--bandwidth-mbit`, if any.
fn link(params: &PathBench) -> Option<LinkConfig> {
    let rtt = Duration::from_secs_f64(params.rtt_ms? / 1000.0);
    Some(match params.bandwidth_mbit {
        Some(mbit) => LinkConfig::symmetric(rtt, (mbit * 1e6) as u64),
        None => LinkConfig::unlimited(rtt),
    })
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    f64::from(sorted[i])
}

/// Runs the benchmark: fill, measure Path ORAM, then the sealed baseline.
pub async fn run(params: PathBench) -> Result<PathReport> {
    anyhow::ensure!(params.ops > 0, "--ops must be at least 1");
    anyhow::ensure!((0.0..=1.0).contains(&params.read_ratio), "--read-ratio must be in 0..=1");
    let posmap = match params.recursive {
        Some(max_in_memory_entries) => PosMapMode::Recursive { max_in_memory_entries },
        None => PosMapMode::InMemory,
    };
    let config = PathOramConfig::builder(params.blocks, params.block_size)
        .z(params.z)
        .cache_levels(params.cache_levels)
        .posmap(posmap)
        .build()?;
    let bs = params.block_size as usize;
    let mut rng = ChaCha8Rng::seed_from_u64(params.seed);
    let workload: Vec<(u64, bool)> = (0..params.ops)
        .map(|_| (rng.gen_range(0..params.blocks), !rng.gen_bool(params.read_ratio)))
        .collect();
    let key = MasterKey::generate();

    // --- Path ORAM ---
    let geometry = SealedPathOram::geometry(&config)?;
    let store = open(&params, "bench-path", geometry, params.inject_slowdown).await?;
    let sealer = CellSealer::new(&key, StoreId::random(), 0);
    let oram = PathOram::with_seed(config.clone(), params.seed);
    let mut client = SealedPathOram::with_oram(oram, store.clone(), sealer)?;
    let fill_start = Instant::now();
    if params.fill {
        let pb = bar(geometry.cell_count(), "filling ORAM", params.progress);
        client.bulk_load(|b| block_data(b.0, bs), |done, _| pb.set_position(done)).await?;
        pb.finish_and_clear();
    }
    let fill_seconds = fill_start.elapsed().as_secs_f64();
    store.reset();

    let pb = bar(params.ops, "Path ORAM", params.progress);
    let mut latencies = Vec::with_capacity(workload.len());
    let mut trusted = client.trusted_bytes();
    let start = Instant::now();
    for (i, &(b, write)) in workload.iter().enumerate() {
        let t = Instant::now();
        let op = if write { Op::Write(block_data(b ^ 0xA5, bs)) } else { Op::Read };
        client.access(BlockId(b), op).await?;
        latencies.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
        if i % 64 == 0 {
            trusted = trusted.max(client.trusted_bytes());
            pb.set_position(i as u64);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    pb.finish_and_clear();
    trusted = trusted.max(client.trusted_bytes());
    let counts = store.counts();
    let stats = client.oram().stats().clone();
    drop(client);
    drop(store);

    // --- Baseline: sealed, no ORAM ---
    let dgeom = SealedDirect::geometry(params.blocks, params.block_size)?;
    let dstore = open(&params, "bench-direct", dgeom, None).await?;
    let direct = SealedDirect::new(
        dstore.clone(),
        CellSealer::new(&key, StoreId::random(), 0),
        params.block_size,
    )?;
    if params.fill {
        let pb = bar(params.blocks, "filling baseline", params.progress);
        for b in 0..params.blocks {
            direct.write(BlockId(b), block_data(b, bs)).await?;
            if b % 1024 == 0 {
                pb.set_position(b);
            }
        }
        pb.finish_and_clear();
    }
    dstore.reset();
    let pb = bar(params.ops, "baseline", params.progress);
    let start = Instant::now();
    for (i, &(b, write)) in workload.iter().enumerate() {
        if write {
            direct.write(BlockId(b), block_data(b ^ 0xA5, bs)).await?;
        } else {
            direct.read(BlockId(b)).await?;
        }
        if i % 256 == 0 {
            pb.set_position(i as u64);
        }
    }
    let baseline_elapsed = start.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let dcounts = dstore.counts();
    drop(direct);
    drop(dstore);

    // --- The floor, on the same store and link, at the ORAM's cell size ---
    let limits = crate::floor::measure(
        &FloorParams::new(geometry.cell_size())
            .with_store(&params.store)
            .with_link(link(&params))
            .with_array(geometry.cell_count()),
    )
    .await?;

    latencies.sort_unstable();
    let ops = params.ops as f64;
    let ops_per_sec = ops / elapsed;
    let baseline_ops_per_sec = ops / baseline_elapsed;
    let physical = (counts.bytes_up() + counts.bytes_down()) as f64 / ops;
    let dataset_bytes = params.blocks * u64::from(params.block_size);
    let side = |c: &blindfold_store::Counts, rate: f64| {
        Floor::of(&limits, &PerOp::from_counts(c, params.ops, RoundTrips::Measured, 1, 1), rate)
    };
    let floor = FloorReport {
        engine: side(&counts, ops_per_sec),
        baseline: Some(side(&dcounts, baseline_ops_per_sec)),
        limits,
    };
    Ok(PathReport {
        scheme: "path",
        machine: Machine::current(),
        ops_per_sec,
        mb_per_sec: ops_per_sec * bs as f64 / 1e6,
        mean_latency_us: latencies.iter().map(|&l| f64::from(l)).sum::<f64>() / ops,
        p50_latency_us: percentile(&latencies, 0.5),
        p99_latency_us: percentile(&latencies, 0.99),
        physical_bytes_per_op: physical,
        bytes_up_per_op: counts.bytes_up() as f64 / ops,
        bytes_down_per_op: counts.bytes_down() as f64 / ops,
        blowup: physical / bs as f64,
        round_trips_per_op: counts.round_trips as f64 / ops,
        max_stash: stats.max_stash,
        mean_stash: stats.mean_stash(),
        trusted_bytes: trusted,
        outsource_ratio: trusted as f64 / dataset_bytes as f64,
        peak_rss_bytes: peak_rss_bytes(),
        dataset_bytes,
        server_bytes: geometry.total_bytes(),
        fill_seconds,
        baseline_ops_per_sec,
        baseline_physical_bytes_per_op: (dcounts.bytes_up() + dcounts.bytes_down()) as f64 / ops,
        slowdown: baseline_ops_per_sec / ops_per_sec,
        cost: crate::cost::compare(
            &params.prices,
            &crate::cost::Usage::from_counts(&counts, params.ops, geometry.total_bytes()),
            &crate::cost::Usage::from_counts(&dcounts, params.ops, dgeom.total_bytes()),
            dataset_bytes,
        ),
        floor,
        params,
    })
}

/// The report as a human-readable table.
pub fn render(r: &PathReport) -> String {
    let p = &r.params;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let mut s = String::new();
    let mut line = |k: &str, v: String| s.push_str(&format!("  {k:<34} {v}\n"));
    line("machine", r.machine.summary());
    line(
        "parameters",
        format!(
            "{} blocks × {} B, Z={}, cache {} levels, posmap {}, {} ops, {:.0}% reads, store {}{}",
            p.blocks,
            p.block_size,
            p.z,
            p.cache_levels,
            p.recursive.map_or("in memory".to_string(), |m| format!("recursive (≤{m} in memory)")),
            p.ops,
            p.read_ratio * 100.0,
            p.store,
            match (p.rtt_ms, p.bandwidth_mbit) {
                (Some(rtt), Some(bw)) => format!(", link {rtt} ms / {bw} Mbit/s"),
                (Some(rtt), None) => format!(", link {rtt} ms"),
                _ => String::new(),
            }
        ),
    );
    line("Path ORAM ops/s", format!("{:.0}", r.ops_per_sec));
    line("Path ORAM logical MB/s", format!("{:.2}", r.mb_per_sec));
    line(
        "latency mean / p50 / p99",
        format!("{:.0} / {:.0} / {:.0} µs", r.mean_latency_us, r.p50_latency_us, r.p99_latency_us),
    );
    line(
        "physical bytes per access",
        format!(
            "{:.0} ({:.0} up, {:.0} down)",
            r.physical_bytes_per_op, r.bytes_up_per_op, r.bytes_down_per_op
        ),
    );
    line("bandwidth blow-up", format!("{:.1}×", r.blowup));
    line("round trips per access", format!("{:.1}", r.round_trips_per_op));
    line("stash max / mean", format!("{} / {:.2} blocks", r.max_stash, r.mean_stash));
    line(
        "trusted memory (peak)",
        format!("{:.2} MiB (outsource ratio {:.4})", mib(r.trusted_bytes), r.outsource_ratio),
    );
    line(
        "server storage / dataset",
        format!("{:.2}×", r.server_bytes as f64 / r.dataset_bytes as f64),
    );
    line("process peak RSS", format!("{:.0} MiB", mib(r.peak_rss_bytes)));
    line("fill (bulk load)", format!("{:.1} s", r.fill_seconds));
    line("baseline (sealed, no ORAM) ops/s", format!("{:.0}", r.baseline_ops_per_sec));
    line("baseline bytes per access", format!("{:.0}", r.baseline_physical_bytes_per_op));
    line("slowdown vs baseline", format!("{:.1}×", r.slowdown));
    s.push_str(&r.floor.render(34));
    s.push_str(&crate::cost::render(&r.cost));
    s
}
