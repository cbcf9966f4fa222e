//! `blindfold bench concurrency`: the TaoStore-style engine under many concurrent clients, as
//! in seed 000's evaluation (throughput and response time by number of clients and write-back
//! interval k), against sequential Path ORAM over the same emulated link in the same run.
//!
//! Each point runs closed-loop clients (each issues its next request when the previous reply
//! arrives) for a fixed time on uniformly random blocks, half reads and half writes, over a
//! [`LatencyStore`] (default 50 ms round trip, unlimited bandwidth) in front of a memory store
//! filled by a bulk load. The engine's trusted state is flushed and exported after each point
//! and imported for the next, so every point starts from the same full tree.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use blindfold_crypto::{CellSealer, MasterKey, StoreId};
use blindfold_oram::{BlockId, Op};
use blindfold_proxy::{SealedPathOram, SealedPathState, TaoConfig, TaoOram, TaoState};
use blindfold_store::{
    CountingStore, Counts, LatencyStore, LinkConfig, MemoryStore, Store, StoreUrl,
};
use rand::{Rng, SeedableRng};
use rand_chacha::{ChaCha20Rng, ChaCha8Rng};
use serde::Serialize;
use tokio::time::Instant;

use crate::floor::{Floor, FloorParams, Limits, PerOp, RoundTrips};
use crate::machine::{peak_rss_bytes, Machine};
use crate::plots::{line_plot, Series};
use crate::progress::bar;

/// Parameters of the concurrency benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct ConcurrencyBench {
    /// Logical data set in MiB (blocks = dataset / block size).
    pub dataset_mib: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// Numbers of concurrent clients to measure.
    pub clients: Vec<usize>,
    /// Write-back intervals k to measure.
    pub ks: Vec<usize>,
    /// Measured seconds per point (after a warm-up of a fifth of it, at most one second).
    pub seconds: f64,
    /// Round-trip time of the emulated link, ms.
    pub rtt_ms: u64,
    /// Bandwidth of the emulated link (each way), Mbit/s; unlimited if `None`.
    pub mbit: Option<u64>,
    /// Share of reads.
    pub read_ratio: f64,
    /// Also measure sequential Path ORAM (the baseline) at each client count.
    pub baseline: bool,
    /// Seed of the workload and the engines.
    pub seed: u64,
    /// A reduced run (`--quick`).
    pub quick: bool,
    /// Also measure the gateway's durable TaoStore engine (its redo log, reveal records and
    /// commits: a write returns once committed) at each client count, once per durability
    /// given (`--durability local,store`), each filled the same way; empty: not measured.
    pub durability: Vec<blindfold_gateway::server::Durability>,
    /// Test hook (`bench regress --inject-slowdown`): makes the concurrent engine about this
    /// many times slower ([`crate::slow::SlowStore`] on its store), never sequential Path
    /// ORAM. `None` in every real measurement.
    pub inject_slowdown: Option<f64>,
    /// Draw progress bars.
    #[serde(skip)]
    pub progress: bool,
}

impl Default for ConcurrencyBench {
    fn default() -> Self {
        Self {
            dataset_mib: 1024,
            block_size: 4096,
            clients: vec![10, 20, 30, 40, 50, 60, 100, 200, 500, 1000],
            ks: vec![40, 80, 160, 240],
            seconds: 10.0,
            rtt_ms: 50,
            mbit: None,
            read_ratio: 0.5,
            baseline: true,
            seed: 1,
            quick: false,
            durability: Vec::new(),
            inject_slowdown: None,
            progress: true,
        }
    }
}

impl ConcurrencyBench {
    /// A run of well under five minutes: 64 MiB of data, four client counts, two values of k,
    /// three seconds per point.
    pub fn quick() -> Self {
        Self {
            dataset_mib: 64,
            clients: vec![10, 30, 100, 500],
            ks: vec![40, 160],
            seconds: 3.0,
            quick: true,
            ..Self::default()
        }
    }
}

