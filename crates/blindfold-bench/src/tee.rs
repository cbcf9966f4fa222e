//! `blindfold bench tee`: the TEE-assisted engine beside seed 004's Tables I–III.
//!
//! As in the paper, one client runs a closed loop — draw a block uniformly at random, query it
//! through the gateway, wait for the answer, draw the next — and we report the best and the
//! average query latency and the throughput (bytes queried per second). The trusted component
//! and its untrusted host run as their own process (`blindfold storage-server --enclave-key`,
//! cells in files), the gateway in this one; they talk over loopback.
//!
//! The store is bulk loaded with every block first (the paper's "outsourced data"). Its size is
//! 3.5 to 7 times the data (two areas per node, and each node keeps room for the reads
//! between two of its evictions: 3.5 at 1 GiB of 1 KiB blocks, 7 at 2 GiB, whose tree needs
//! a fifth layer of small leaves), so the paper's larger sizes are scaled down to what this
//! machine's disk holds; the report says which.
//!
//! * "best" latency: the mean over the queries that were served at once — that neither waited
//!   for an eviction round to make room nor for a reshuffle (a query may run while a round is
//!   in flight: the paper's "in parallel with an ongoing eviction");
//! * "average": the mean over all queries.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use blindfold_crypto::{MasterKey, StoreId};
use blindfold_oram::tee::TeeOramConfig;
use blindfold_oram::BlockId;
use blindfold_proxy::DurableTee;
use blindfold_store::StoreUrl;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::machine::Machine;

/// Seed 004's figures: (data bytes, block size, best ms, average ms, KB/s).
#[allow(clippy::approx_constant)] // 3.14 ms is the paper's figure, not π
pub mod seed {
    const GB: u64 = 1_000_000_000;
    /// Table I: 1 KB blocks, data size varies.
    pub const TABLE_I: [(u64, u32, f64, f64, f64); 5] = [
        (GB, 1024, 0.54, 2.26, 453.81),
        (2 * GB, 1024, 0.63, 2.59, 395.13),
        (4 * GB, 1024, 0.66, 2.90, 353.59),
        (10 * GB, 1024, 0.86, 3.14, 325.98),
        (20 * GB, 1024, 0.88, 3.20, 319.20),
    ];
    /// Table II: 10 GB of data, block size varies.
    pub const TABLE_II: [(u64, u32, f64, f64, f64); 4] = [
        (10 * GB, 1024, 0.86, 3.14, 325.98),
        (10 * GB, 2048, 0.77, 4.96, 413.31),
        (10 * GB, 4096, 0.67, 6.93, 590.99),
        (10 * GB, 8192, 0.82, 12.16, 673.46),
    ];
    /// Table III: 2 million blocks, block size varies.
    pub const TABLE_III: [(u64, u32, f64, f64, f64); 4] = [
        (2_000_000 * 1024, 1024, 0.63, 2.59, 395.13),
        (2_000_000 * 2048, 2048, 0.61, 4.02, 509.10),
        (2_000_000 * 4096, 4096, 0.69, 6.90, 593.59),
        (2_000_000 * 8192, 8192, 0.74, 12.80, 640.18),
    ];
    /// Queries per eviction round in the paper (25 λ with λ = 32).
    pub const ROUND_QUERIES: u32 = 800;
}

/// A paper's row: (data bytes, best ms, average ms, KB/s).
pub type SeedRow = (u64, f64, f64, f64);

/// The target on 1 GB of 1 KiB blocks: throughput (bytes/s) and mean latency (ms).
pub const TARGET_BYTES_PER_S: f64 = 4.5e6;
/// See [`TARGET_BYTES_PER_S`].
pub const TARGET_MEAN_MS: f64 = 1.0;