/// One measured point.
#[derive(Clone, Debug, Serialize)]
pub struct ConcurrencyRow {
    /// `tao` (the concurrent engine) or `path` (sequential Path ORAM, the baseline).
    pub engine: String,
    /// Concurrent closed-loop clients.
    pub clients: usize,
    /// Write-back interval (0 for the baseline).
    pub k: usize,
    /// Requests completed in the measured window.
    pub ops: u64,
    /// Requests per second.
    pub ops_per_sec: f64,
    /// Mean response time (request to reply), ms.
    pub mean_response_ms: f64,
    /// Median response time, ms.
    pub p50_response_ms: f64,
    /// 99th percentile response time, ms.
    pub p99_response_ms: f64,
    /// Largest trusted memory seen during the point (position map, stash, subtree, versions).
    pub trusted_bytes: u64,
    /// Trusted memory over the logical data set.
    pub outsource_ratio: f64,
    /// Bytes the store holds over the logical data set.
    pub server_storage_ratio: f64,
    /// Throughput over the baseline's at the same number of clients (1 for the baseline).
    pub speedup: Option<f64>,
    /// Fake reads (engine only).
    pub fake_reads: u64,
    /// Write-backs completed (engine only).
    pub write_backs: u64,
    /// Largest subtree, buckets (engine only).
    pub max_subtree: usize,
    /// Largest stash, blocks.
    pub max_stash: usize,
    /// The floor this machine sets for the point's bytes and round trips (the baseline waits
    /// for every store call in turn, one client at a time; the engine's requests need at
    /// least one round trip each, overlapped across the clients), and the share reached.
    pub floor: Option<Floor>,
}

/// Results of a run.
#[derive(Clone, Debug, Serialize)]
pub struct ConcurrencyReport {
    /// Parameters.
    pub params: ConcurrencyBench,
    /// Logical blocks.
    pub blocks: u64,
    /// Logical data set, bytes.
    pub dataset_bytes: u64,
    /// Bytes the store holds (cells × cell size).
    pub server_bytes: u64,
    /// One row per point.
    pub rows: Vec<ConcurrencyRow>,
    /// Peak resident memory of the process, bytes.
    pub peak_rss_bytes: u64,
    /// Where it ran.
    pub machine: Machine,
    /// This machine's limits (memory store, the emulated link), measured in this run.
    pub floor_limits: Limits,
}

fn block_data(id: u64, size: usize) -> Vec<u8> {
    let mut v = vec![0u8; size];
    v[..8].copy_from_slice(&id.to_le_bytes());
    v
}

enum Target {
    Tao(Arc<TaoOram>),
    Path(Arc<tokio::sync::Mutex<SealedPathOram>>),
    /// The gateway's durable engine: a write returns once a commit covers it.
    Durable(Arc<dyn blindfold_proxy::SharedEngine>),
}

impl Target {
    /// One request; `false` if the deadline passed before it could start (the sequential
    /// baseline queues clients on a lock, and a queue of a thousand would take minutes to
    /// drain after the deadline).
    async fn access(&self, block: BlockId, op: Op, deadline: Instant) -> Result<bool> {
        match self {
            Target::Tao(t) => t.access(block, op).await.map(drop)?,
            Target::Durable(e) => match op {
                Op::Read => e.read_many(&[block]).await.map(drop)?,
                Op::Write(data) => {
                    e.write_many(vec![(block, data)]).await?;
                    e.commit().await?;
                }
            },
            Target::Path(p) => {
                let Ok(mut oram) = tokio::time::timeout_at(deadline, p.lock()).await else {
                    return Ok(false);
                };
                oram.access(block, op).await.map(drop)?
            }
        }
        Ok(true)
    }

    async fn trusted_bytes(&self) -> u64 {
        match self {
            Target::Tao(t) => t.trusted_bytes(),
            Target::Durable(e) => e.gauges().trusted_bytes,
            Target::Path(p) => p.lock().await.trusted_bytes(),
        }
    }
}

struct Measured {
    /// Requests completed in the measured window.
    ops: u64,
    /// Requests completed in the whole point, warm-up included (what the store counts cover).
    completed: u64,
    ops_per_sec: f64,
    latencies_us: Vec<u64>,
    trusted_max: u64,
}