/// Parameters.
#[derive(Clone, Debug, Serialize)]
pub struct TeeBench {
    /// Table I: data sizes (bytes), with 1 KiB blocks.
    pub data_sizes: Vec<u64>,
    /// Tables II and III: block sizes.
    pub block_sizes: Vec<u32>,
    /// Table II: the data size (the paper's 10 GB, scaled to this machine).
    pub table2_bytes: u64,
    /// Table III: the number of blocks (the paper's 2 million, scaled).
    pub table3_blocks: u64,
    /// Queries measured per configuration (the paper averaged about 10,000).
    pub queries: u64,
    /// Queries per eviction round (`k`; the paper's 800, ours by default
    /// [`blindfold_oram::tee::DEFAULT_ROUND_QUERIES`]).
    pub round_queries: u32,
    /// Arity of the tree (the paper's m = 8).
    pub arity: u32,
    /// Where the store's files go (a fresh directory per configuration, removed after).
    pub work_dir: PathBuf,
    /// The `blindfold` binary that runs the trusted component's host.
    pub server_bin: PathBuf,
    /// Which tables to run ("I", "II", "III").
    pub tables: Vec<String>,
    /// Seed of the client's block choices.
    pub seed: u64,
    /// Print progress.
    #[serde(skip)]
    pub progress: bool,
}

impl TeeBench {
    /// The default run (tens of minutes): Table I at 1, 2 and 4 GiB; Table II at 1 GiB (the
    /// paper's 10 GB would need 45 GB of store); Table III at 262,144 blocks (the paper's
    /// 2 million of 8 KiB would need 70 GB).
    pub fn full(work_dir: PathBuf, server_bin: PathBuf) -> Self {
        Self {
            data_sizes: vec![1 << 30, 2 << 30, 4 << 30],
            block_sizes: vec![1024, 2048, 4096, 8192],
            table2_bytes: 1 << 30,
            table3_blocks: 1 << 18,
            queries: 10_000,
            round_queries: blindfold_oram::tee::DEFAULT_ROUND_QUERIES,
            arity: 8,
            work_dir,
            server_bin,
            tables: vec!["I".into(), "II".into(), "III".into()],
            seed: 1,
            progress: true,
        }
    }

    /// A run of about a minute on toy sizes.
    pub fn quick(work_dir: PathBuf, server_bin: PathBuf) -> Self {
        Self {
            data_sizes: vec![8 << 20],
            block_sizes: vec![1024, 4096],
            table2_bytes: 8 << 20,
            table3_blocks: 4096,
            queries: 2_000,
            round_queries: 100,
            ..Self::full(work_dir, server_bin)
        }
    }
}

/// One measured configuration.
#[derive(Clone, Debug, Serialize)]
pub struct TeeRow {
    /// "I", "II" or "III".
    pub table: &'static str,
    /// Logical data, bytes.
    pub data_bytes: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// Blocks.
    pub blocks: u64,
    /// Mean latency of the queries served at once, ms.
    pub best_latency_ms: f64,
    /// Mean latency of all queries, ms.
    pub mean_latency_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_latency_ms: f64,
    /// Bytes queried per second, in KB/s (1 KB = 1000 bytes).
    pub throughput_kb_s: f64,
    /// Queries measured.
    pub queries: u64,
    /// Queries that waited for a round or a reshuffle.
    pub waited: u64,
    /// Eviction rounds and reshuffles during the measurement.
    pub rounds: u64,
    /// Reshuffles during the measurement.
    pub reshuffles: u64,
    /// Sealing and loading the store, seconds.
    pub setup_s: f64,
    /// Bytes the store holds.
    pub store_bytes: u64,
    /// Bytes of trusted state in the gateway.
    pub trusted_bytes: u64,
    /// The tree: layers, slots per node and leaf.
    pub layers: u32,
    /// Slots of a non-leaf node.
    pub node_slots: u32,
    /// Slots of a leaf.
    pub leaf_slots: u32,
    /// The paper's row this one stands for: (data bytes, best ms, average ms, KB/s).
    pub seed: Option<(u64, f64, f64, f64)>,
}

/// The result.
#[derive(Clone, Debug, Serialize)]
pub struct TeeReport {
    /// Where it ran.
    pub machine: Machine,
    /// Parameters.
    pub params: TeeBench,
    /// Every configuration.
    pub rows: Vec<TeeRow>,
    /// Whether the target (≥ 4.5 MB/s, ≤ 1 ms on 1 GiB of 1 KiB blocks) was measured and met.
    pub target_met: Option<bool>,
}

/// The trusted component's host, as a child process; killed on drop.
struct Host {
    child: Child,
    addr: String,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Host {
    fn start(bin: &Path, dir: &Path, auth: &Path, tee_key: &Path, block_size: u32) -> Result<Self> {
        let mut child = Command::new(bin)
            .args(["enclave", "--listen", "127.0.0.1:0", "--generate-auth-key"])
            // Rounds of the paper's 800 queries over 8 KiB blocks work on ~200 MiB at once.
            .args(["--max-frame-mib", "1024", "--connection-buffer-mib", "4096"])
            .arg("--enclave-block-size")
            .arg(block_size.to_string())
            .arg("--store")
            .arg(format!("file://{}", dir.display()))
            .arg("--auth-key-file")
            .arg(auth)
            .arg("--enclave-key")
            .arg(tee_key)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {} storage-server", bin.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let addr = line
            .split_whitespace()
            .skip_while(|w| *w != "on")
            .nth(1)
            .with_context(|| format!("the storage server said {line:?}, not its address"))?
            .to_string();
        Ok(Self { child, addr })
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| {
                    let m = e.metadata();
                    if m.as_ref().is_ok_and(|m| m.is_dir()) {
                        dir_bytes(&e.path())
                    } else {
                        m.map_or(0, |m| m.len())
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Disk space a configuration leaves free besides its store.
const DISK_SPARE: u64 = 2 << 30;

/// The tree of `blocks` blocks of `block_size` bytes at the benchmark's arity and round size.
fn tree(p: &TeeBench, blocks: u64, block_size: u32) -> Result<TeeOramConfig> {
    Ok(TeeOramConfig::builder(blocks, block_size)
        .arity(p.arity)
        .round_queries(p.round_queries)
        .build()?)
}

/// `blocks`, halved until the store of `blocks` blocks of `block_size` bytes fits the disk
/// under `--work-dir` (with [`DISK_SPARE`] left over); an error if not even 1,024 blocks fit.
fn fit_to_disk(p: &TeeBench, mut blocks: u64, block_size: u32) -> Result<u64> {
    let free = fs_free_bytes(&p.work_dir).saturating_sub(DISK_SPARE);
    loop {
        let need = DurableTee::geometry(&tree(p, blocks, block_size)?)?.total_bytes();
        if need <= free {
            return Ok(blocks);
        }
        if blocks / 2 < 1024 {
            bail!(
                "{blocks} blocks of {block_size} bytes need {:.1} GiB of store; {} has {:.1} GiB \
                 free besides {:.0} GiB to spare",
                need as f64 / (1u64 << 30) as f64,
                p.work_dir.display(),
                free as f64 / (1u64 << 30) as f64,
                DISK_SPARE as f64 / (1u64 << 30) as f64
            );
        }
        blocks /= 2;
    }
}

/// Runs `work` (one configuration's gateway side: the engine, its store client and the
/// client loop) on a runtime of its own, on one thread, as a gateway of one closed-loop client
/// needs: each query then wakes no other thread of this process (on a VM, where a wake-up
/// costs a trip through the hypervisor, that is a tenth of a query's time or more).
fn on_one_thread<T: Send, F: std::future::Future<Output = Result<T>>>(
    work: impl FnOnce() -> F + Send,
) -> Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("starting the gateway's runtime")?
                    .block_on(work())
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Runs one configuration.
async fn measure(
    p: &TeeBench,
    table: &'static str,
    blocks: u64,
    block_size: u32,
    seed_row: Option<(u64, f64, f64, f64)>,
) -> Result<TeeRow> {
    // `run` fitted `blocks` to the free disk with `fit_to_disk` just before.
    let config = tree(p, blocks, block_size)?;
    let geometry = DurableTee::geometry(&config)?;
    let run_dir = tempfile::Builder::new().prefix("bench-tee-").tempdir_in(&p.work_dir)?;
    let cells = run_dir.path().join("cells");
    std::fs::create_dir_all(&cells)?;
    let key = MasterKey::generate();
    let id = StoreId::random();
    let tee_key_path = run_dir.path().join("tee.key");
    DurableTee::tee_key(&key).write_new(&tee_key_path)?;
    let auth = run_dir.path().join("auth.key");
    let host = Host::start(&p.server_bin, &cells, &auth, &tee_key_path, block_size)?;
    let url: StoreUrl = format!("remote://{}?key_file={}", host.addr, auth.display()).parse()?;
    let store = blindfold_store::open_tee_store(&url, "tee", geometry, None).await?;
    let started = Instant::now();
    let mut last = Instant::now();
    let show = p.progress;
    let mut progress = |done: u64, total: u64| {
        if show && (last.elapsed() > Duration::from_secs(5) || done == total) {
            eprintln!("  sealing and loading: {done}/{total} cells");
            last = Instant::now();
        }
    };
    let fill = move |b: u64| {
        let mut d = vec![0u8; block_size as usize];
        d[..8].copy_from_slice(&b.to_le_bytes());
        d
    };
    let engine = DurableTee::create(
        &run_dir.path().join("state"),
        config.clone(),
        Arc::clone(&store),
        &key,
        id,
        blindfold_proxy::Preload { count: blocks, fill: &fill },
        &mut progress,
    )
    .await?;
    let setup_s = started.elapsed().as_secs_f64();
    let mut rng = ChaCha8Rng::seed_from_u64(p.seed);
    let before = engine.stats();
    let waits_before = engine.waits();
    let mut lat = Vec::with_capacity(p.queries as usize);
    let mut best = Vec::with_capacity(p.queries as usize);
    let t0 = Instant::now();
    for _ in 0..p.queries {
        let b = rng.gen_range(0..blocks);
        let w = engine.waits();
        let t = Instant::now();
        let data = engine.read(BlockId(b)).await?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        if data[..8] != b.to_le_bytes() {
            bail!("block {b} came back wrong");
        }
        lat.push(ms);
        if engine.waits() == w {
            best.push(ms);
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let after = engine.stats();
    engine.shutdown().await?;
    let store_bytes = dir_bytes(&cells);
    drop(host);
    let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    let mut sorted = lat.clone();
    sorted.sort_by(f64::total_cmp);
    let p99 = sorted.get((sorted.len() * 99 / 100).min(sorted.len().saturating_sub(1))).copied();
    Ok(TeeRow {
        table,
        data_bytes: blocks * u64::from(block_size),
        block_size,
        blocks,
        best_latency_ms: mean(&best),
        mean_latency_ms: mean(&lat),
        p99_latency_ms: p99.unwrap_or(0.0),
        throughput_kb_s: p.queries as f64 * f64::from(block_size) / wall / 1000.0,
        queries: p.queries,
        waited: engine.waits() - waits_before,
        rounds: after.oram.rounds - before.oram.rounds,
        reshuffles: after.oram.reshuffles - before.oram.reshuffles,
        setup_s,
        store_bytes,
        trusted_bytes: after.trusted_bytes,
        layers: config.layers(),
        node_slots: config.node_slots(),
        leaf_slots: config.leaf_slots(),
        seed: seed_row,
    })
}

#[cfg(unix)]
fn fs_free_bytes(dir: &Path) -> u64 {
    rustix::fs::statvfs(dir).map_or(u64::MAX, |s| s.f_bavail.saturating_mul(s.f_frsize))
}

#[cfg(not(unix))]
fn fs_free_bytes(_: &Path) -> u64 {
    u64::MAX
}

/// The seed's row nearest to `(data, block)` in `table`.
fn nearest(
    table: &[(u64, u32, f64, f64, f64)],
    data: u64,
    block: u32,
) -> Option<(u64, f64, f64, f64)> {
    table
        .iter()
        .filter(|r| r.1 == block)
        .min_by_key(|r| (r.0 as i128 - data as i128).unsigned_abs())
        .map(|r| (r.0, r.2, r.3, r.4))
}

/// Runs every configuration of the three tables.
pub async fn run(p: &TeeBench) -> Result<TeeReport> {
    if p.queries == 0 {
        bail!("--queries must be at least 1");
    }
    let mut plan: Vec<(&'static str, u64, u32, Option<SeedRow>)> = Vec::new();
    for &d in &p.data_sizes {
        plan.push(("I", d / 1024, 1024, nearest(&seed::TABLE_I, d, 1024)));
    }
    for &b in &p.block_sizes {
        plan.push(("II", p.table2_bytes / u64::from(b), b, nearest(&seed::TABLE_II, 0, b)));
    }
    for &b in &p.block_sizes {
        plan.push(("III", p.table3_blocks, b, nearest(&seed::TABLE_III, 0, b)));
    }
    plan.retain(|r| p.tables.iter().any(|t| t.eq_ignore_ascii_case(r.0)));
    if plan.is_empty() {
        bail!("no table to run: --tables takes I, II and III");
    }
    let total = plan.len();
    let mut rows = Vec::new();
    for (i, (table, wanted, bs, seed_row)) in plan.into_iter().enumerate() {
        // Each configuration's store is removed before the next one starts, so each is fitted
        // to what is free when it starts; the report says which ran smaller than the paper's.
        let blocks = fit_to_disk(p, wanted, bs)?;
        if blocks < wanted && p.progress {
            eprintln!(
                "Table {table}: {wanted} blocks of {bs} bytes do not fit the free disk under {}; \
                 running {blocks}",
                p.work_dir.display()
            );
        }
        if p.progress {
            eprintln!(
                "[{}/{}] Table {table}: {blocks} blocks of {bs} bytes ({:.2} GiB of data)",
                i + 1,
                total,
                (blocks * u64::from(bs)) as f64 / (1u64 << 30) as f64
            );
        }
        rows.push(on_one_thread(|| measure(p, table, blocks, bs, seed_row))?);
    }
    let target_met = rows
        .iter()
        .find(|r| r.table == "I" && r.data_bytes == 1 << 30 && r.block_size == 1024)
        .map(|r| {
            r.throughput_kb_s * 1000.0 >= TARGET_BYTES_PER_S && r.mean_latency_ms <= TARGET_MEAN_MS
        });
    Ok(TeeReport { machine: Machine::current(), params: p.clone(), rows, target_met })
}

fn human(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// The three tables, ours beside the paper's.
pub fn render(r: &TeeReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "TEE-assisted engine (Zhang, TEE and client gateway), closed-loop client, {}",
        r.machine.summary()
    );
    let _ = writeln!(
        out,
        "trusted component and host: their own process (storage-server --enclave-key), files; \
         gateway here; loopback"
    );
    let _ = writeln!(
        out,
        "rounds of {} queries (the paper's q = {}), arity {}",
        r.params.round_queries,
        seed::ROUND_QUERIES,
        r.params.arity
    );
    for (table, title) in [
        ("I", "Table I: 1 KiB blocks, data size varies"),
        ("II", "Table II: block size varies (paper: 10 GB of data)"),
        ("III", "Table III: block size varies (paper: 2 M blocks)"),
    ] {
        let rows: Vec<&TeeRow> = r.rows.iter().filter(|x| x.table == table).collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n{title}");
        let _ = writeln!(
            out,
            "{:>10} {:>6} | {:>9} {:>9} {:>11} | paper: {:>8} {:>8} {:>8} {:>9} | {:>6} {:>9}",
            "data",
            "block",
            "best ms",
            "avg ms",
            "KB/s",
            "data",
            "best",
            "avg",
            "KB/s",
            "×KB/s",
            "store"
        );
        for x in rows {
            let (sd, sb, sa, sk) = x.seed.unwrap_or((0, f64::NAN, f64::NAN, f64::NAN));
            let _ = writeln!(
                out,
                "{:>10} {:>6} | {:>9.3} {:>9.3} {:>11.1} | paper: {:>8} {:>8.2} {:>8.2} {:>9.2} | {:>6.1} {:>9}",
                human(x.data_bytes),
                x.block_size,
                x.best_latency_ms,
                x.mean_latency_ms,
                x.throughput_kb_s,
                if sd >= 1_000_000_000 { format!("{} GB", sd / 1_000_000_000) } else { format!("{sd}") },
                sb,
                sa,
                sk,
                x.throughput_kb_s / sk,
                human(x.store_bytes)
            );
        }
    }
    let scaled: Vec<String> = r
        .rows
        .iter()
        .filter_map(|x| x.seed.filter(|s| (x.data_bytes as f64) < 0.9 * s.0 as f64).map(|s| (x, s)))
        .map(|(x, s)| format!("{} for the paper's {:.1} GB", human(x.data_bytes), s.0 as f64 / 1e9))
        .collect();
    if !scaled.is_empty() {
        let _ =
            writeln!(out, "\nscaled down to this machine's disk and time: {}", scaled.join("; "));
    }
    match r.target_met {
        Some(met) => {
            let _ = writeln!(
                out,
                "target (1 GiB of 1 KiB blocks: >= 4.5 MB/s and <= 1 ms average): {}",
                if met { "met" } else { "NOT met" }
            );
        }
        None => {
            let _ = writeln!(out, "target: not measured (needs Table I at 1 GiB)");
        }
    }
    out
}