/// Runs `clients` closed-loop clients against `target` for `warmup + seconds`.
async fn drive(
    target: Arc<Target>,
    clients: usize,
    params: &ConcurrencyBench,
    blocks: u64,
    seed: u64,
) -> Result<Measured> {
    let measured = Duration::from_secs_f64(params.seconds);
    let warmup = (measured / 5).min(Duration::from_secs(1));
    let start = Instant::now();
    let (from, until) = (start + warmup, start + warmup + measured);
    let size = params.block_size as usize;
    let read_ratio = params.read_ratio;
    let mut tasks = Vec::with_capacity(clients);
    for c in 0..clients {
        let target = Arc::clone(&target);
        tasks.push(tokio::spawn(async move {
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ ((c as u64) << 20));
            let mut lat = Vec::new();
            let mut completed = 0u64;
            while Instant::now() < until {
                let block = rng.gen_range(0..blocks);
                let op = if rng.gen_bool(read_ratio) {
                    Op::Read
                } else {
                    Op::Write(block_data(rng.gen(), size))
                };
                let t0 = Instant::now();
                if !target.access(BlockId(block), op, until).await? {
                    break;
                }
                let t1 = Instant::now();
                completed += 1;
                if t1 >= from && t1 <= until {
                    lat.push((t1 - t0).as_micros() as u64);
                }
            }
            anyhow::Ok((lat, completed))
        }));
    }
    let sampler = {
        let target = Arc::clone(&target);
        tokio::spawn(async move {
            let mut max = 0;
            while Instant::now() < until {
                max = max.max(target.trusted_bytes().await);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            max
        })
    };
    let mut latencies_us = Vec::new();
    let mut completed = 0;
    for t in tasks {
        let (lat, n) = t.await.context("client task")??;
        latencies_us.extend(lat);
        completed += n;
    }
    let trusted_max = sampler.await.context("sampler task")?;
    latencies_us.sort_unstable();
    let ops = latencies_us.len() as u64;
    Ok(Measured {
        ops,
        completed,
        ops_per_sec: ops as f64 / measured.as_secs_f64(),
        latencies_us,
        trusted_max,
    })
}

/// A row's throughput over the baseline's at the same number of clients, if measured.
fn speedup(rows: &[ConcurrencyRow], r: &ConcurrencyRow) -> Option<f64> {
    rows.iter()
        .find(|b| b.engine == "path" && b.clients == r.clients)
        .filter(|b| b.ops_per_sec > 0.0)
        .map(|b| r.ops_per_sec / b.ops_per_sec)
}

fn percentile_ms(sorted_us: &[u64], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let i = ((sorted_us.len() - 1) as f64 * p).round() as usize;
    sorted_us[i] as f64 / 1000.0
}

fn mean_ms(us: &[u64]) -> f64 {
    if us.is_empty() {
        0.0
    } else {
        us.iter().sum::<u64>() as f64 / us.len() as f64 / 1000.0
    }
}

/// Runs the benchmark (inside a multi-threaded tokio runtime).
pub async fn run(params: ConcurrencyBench) -> Result<ConcurrencyReport> {
    anyhow::ensure!(params.block_size >= 8, "blocks must be at least 8 bytes");
    anyhow::ensure!(!params.clients.is_empty() && !params.ks.is_empty(), "nothing to measure");
    let blocks = (params.dataset_mib << 20) / u64::from(params.block_size);
    anyhow::ensure!(blocks > 0, "the data set holds no block");
    let base_config = TaoConfig::builder(blocks, params.block_size).build()?;
    let geometry = base_config.geometry()?;
    let link = match params.mbit {
        Some(m) => LinkConfig::wan(params.rtt_ms, m),
        None => LinkConfig::unlimited(Duration::from_millis(params.rtt_ms)),
    };
    link.validate()?;
    let key = MasterKey::generate();
    let dataset_bytes = blocks * u64::from(params.block_size);
    let server_bytes = geometry.total_bytes();
    let mut rows = Vec::new();
    let points = params.clients.len()
        * (params.ks.len() + usize::from(params.baseline) + params.durability.len());
    let pb = bar(points as u64, "concurrency", params.progress);

    // Fills a fresh memory store with every block through Path ORAM's bulk load.
    let fill = |what: &'static str| {
        let key = &key;
        let tree = base_config.tree().clone();
        let progress = params.progress;
        async move {
            let memory: Arc<dyn Store> = Arc::new(MemoryStore::new(geometry));
            let id = StoreId::random();
            let mut path =
                SealedPathOram::new(tree, Arc::clone(&memory), CellSealer::new(key, id, 0))?;
            let fill_bar = bar(geometry.cell_count(), what, progress);
            path.bulk_load(
                |b| block_data(b.0, params.block_size as usize),
                |done, _| fill_bar.set_position(done),
            )
            .await?;
            fill_bar.finish_and_clear();
            anyhow::Ok((memory, id, path.export_state()?))
        }
    };
    let row = |engine: &str, clients: usize, k: usize, m: &Measured| ConcurrencyRow {
        engine: engine.into(),
        clients,
        k,
        ops: m.ops,
        ops_per_sec: m.ops_per_sec,
        mean_response_ms: mean_ms(&m.latencies_us),
        p50_response_ms: percentile_ms(&m.latencies_us, 0.5),
        p99_response_ms: percentile_ms(&m.latencies_us, 0.99),
        trusted_bytes: m.trusted_max,
        outsource_ratio: m.trusted_max as f64 / dataset_bytes as f64,
        server_storage_ratio: server_bytes as f64 / dataset_bytes as f64,
        speedup: None,
        fake_reads: 0,
        write_backs: 0,
        max_subtree: 0,
        max_stash: 0,
        floor: None,
    };
    let limits = crate::floor::measure(
        &FloorParams::new(geometry.cell_size())
            .with_store(&StoreUrl::Memory)
            .with_link(Some(link))
            .with_array(geometry.cell_count()),
    )
    .await?;
    let floor = |c: &Counts, m: &Measured, round_trips: RoundTrips, in_flight: usize| {
        let op = PerOp::from_counts(c, m.completed, round_trips, in_flight, limits.cores);
        Some(Floor::of(&limits, &op, m.ops_per_sec))
    };
    let mut epoch = 1u32;

    if params.baseline {
        let (memory, id, mut state): (_, _, SealedPathState) = fill("filling baseline").await?;
        for &clients in &params.clients {
            pb.set_message(format!("path ×{clients}"));
            let counting =
                Arc::new(CountingStore::new(LatencyStore::new(Arc::clone(&memory), link)));
            let store: Arc<dyn Store> = Arc::clone(&counting) as Arc<dyn Store>;
            let rng = ChaCha20Rng::seed_from_u64(params.seed ^ u64::from(epoch));
            let oram =
                SealedPathOram::from_state(state, store, CellSealer::new(&key, id, epoch), rng)?;
            epoch += 1;
            let shared = Arc::new(tokio::sync::Mutex::new(oram));
            let target = Arc::new(Target::Path(Arc::clone(&shared)));
            let m = drive(target, clients, &params, blocks, params.seed).await?;
            let oram = shared.lock().await;
            let mut r = row("path", clients, 0, &m);
            r.max_stash = oram.oram().stats().max_stash;
            r.speedup = Some(1.0);
            r.floor = floor(&counting.counts(), &m, RoundTrips::Measured, 1);
            rows.push(r);
            state = oram.export_state()?;
            pb.inc(1);
        }
    }

    let (memory, id, path_state) = fill("filling engine").await?;
    let mut linked: Arc<dyn Store> = Arc::new(LatencyStore::new(Arc::clone(&memory), link));
    if let Some(factor) = params.inject_slowdown {
        linked = Arc::new(crate::slow::SlowStore::new(linked, factor)?);
    }
    let counting = Arc::new(CountingStore::new(linked));
    let store: Arc<dyn Store> = Arc::clone(&counting) as Arc<dyn Store>;
    let first = TaoOram::from_path_state(
        base_config.clone(),
        path_state,
        Arc::clone(&store),
        CellSealer::new(&key, id, epoch),
        ChaCha20Rng::seed_from_u64(params.seed),
    )?;
    epoch += 1;
    let mut state: TaoState = first.export_state()?;
    drop(first);
    for &k in &params.ks {
        for &clients in &params.clients {
            pb.set_message(format!("tao k={k} ×{clients}"));
            let mut s = state;
            s.config = s.config.with_write_back_every(k)?;
            s.stats = Default::default();
            let rng = ChaCha20Rng::seed_from_u64(params.seed ^ (u64::from(epoch) << 8));
            let oram = Arc::new(TaoOram::from_state(
                s,
                Arc::clone(&store),
                CellSealer::new(&key, id, epoch),
                rng,
            )?);
            epoch += 1;
            let before = counting.counts();
            let m = drive(
                Arc::new(Target::Tao(Arc::clone(&oram))),
                clients,
                &params,
                blocks,
                params.seed,
            )
            .await?;
            oram.flush().await?;
            let c = counting.counts().since(&before);
            let stats = oram.stats();
            let mut r = row("tao", clients, k, &m);
            r.fake_reads = stats.fake_reads;
            r.write_backs = stats.write_backs;
            r.max_subtree = stats.max_subtree;
            r.max_stash = stats.max_stash;
            r.floor = floor(&c, &m, RoundTrips::AtLeast(1.0), clients);
            r.speedup = speedup(&rows, &r);
            rows.push(r);
            state = oram.export_state()?;
            pb.inc(1);
        }
    }
    for &durability in &params.durability {
        let name = durability_name(durability);
        let (opened, _dir) = open_durable(&params, durability, dataset_bytes).await?;
        let engine = Arc::clone(opened.objects.engine());
        fill_durable(&engine, blocks, params.block_size as usize, params.progress, name).await?;
        for &clients in &params.clients {
            pb.set_message(format!("tao {name} ×{clients}"));
            let m = drive(
                Arc::new(Target::Durable(Arc::clone(&engine))),
                clients,
                &params,
                blocks,
                params.seed,
            )
            .await?;
            engine.commit().await?;
            let mut r = row(&format!("tao-{name}"), clients, 0, &m);
            r.speedup = speedup(&rows, &r);
            rows.push(r);
            pb.inc(1);
        }
        opened.objects.shutdown().await?;
    }
    pb.finish_and_clear();
    Ok(ConcurrencyReport {
        params,
        blocks,
        dataset_bytes,
        server_bytes,
        rows,
        peak_rss_bytes: peak_rss_bytes(),
        machine: Machine::current(),
        floor_limits: limits,
    })
}

fn durability_name(d: blindfold_gateway::server::Durability) -> &'static str {
    use blindfold_gateway::server::Durability;
    match d {
        Durability::Auto => "auto",
        Durability::Local => "local",
        Durability::Store => "store",
    }
}

/// The gateway's engine (`tao`, its default cache) in a fresh data directory, on a memory
/// store behind the benchmark's link, keeping its writes as `durability` says.
async fn open_durable(
    params: &ConcurrencyBench,
    durability: blindfold_gateway::server::Durability,
    dataset_bytes: u64,
) -> Result<(blindfold_gateway::server::Opened, tempfile::TempDir)> {
    let dir = tempfile::tempdir().context("a data directory")?;
    let setup = crate::gateway::LiveSetup {
        store: StoreUrl::Memory,
        data_dir: dir.path().to_path_buf(),
        capacity: dataset_bytes,
        block_size: params.block_size,
        cache_mib: blindfold_gateway::server::DEFAULT_CACHE_MIB,
        engine: blindfold_proxy::OramEngine::Tao,
        kind: blindfold_gateway::server::EngineKind::PathOram,
        in_place: false,
        pack_levels: 1,
        durability,
        reads_ahead_of_log: false,
        standby: false,
        rtt_ms: params.rtt_ms,
        mbit: params.mbit,
        slowdown: None,
    };
    let (opened, _) = crate::gateway::open_live(setup).await?;
    Ok((opened, dir))
}

/// Writes every block once through `engine` (batches in flight side by side), then commits.
async fn fill_durable(
    engine: &Arc<dyn blindfold_proxy::SharedEngine>,
    blocks: u64,
    size: usize,
    progress: bool,
    name: &str,
) -> Result<()> {
    use futures::StreamExt as _;
    let batch = engine.batch_blocks().max(1) as u64;
    let fill_bar = bar(blocks, &format!("filling tao ({name})"), progress);
    let starts: Vec<u64> = (0..blocks).step_by(batch as usize).collect();
    let mut writes = futures::stream::iter(starts)
        .map(|from| {
            let engine = Arc::clone(engine);
            async move {
                let to = (from + batch).min(blocks);
                let data = (from..to).map(|b| (BlockId(b), block_data(b, size))).collect();
                engine.write_many(data).await.map(|()| to - from)
            }
        })
        .buffer_unordered(16);
    while let Some(done) = writes.next().await {
        fill_bar.inc(done?);
    }
    engine.commit().await?;
    fill_bar.finish_and_clear();
    Ok(())
}

/// The report as a table.
pub fn render(r: &ConcurrencyReport) -> String {
    let p = &r.params;
    let mut s = String::new();
    let _ = writeln!(s, "blindfold bench concurrency{}", if p.quick { " --quick" } else { "" });
    let _ = writeln!(s, "  machine: {}", r.machine.summary());
    let _ = writeln!(
        s,
        "  data set: {} MiB ({} blocks of {} B){}; store holds {:.1} MiB ({:.2}× the data)",
        p.dataset_mib,
        r.blocks,
        p.block_size,
        if p.quick { " — reduced for --quick" } else { "" },
        r.server_bytes as f64 / (1u64 << 20) as f64,
        r.server_bytes as f64 / r.dataset_bytes as f64,
    );
    let link = match p.mbit {
        Some(m) => format!("{m} Mbit/s"),
        None => "unlimited bandwidth".into(),
    };
    let _ = writeln!(
        s,
        "  link: {} ms round trip, {link}; closed-loop clients, {:.0}% reads, {} s per point",
        p.rtt_ms,
        p.read_ratio * 100.0,
        p.seconds
    );
    let _ = writeln!(
        s,
        "\n  {:<9} {:>7} {:>5} {:>10} {:>9} {:>9} {:>9} {:>11} {:>9} {:>8} {:>8} {:>8} {:>10} {:>8}",
        "engine",
        "clients",
        "k",
        "ops/s",
        "mean ms",
        "p50 ms",
        "p99 ms",
        "trusted",
        "trust/ds",
        "speedup",
        "subtree",
        "stash",
        "floor",
        "% floor"
    );
    for x in &r.rows {
        let _ = writeln!(
            s,
            "  {:<9} {:>7} {:>5} {:>10.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}Mi {:>8.4}% {:>8} {:>8} {:>8} {:>10} {:>8}",
            x.engine,
            x.clients,
            if x.k == 0 { "-".to_string() } else { x.k.to_string() },
            x.ops_per_sec,
            x.mean_response_ms,
            x.p50_response_ms,
            x.p99_response_ms,
            x.trusted_bytes as f64 / (1u64 << 20) as f64,
            x.outsource_ratio * 100.0,
            x.speedup.map_or("-".into(), |v| format!("{v:.1}×")),
            x.max_subtree,
            x.max_stash,
            x.floor.as_ref().map_or("-".into(), |f| format!("{:.0} {}", f.ops_per_sec, f.bound)),
            x.floor.as_ref().map_or("-".into(), |f| format!("{:.1}%", f.of_floor * 100.0)),
        );
    }
    let best = r
        .rows
        .iter()
        .filter(|x| x.engine == "tao")
        .max_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec));
    if let Some(b) = best {
        let _ = writeln!(
            s,
            "\n  peak: {:.0} ops/s at {} clients, k = {} (target ≥ 4300 ops/s)",
            b.ops_per_sec, b.clients, b.k
        );
    }
    for x in r.rows.iter().filter(|x| x.engine == "tao" && x.clients == 30) {
        let _ = writeln!(
            s,
            "  30 clients, k = {}: mean response {:.1} ms (target ≤ 60 ms at 50 ms RTT)",
            x.k, x.mean_response_ms
        );
    }
    // The durable engine: what keeping writes in the store costs against keeping them in the
    // data directory, at each client count measured with both.
    for local in r.rows.iter().filter(|x| x.engine == "tao-local") {
        if let Some(store) =
            r.rows.iter().find(|x| x.engine == "tao-store" && x.clients == local.clients)
        {
            let _ = writeln!(
                s,
                "  durable tao, {} clients: --durability store {:.1} ops/s, {:.2} of local's {:.1} \
                 (mean {:.1} against {:.1} ms)",
                local.clients,
                store.ops_per_sec,
                if local.ops_per_sec > 0.0 { store.ops_per_sec / local.ops_per_sec } else { 0.0 },
                local.ops_per_sec,
                store.mean_response_ms,
                local.mean_response_ms
            );
        }
    }
    let _ = writeln!(s, "  peak RSS {:.0} MiB", r.peak_rss_bytes as f64 / (1u64 << 20) as f64);
    let l = &r.floor_limits;
    let _ = writeln!(
        s,
        "  floor: ops/s this machine allows the point's bytes and round trips (bound: cpu, \
         store, link or latency; docs/benchmarks.md); seal {:.2} / open {:.2} / copy {:.2} GB/s \
         per core at {} B cells, {} cores{}",
        l.seal_bytes_per_sec / 1e9,
        l.open_bytes_per_sec / 1e9,
        l.copy_bytes_per_sec / 1e9,
        l.cell_size,
        l.cores,
        crate::floor::store_summary(l).map_or(String::new(), |st| format!("; {st}"))
    );
    s
}

/// Writes `concurrency.csv` and the plots into `dir`; returns the files written.
pub fn save(r: &ConcurrencyReport, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut out = Vec::new();
    let mut csv = String::from(
        "engine,clients,k,ops,ops_per_sec,mean_response_ms,p50_response_ms,p99_response_ms,\
         trusted_bytes,outsource_ratio,server_storage_ratio,speedup,fake_reads,write_backs,\
         max_subtree,max_stash\n",
    );
    for x in &r.rows {
        let _ = writeln!(
            csv,
            "{},{},{},{},{:.3},{:.3},{:.3},{:.3},{},{:.6},{:.4},{},{},{},{},{}",
            x.engine,
            x.clients,
            x.k,
            x.ops,
            x.ops_per_sec,
            x.mean_response_ms,
            x.p50_response_ms,
            x.p99_response_ms,
            x.trusted_bytes,
            x.outsource_ratio,
            x.server_storage_ratio,
            x.speedup.map_or(String::new(), |v| format!("{v:.3}")),
            x.fake_reads,
            x.write_backs,
            x.max_subtree,
            x.max_stash
        );
    }
    let p = dir.join("concurrency.csv");
    std::fs::write(&p, csv).with_context(|| format!("writing {}", p.display()))?;
    out.push(p);
    let series = |g: fn(&ConcurrencyRow) -> f64| -> Vec<Series> {
        let mut v: Vec<Series> = r
            .params
            .ks
            .iter()
            .map(|&k| {
                let pts = r
                    .rows
                    .iter()
                    .filter(|x| x.engine == "tao" && x.k == k)
                    .map(|x| (x.clients as f64, g(x)))
                    .collect();
                (format!("TaoStore k={k}"), pts)
            })
            .collect();
        let base: Vec<_> = r
            .rows
            .iter()
            .filter(|x| x.engine == "path")
            .map(|x| (x.clients as f64, g(x)))
            .collect();
        if !base.is_empty() {
            v.push(("Path ORAM (sequential)".into(), base));
        }
        v
    };
    let p = dir.join("throughput-by-clients.svg");
    line_plot(
        &p,
        "Throughput by number of clients",
        "clients",
        "ops/s",
        &series(|x| x.ops_per_sec),
    )?;
    out.push(p);
    let p = dir.join("response-time-by-clients.svg");
    line_plot(
        &p,
        "Mean response time by number of clients",
        "clients",
        "ms",
        &series(|x| x.mean_response_ms),
    )?;
    out.push(p);
    Ok(out)
}
