//! `blindfold bench gateway`: a mixed S3 workload through the gateway, against the same gateway
//! with the ORAM taken out.
//!
//! Each side starts a gateway in this process on `127.0.0.1:0` over a fresh temporary data
//! directory (under `$TMPDIR`: key, directory database, and the ORAM's redo log and
//! checkpoint) and a fresh store of the chosen kind, and drives it with a real S3 client
//! (`object_store`'s `AmazonS3`, SigV4-signed payloads over HTTP/1.1) from `concurrency`
//! clients at once. The workload is seeded and identical on both sides:
//!
//! 1. *load* (not measured): every one of `objects` keys is PUT once. Each key has a fixed
//!    size drawn log-uniformly between `min_size` and `max_size`;
//! 2. *measured*: `ops` operations on uniformly chosen keys, `read_ratio` of them GETs (whose
//!    bodies are checked byte for byte), the rest PUTs that replace the object with new blocks.
//!    The clock stops after the engine's final commit, so all deferred ORAM work is counted.
//!
//! The ORAM side is the real gateway (crash-consistent Path ORAM: redo log in the data
//! directory, fsynced at every commit). The baseline is the same gateway — HTTP, SigV4,
//! directory, object layer, sealing with the same AEAD and versions — over
//! [`blindfold_gateway::engine::DirectEngine`], which keeps block `i` in cell `i` and is
//! neither oblivious nor crash-consistent. Store traffic is counted by a [`CountingStore`]
//! wrapped directly around the backend (the trust boundary); the ORAM's local redo log is
//! trusted storage and is not counted.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use blindfold_gateway::server::{self, EngineKind, OpenHooks, ServeConfig};
use blindfold_store::{CountingStore, Counts, LatencyStore, LinkConfig, Store, StoreUrl, SyncMode};
use bytes::Bytes;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStoreExt, PutPayload, RetryConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::floor::{Floor, FloorParams, FloorReport, PerOp};
use crate::machine::{peak_rss_bytes, Machine};
use crate::progress::bar;

const BUCKET: &str = "bench";
pub(crate) const ACCESS_KEY: &str = "BLINDFOLDBENCHKEY";
pub(crate) const SECRET_KEY: &str = "blindfold-bench-secret-not-a-real-credential";

/// Parameters of one gateway benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct GatewayBench {
    /// Where each side's cells go (`memory:` or `file:///dir`; each side uses its own
    /// subdirectory, removed afterwards).
    #[serde(serialize_with = "display")]
    pub store: StoreUrl,
    /// Measured operations (each side).
    pub ops: u64,
    /// Distinct keys, each PUT once before measuring.
    pub objects: u64,
    /// Smallest object, bytes.
    pub min_size: u64,
    /// Largest object, bytes.
    pub max_size: u64,
    /// Share of GETs among the measured operations.
    pub read_ratio: f64,
    /// Clients issuing requests at once.
    pub concurrency: usize,
    /// Logical capacity of each gateway in bytes (`None`: sized to the workload).
    pub capacity: Option<u64>,
    /// ORAM block size, bytes.
    pub block_size: u32,
    /// Trusted memory for the top of the ORAM tree, MiB (Path ORAM engine).
    pub cache_mib: u64,
    /// The gateway's ORAM engine.
    #[serde(serialize_with = "display")]
    pub engine: blindfold_gateway::server::OramEngine,
    /// One copy of each ORAM cell, overwritten in place after the redo log carries it (as
    /// `serve --in-place`), instead of two slots per cell.
    pub in_place: bool,
    /// Levels of the TaoStore tree per store object (`serve --pack-levels`; 1: a bucket per
    /// object).
    pub pack_levels: u32,
    /// Where writes are made durable before they are acknowledged (`--durability`).
    pub durability: blindfold_gateway::server::Durability,
    /// With `--durability store`: reads go ahead of the store-side log
    /// (`--reads-ahead-of-log`).
    pub reads_ahead_of_log: bool,
    /// With `--durability store`: a standby in this process follows the gateway's log feed
    /// over the loopback (`serve --standby-listen`), and reads wait for it or the store.
    pub standby: bool,
    /// Emulated network between each gateway and its store (both sides alike): round trip,
    /// milliseconds (0: none).
    pub rtt_ms: u64,
    /// Emulated link bandwidth each way, Mbit/s (`None`: unlimited).
    pub mbit: Option<u64>,
    /// Workload seed.
    pub seed: u64,
    /// Test hook (`bench regress --inject-slowdown`): makes the ORAM gateway's side about this
    /// many times slower ([`crate::slow::SlowStore`] on its store), never the baseline's.
    /// `None` in every real measurement.
    pub inject_slowdown: Option<f64>,
    /// Draw progress bars.
    #[serde(skip)]
    pub progress: bool,
    /// Prices for the cost table (the report carries their date and source).
    #[serde(skip)]
    pub prices: crate::cost::PriceTable,
}

/// Serializes a value by its `Display` form (store URLs, engines).
pub(crate) fn display<T: std::fmt::Display, S: serde::Serializer>(
    v: &T,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

impl Default for GatewayBench {
    fn default() -> Self {
        Self {
            store: StoreUrl::Memory,
            ops: 400,
            objects: 64,
            min_size: 1 << 10,
            max_size: 16 << 20,
            read_ratio: 0.75,
            concurrency: 8,
            capacity: None,
            block_size: 4096,
            cache_mib: blindfold_gateway::server::DEFAULT_CACHE_MIB,
            engine: Default::default(),
            in_place: false,
            pack_levels: 1,
            durability: Default::default(),
            reads_ahead_of_log: false,
            standby: false,
            rtt_ms: 0,
            mbit: None,
            seed: 1,
            inject_slowdown: None,
            progress: true,
            prices: crate::cost::PriceTable::builtin(),
        }
    }
}

impl GatewayBench {
    /// The `--quick` preset: a few seconds per side.
    pub fn quick(mut self) -> Self {
        self.ops = 100;
        self.objects = 32;
        self.max_size = 1 << 20;
        self
    }
}

/// Latency percentiles of one group of operations, milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    /// Operations in the group.
    pub count: u64,
    /// Mean.
    pub mean_ms: f64,
    /// Median.
    pub p50_ms: f64,
    /// 95th percentile.
    pub p95_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
}

impl Latency {
    fn of(mut ms: Vec<f64>) -> Self {
        if ms.is_empty() {
            return Self::default();
        }
        ms.sort_unstable_by(f64::total_cmp);
        let at = |p: f64| ms[((ms.len() - 1) as f64 * p).round() as usize];
        Self {
            count: ms.len() as u64,
            mean_ms: ms.iter().sum::<f64>() / ms.len() as f64,
            p50_ms: at(0.50),
            p95_ms: at(0.95),
            p99_ms: at(0.99),
        }
    }
}

/// Latency of the operations on objects in one size range.
#[derive(Clone, Debug, Serialize)]
pub struct SizeClass {
    /// The range, e.g. `"< 64 KiB"`.
    pub sizes: &'static str,
    /// Latencies of GETs and PUTs of objects in the range.
    pub latency: Latency,
}

/// What one side (ORAM or baseline) measured.
#[derive(Clone, Debug, Serialize)]
pub struct SideReport {
    /// Block engine: `path-oram` or `direct`.
    pub engine: String,
    /// Operations per second.
    pub ops_per_sec: f64,
    /// Logical (object payload) megabytes (10^6) per second, GETs and PUTs together.
    pub mb_per_sec: f64,
    /// Mean latency over all operations, milliseconds.
    pub mean_ms: f64,
    /// Median latency over all operations, milliseconds.
    pub p50_ms: f64,
    /// 95th-percentile latency over all operations, milliseconds.
    pub p95_ms: f64,
    /// 99th-percentile latency over all operations, milliseconds.
    pub p99_ms: f64,
    /// GET latencies.
    pub get: Latency,
    /// PUT latencies.
    pub put: Latency,
    /// Latencies by object size.
    pub by_size: Vec<SizeClass>,
    /// Bytes moved to and from the untrusted store per logical payload byte.
    pub bandwidth_overhead: f64,
    /// Logical payload bytes moved by the measured operations.
    pub logical_bytes: u64,
    /// Bytes sent to the store while measuring.
    pub store_bytes_up: u64,
    /// Bytes received from the store while measuring.
    pub store_bytes_down: u64,
    /// Store calls (round trips) while measuring.
    pub store_round_trips: u64,
    /// Bytes of one store cell (what the engine seals and opens).
    pub cell_size: u32,
    /// Cells of the engine's array in the store (the floor measures an in-process store over
    /// as many).
    pub store_cells: u64,
    /// Billable units of the measured phase (one GET per cell read, one PUT per cell written,
    /// as an object store bills them), for the cost comparison.
    pub usage: crate::cost::Usage,
    /// Seconds of the measured phase (final commit included).
    pub seconds: f64,
    /// Seconds to load every object first (not measured).
    pub load_seconds: f64,
    /// CPU seconds the whole process (clients and gateway) used while measuring.
    pub cpu_seconds: f64,
    /// `cpu_seconds / seconds`: cores kept busy (the machine has `machine.cores`).
    pub cores_busy: f64,
    /// The machine's one-minute load average at the end of the measured phase: well above
    /// its core count means other work competed with the benchmark.
    pub load_average: f64,
    /// Bytes of trusted memory the engine held after its final commit (position map, stash,
    /// tree top, version table, …; the engine's own count).
    pub trusted_bytes: u64,
    /// With `--durability store`: what the store-side log cost while measuring.
    pub store_log: Option<StoreLogUse>,
}

/// The store-side log's share of a measured phase (`--durability store`).
#[derive(Clone, Debug, Serialize)]
pub struct StoreLogUse {
    /// Group commits: one batch write of whole cells each.
    pub group_commits: u64,
    /// Bytes they wrote to the store.
    pub bytes: u64,
    /// `bytes / group_commits`.
    pub bytes_per_group_commit: f64,
    /// `bytes` per measured operation.
    pub bytes_per_op: f64,
    /// `bytes` as a share of every byte sent to the store.
    pub share_of_bytes_up: f64,
}

/// Results of [`run`]. Field names are the JSON keys; the ORAM side's fields sit at the top
/// level (`ops_per_sec`, `p50_ms`, `bandwidth_overhead`, …).
#[derive(Clone, Debug, Serialize)]
pub struct GatewayReport {
    /// Always `"gateway"`.
    pub scheme: &'static str,
    /// Where it ran.
    pub machine: Machine,
    /// The parameters.
    pub params: GatewayBench,
    /// Logical capacity each gateway was created with, bytes.
    pub capacity_bytes: u64,
    /// Sum of the loaded objects' sizes, bytes.
    pub dataset_bytes: u64,
    /// The gateway over Path ORAM.
    #[serde(flatten)]
    pub oram: SideReport,
    /// The same gateway without ORAM.
    pub baseline: SideReport,
    /// Baseline operations per second.
    pub baseline_ops_per_sec: f64,
    /// Baseline megabytes per second.
    pub baseline_mb_per_sec: f64,
    /// `baseline_ops_per_sec / ops_per_sec`: how many times longer the workload takes.
    pub slowdown: f64,
    /// `oram.p50_ms / baseline.p50_ms`.
    pub p50_ratio: f64,
    /// Peak resident memory of the whole process, bytes.
    pub peak_rss_bytes: u64,
    /// Both sides priced at cloud list prices (the built-in table of docs/cost.md).
    pub cost: crate::cost::CostReport,
    /// This machine's limits at the engine's cell size, on the same store and link, and the
    /// floor they set for both sides (all cores; every client's operation needs at least one
    /// round trip, overlapped across the clients).
    pub floor: FloorReport,
}

/// Published slowdowns (Thoresen, "Oblivious RAM in practice", NTNU 2019: a home user's
/// workload against a public cloud store).
pub const THESIS: &[(&str, f64, f64)] =
    &[("ObliviStore", 8.5, 10.0), ("CURIOUS", 17.0, 64.0), ("Ring ORAM", 87.0, 1440.0)];

/// The slowdown blindfold aims to stay under.
pub const AIM: f64 = 5.0;

/// The shortest measurement a verdict is given on: below it, scheduling noise and warm-up
/// decide the ratio.
pub const MIN_VERDICT_SECONDS: f64 = 1.0;

/// What one measured operation does to its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Read the object and check it byte for byte.
    Get,
    /// Store the object (replacing any at the key).
    Put,
}

/// The objects and operations of one run.
pub struct Workload {
    sizes: Vec<u64>,
    /// Keys `0..loaded` are PUT before measuring.
    loaded: usize,
    ops: Vec<(usize, Kind)>,
    /// Random bytes; object `i` is `data[offset(i) .. offset(i) + size]`.
    data: Bytes,
}

impl std::fmt::Debug for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workload")
            .field("objects", &self.sizes.len())
            .field("loaded", &self.loaded)
            .field("ops", &self.ops.len())
            .finish_non_exhaustive()
    }
}

impl Workload {
    /// Objects of `sizes` (keys are indices), the first `loaded` PUT before measuring, then
    /// `ops` measured in order; contents drawn from `seed`.
    pub fn from_parts(sizes: Vec<u64>, loaded: usize, ops: Vec<(usize, Kind)>, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let max = sizes.iter().copied().max().unwrap_or(0);
        let mut data = vec![0u8; max as usize + 4096];
        rng.fill(&mut data[..]);
        Self { sizes, loaded, ops, data: Bytes::from(data) }
    }

    /// Sum of the sizes of the objects loaded before measuring.
    pub fn loaded_bytes(&self) -> u64 {
        self.sizes[..self.loaded].iter().sum()
    }

    fn new(p: &GatewayBench) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(p.seed);
        let (lo, hi) = ((p.min_size as f64).ln(), (p.max_size as f64).ln());
        let sizes = (0..p.objects)
            .map(|_| {
                let s =
                    if hi > lo { rng.gen_range(lo..=hi).exp().round() as u64 } else { p.min_size };
                s.clamp(p.min_size, p.max_size)
            })
            .collect();
        let ops = (0..p.ops)
            .map(|_| {
                let key = rng.gen_range(0..p.objects as usize);
                (key, if rng.gen_bool(p.read_ratio) { Kind::Get } else { Kind::Put })
            })
            .collect();
        let mut data = vec![0u8; p.max_size as usize + 4096];
        rng.fill(&mut data[..]);
        let loaded = p.objects as usize;
        Self { sizes, loaded, ops, data: Bytes::from(data) }
    }

    fn body(&self, key: usize) -> Bytes {
        let off = (key * 61) % 4096;
        self.data.slice(off..off + self.sizes[key] as usize)
    }
}

fn key_path(key: usize) -> ObjectPath {
    ObjectPath::from(format!("obj/{key:06}"))
}

/// The capacity the workload needs: every object, plus one largest object in flight per
/// client (a PUT writes new blocks before it frees the old ones), with a quarter spare.
fn needed_capacity(p: &GatewayBench, sizes: &[u64]) -> u64 {
    let bs = u64::from(p.block_size);
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let blocks: u64 = sizes.iter().map(|s| s.div_ceil(bs).max(1)).sum::<u64>()
        + p.concurrency as u64 * largest.div_ceil(bs);
    (blocks + blocks / 4 + 64) * bs
}

/// CPU seconds this process has used (user + system; Linux, 0 elsewhere).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// Each side's store: its own subdirectory for `file:` stores, its own key prefix for S3 (so
/// that runs one after the other, e.g. of other block sizes, never meet each other's arrays).
fn side_store(url: &StoreUrl, side: &str) -> (StoreUrl, Option<PathBuf>) {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    let unique = format!("blindfold-bench-gateway-{}-{run}-{side}", std::process::id());
    match url {
        StoreUrl::File { dir, sync } => {
            let d = dir.join(unique);
            (StoreUrl::File { dir: d.clone(), sync: *sync }, Some(d))
        }
        StoreUrl::S3 { bucket, prefix, options } => {
            let prefix = match prefix.trim_matches('/') {
                "" => unique,
                p => format!("{p}/{unique}"),
            };
            (StoreUrl::S3 { bucket: bucket.clone(), prefix, options: options.clone() }, None)
        }
        other => (other.clone(), None),
    }
}

fn client(addr: SocketAddr, timeout: Duration) -> Result<AmazonS3> {
    AmazonS3Builder::new()
        .with_endpoint(format!("http://{addr}"))
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .with_region("us-east-1")
        .with_bucket_name(BUCKET)
        .with_access_key_id(ACCESS_KEY)
        .with_secret_access_key(SECRET_KEY)
        .with_retry(RetryConfig { max_retries: 0, ..RetryConfig::default() })
        .with_client_options(ClientOptions::new().with_allow_http(true).with_timeout(timeout))
        .build()
        .context("building the S3 client")
}

/// Runs `jobs` on `concurrency` clients; returns (job index, seconds) per job.
async fn drive(
    s3: &Arc<AmazonS3>,
    w: &Arc<Workload>,
    jobs: Arc<Vec<(usize, Kind)>>,
    concurrency: usize,
    pb: &indicatif::ProgressBar,
) -> Result<Vec<(usize, f64)>> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (s3, w, jobs, next, pb) =
            (Arc::clone(s3), Arc::clone(w), Arc::clone(&jobs), Arc::clone(&next), pb.clone());
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(key, kind)) = jobs.get(i) else { return Ok::<_, anyhow::Error>(done) };
                let path = key_path(key);
                let t = Instant::now();
                match kind {
                    Kind::Put => {
                        s3.put(&path, PutPayload::from(w.body(key)))
                            .await
                            .with_context(|| format!("PUT {path}"))?;
                    }
                    Kind::Get => {
                        let got = s3
                            .get(&path)
                            .await
                            .with_context(|| format!("GET {path}"))?
                            .bytes()
                            .await
                            .with_context(|| format!("GET {path} (body)"))?;
                        if got != w.body(key) {
                            bail!(
                                "GET {path} returned {} bytes that differ from what was PUT",
                                got.len()
                            );
                        }
                    }
                }
                done.push((i, t.elapsed().as_secs_f64()));
                pb.inc(1);
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.context("client task panicked")??);
    }
    Ok(all)
}

async fn run_side(
    p: &GatewayBench,
    w: &Arc<Workload>,
    engine: EngineKind,
    capacity: u64,
    label: &str,
) -> Result<SideReport> {
    let side = if engine == EngineKind::PathOram { "oram" } else { "baseline" };
    let (store, store_dir) = side_store(&p.store, side);
    let data_dir = tempfile::Builder::new()
        .prefix("blindfold-bench-gateway-")
        .tempdir()
        .context("creating a temporary data directory")?;
    let result = run_side_in(p, w, engine, capacity, label, store, data_dir.path().into()).await;
    if let Some(d) = store_dir {
        let _ = std::fs::remove_dir_all(d);
    }
    result
}

/// The benches' emulated link: `rtt_ms` round trip and `mbit` Mbit/s each way; `None` when
/// neither is set (no link at all). A zero bandwidth is refused.
pub(crate) fn emulated_link(rtt_ms: u64, mbit: Option<u64>) -> Result<Option<LinkConfig>> {
    if rtt_ms == 0 && mbit.is_none() {
        return Ok(None);
    }
    let bits = mbit.map(|m| m.saturating_mul(1_000_000));
    Ok(Some(LinkConfig::new(Duration::from_millis(rtt_ms), bits, bits)?))
}

/// A gateway running in this process on `127.0.0.1:0`, its store wrapped in the emulated
/// link (if any) and a [`CountingStore`] at the trust boundary. Shared by the benchmarks that
/// drive a live gateway with a real client.
pub(crate) struct LiveGateway {
    /// Where it listens (plain HTTP).
    pub addr: SocketAddr,
    /// Its object layer.
    pub objects: Arc<blindfold_gateway::objects::ObjectLayer>,
    /// Its store traffic.
    pub counts: Arc<CountingStore<Arc<dyn Store>>>,
    /// Its store-side log (`--durability store`).
    pub log: Option<Arc<blindfold_gateway::storelog::StoreLog>>,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<blindfold_gateway::Result<()>>,
}

/// What a [`LiveGateway`] runs.
pub(crate) struct LiveSetup {
    /// Its store.
    pub store: StoreUrl,
    /// Its (fresh) data directory.
    pub data_dir: PathBuf,
    /// Logical capacity, bytes.
    pub capacity: u64,
    /// Block size, bytes.
    pub block_size: u32,
    /// Tree top in trusted memory, MiB.
    pub cache_mib: u64,
    /// The ORAM engine.
    pub engine: blindfold_gateway::server::OramEngine,
    /// ORAM or the no-ORAM baseline.
    pub kind: EngineKind,
    /// One copy per cell (`serve --in-place`).
    pub in_place: bool,
    /// Tree levels per store object (`serve --pack-levels`).
    pub pack_levels: u32,
    /// Where writes are made durable.
    pub durability: blindfold_gateway::server::Durability,
    /// Reads go ahead of the store-side log.
    pub reads_ahead_of_log: bool,
    /// A standby follows the log feed.
    pub standby: bool,
    /// Emulated round trip to the store, ms (0: none).
    pub rtt_ms: u64,
    /// Emulated bandwidth each way, Mbit/s.
    pub mbit: Option<u64>,
    /// Test hook: [`crate::slow::SlowStore`] with this factor around its store.
    pub slowdown: Option<f64>,
}

/// Opens the gateway `s` describes (its data directory made private, its store wrapped in the
/// emulated link and a [`CountingStore`]), without serving it.
pub(crate) async fn open_live(
    s: LiveSetup,
) -> Result<(server::Opened, Arc<CountingStore<Arc<dyn Store>>>)> {
    #[cfg(unix)]
    {
        // A data directory holds trusted state: the gateway wants it private (and says so).
        use std::os::unix::fs::PermissionsExt as _;
        let private = std::fs::Permissions::from_mode(0o700);
        std::fs::set_permissions(&s.data_dir, private)
            .with_context(|| format!("restricting {}", s.data_dir.display()))?;
    }
    let cfg = ServeConfig {
        listen: "127.0.0.1:0".parse().expect("address"),
        data_dir: s.data_dir,
        store: Some(s.store),
        key_file: None,
        passphrase: None,
        credentials: Some((ACCESS_KEY.into(), SECRET_KEY.into())),
        capacity: s.capacity,
        block_size: s.block_size,
        pad_objects: false,
        cache_mib: s.cache_mib,
        engine: s.engine,
        in_place: s.in_place,
        pack_levels: s.pack_levels,
        durability: s.durability,
        lease_ttl: None,
        anchor: None,
        reads_ahead_of_log: s.reads_ahead_of_log,
        log_feed: s.standby.then(|| {
            blindfold_gateway::feed::LogFeed::Serve("127.0.0.1:0".parse().expect("address"))
        }),
    };
    type Counting = CountingStore<Arc<dyn Store>>;
    let link = emulated_link(s.rtt_ms, s.mbit)?;
    // Checked here, so that the wrapper below cannot fail.
    let slowdown = s.slowdown;
    slowdown.map(crate::slow::check_factor).transpose()?;
    let counter: Arc<OnceLock<Arc<Counting>>> = Arc::new(OnceLock::new());
    let hook = Arc::clone(&counter);
    let hooks = OpenHooks {
        engine: s.kind,
        wrap_store: Some(Box::new(move |s: Arc<dyn Store>| -> Arc<dyn Store> {
            let mut s: Arc<dyn Store> = match link {
                Some(link) => Arc::new(LatencyStore::new(s, link)),
                None => s,
            };
            if let Some(factor) = slowdown {
                s = Arc::new(crate::slow::SlowStore::new(s, factor).expect("checked above"));
            }
            let c = Arc::new(CountingStore::new(s));
            let _ = hook.set(Arc::clone(&c));
            c
        })),
        ..OpenHooks::default()
    };
    let opened = server::open_with(&cfg, hooks).await.context("opening the gateway")?;
    let counts = counter.get().cloned().context("the store hook was not called")?;
    if s.standby {
        let journal = opened.journal.as_ref().context("--standby needs --durability store")?;
        journal.follow_here(Arc::clone(&opened.key))?;
    }
    Ok((opened, counts))
}

impl LiveGateway {
    /// Opens the gateway, creates `bucket`, and starts serving.
    pub(crate) async fn start(s: LiveSetup, bucket: &str) -> Result<Self> {
        let listen: SocketAddr = "127.0.0.1:0".parse().expect("address");
        let (opened, counts) = open_live(s).await?;
        let objects = Arc::clone(&opened.objects);
        let log = opened.journal.as_ref().map(|j| Arc::clone(&j.log));
        objects.directory().create_bucket(bucket)?;
        let listener = tokio::net::TcpListener::bind(listen).await.context("listening")?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(server::run(opened, listener, async {
            let _ = stopped.await;
        }));
        Ok(Self { addr, objects, counts, log, stop, server })
    }

    /// Stops serving and waits for the server to end (its clients must be dropped first, so
    /// that their connections close).
    pub(crate) async fn stop(self) -> Result<()> {
        let Self { objects, stop, server, .. } = self;
        drop(objects);
        let _ = stop.send(());
        server.await.context("gateway task panicked")?.context("gateway shutdown")
    }
}

async fn run_side_in(
    p: &GatewayBench,
    w: &Arc<Workload>,
    engine: EngineKind,
    capacity: u64,
    label: &str,
    store: StoreUrl,
    data_dir: PathBuf,
) -> Result<SideReport> {
    let setup = LiveSetup {
        store,
        data_dir,
        capacity,
        block_size: p.block_size,
        cache_mib: p.cache_mib,
        engine: p.engine,
        kind: engine,
        in_place: p.in_place,
        // The baseline stores no tree.
        pack_levels: if engine == EngineKind::DirectBaseline { 1 } else { p.pack_levels },
        // The baseline has no redo log to keep in the store.
        durability: if engine == EngineKind::DirectBaseline {
            blindfold_gateway::server::Durability::Local
        } else {
            p.durability
        },
        reads_ahead_of_log: engine != EngineKind::DirectBaseline && p.reads_ahead_of_log,
        standby: engine != EngineKind::DirectBaseline && p.standby,
        rtt_ms: p.rtt_ms,
        mbit: p.mbit,
        slowdown: if engine == EngineKind::DirectBaseline { None } else { p.inject_slowdown },
    };
    let live = LiveGateway::start(setup, BUCKET).await?;
    let (addr, counts, objects) = (live.addr, Arc::clone(&live.counts), Arc::clone(&live.objects));

    let s3 = Arc::new(client(addr, Duration::from_secs(3600))?);
    let load: Vec<(usize, Kind)> = (0..w.loaded).map(|k| (k, Kind::Put)).collect();
    let pb = bar(load.len() as u64, &format!("{label}: load"), p.progress);
    let t = Instant::now();
    drive(&s3, w, Arc::new(load), p.concurrency, &pb).await?;
    objects.shutdown().await?;
    let load_seconds = t.elapsed().as_secs_f64();
    pb.finish_and_clear();

    counts.reset();
    let log_before = live.log.as_ref().map(|l| l.counts());
    let pb = bar(w.ops.len() as u64, label, p.progress);
    let cpu0 = cpu_seconds();
    let t = Instant::now();
    let done = drive(&s3, w, Arc::new(w.ops.clone()), p.concurrency, &pb).await?;
    objects.shutdown().await?; // the final commit is part of the work
    let seconds = t.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let load_average = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    pb.finish_and_clear();
    let c: Counts = counts.counts();
    let usage =
        crate::cost::Usage::from_counts(&c, w.ops.len() as u64, counts.geometry().total_bytes());
    let kind = objects.engine().kind().to_string();
    let trusted_bytes = objects.engine().gauges().trusted_bytes;
    let store_log = live.log.as_ref().zip(log_before).map(|(l, (a0, b0))| {
        let (a, b) = l.counts();
        let (group_commits, bytes) = (a - a0, b - b0);
        StoreLogUse {
            group_commits,
            bytes,
            bytes_per_group_commit: bytes as f64 / group_commits.max(1) as f64,
            bytes_per_op: bytes as f64 / w.ops.len().max(1) as f64,
            share_of_bytes_up: bytes as f64 / c.bytes_up().max(1) as f64,
        }
    });

    drop(s3); // closes the client's connections, so the server's connection tasks end
    drop(objects);
    live.stop().await?;

    let mut all = Vec::new();
    let (mut gets, mut puts) = (Vec::new(), Vec::new());
    let mut classes: [Vec<f64>; 3] = Default::default();
    let mut logical = 0u64;
    for (i, secs) in done {
        let (key, k) = w.ops[i];
        let ms = secs * 1e3;
        let size = w.sizes[key];
        logical += size;
        all.push(ms);
        if k == Kind::Get {
            gets.push(ms)
        } else {
            puts.push(ms)
        }
        classes[if size < 64 << 10 {
            0
        } else if size < 1 << 20 {
            1
        } else {
            2
        }]
        .push(ms);
    }
    let ops = w.ops.len() as f64;
    let overall = Latency::of(all);
    let [small, medium, large] = classes;
    Ok(SideReport {
        engine: kind,
        ops_per_sec: ops / seconds,
        mb_per_sec: logical as f64 / seconds / 1e6,
        mean_ms: overall.mean_ms,
        p50_ms: overall.p50_ms,
        p95_ms: overall.p95_ms,
        p99_ms: overall.p99_ms,
        get: Latency::of(gets),
        put: Latency::of(puts),
        by_size: vec![
            SizeClass { sizes: "< 64 KiB", latency: Latency::of(small) },
            SizeClass { sizes: "64 KiB – 1 MiB", latency: Latency::of(medium) },
            SizeClass { sizes: "≥ 1 MiB", latency: Latency::of(large) },
        ],
        bandwidth_overhead: (c.bytes_up() + c.bytes_down()) as f64 / logical.max(1) as f64,
        logical_bytes: logical,
        store_bytes_up: c.bytes_up(),
        store_bytes_down: c.bytes_down(),
        store_round_trips: c.round_trips,
        cell_size: counts.geometry().cell_size(),
        store_cells: counts.geometry().cell_count(),
        usage,
        seconds,
        load_seconds,
        cpu_seconds: cpu,
        cores_busy: cpu / seconds,
        load_average,
        trusted_bytes,
        store_log,
    })
}

/// Runs the benchmark: the gateway over Path ORAM, then the same gateway without ORAM.
pub async fn run(params: GatewayBench) -> Result<GatewayReport> {
    check(&params)?;
    let w = Workload::new(&params);
    run_with(params, w).await
}

fn check(params: &GatewayBench) -> Result<()> {
    anyhow::ensure!(params.ops > 0, "--ops must be at least 1");
    anyhow::ensure!(params.objects > 0, "--objects must be at least 1");
    anyhow::ensure!((0.0..=1.0).contains(&params.read_ratio), "--read-ratio must be in 0..=1");
    anyhow::ensure!(
        params.min_size >= 1 && params.min_size <= params.max_size,
        "--min-size must be at least 1 and at most --max-size"
    );
    anyhow::ensure!(params.max_size <= 1 << 30, "--max-size must be at most 1 GiB");
    anyhow::ensure!(params.concurrency >= 1, "--concurrency must be at least 1");
    Ok(())
}

/// [`run`] with a workload of its own (objects, what is loaded, the measured operations):
/// `params` gives the gateway, the store and the clients; its workload fields are not used.
pub async fn run_with(params: GatewayBench, w: Workload) -> Result<GatewayReport> {
    anyhow::ensure!(params.concurrency >= 1, "--concurrency must be at least 1");
    anyhow::ensure!(!w.ops.is_empty(), "the workload has no operations");
    if let StoreUrl::File { sync: SyncMode::Always, .. } = params.store {
        tracing::info!("sync=always: every store write batch is fsynced on both sides");
    }
    let w = Arc::new(w);
    let needed = needed_capacity(&params, &w.sizes);
    let capacity = match params.capacity {
        Some(c) if c < needed => bail!(
            "--capacity {c} is too small for this workload: it needs about {needed} bytes \
             (every object plus one largest object in flight per client); leave it out to size \
             it automatically"
        ),
        Some(c) => c,
        None => needed,
    };
    let oram = run_side(&params, &w, EngineKind::PathOram, capacity, "gateway (ORAM)").await?;
    let baseline =
        run_side(&params, &w, EngineKind::DirectBaseline, capacity, "baseline (no ORAM)").await?;
    let limits = crate::floor::measure(
        &FloorParams::new(oram.cell_size)
            .with_array(oram.store_cells)
            .with_store(&params.store)
            .with_link(emulated_link(params.rtt_ms, params.mbit)?),
    )
    .await?;
    let cores = limits.cores;
    let side = |x: &SideReport| {
        let op = PerOp::from_bytes(
            x.store_bytes_up as f64 / w.ops.len() as f64,
            x.store_bytes_down as f64 / w.ops.len() as f64,
            1.0,
            params.concurrency,
            cores,
        );
        Floor::of(&limits, &op, x.ops_per_sec)
    };
    let floor = FloorReport { engine: side(&oram), baseline: Some(side(&baseline)), limits };
    Ok(GatewayReport {
        scheme: "gateway",
        machine: Machine::current(),
        capacity_bytes: capacity,
        dataset_bytes: w.sizes.iter().sum(),
        baseline_ops_per_sec: baseline.ops_per_sec,
        baseline_mb_per_sec: baseline.mb_per_sec,
        slowdown: baseline.ops_per_sec / oram.ops_per_sec,
        p50_ratio: oram.p50_ms / baseline.p50_ms,
        peak_rss_bytes: peak_rss_bytes(),
        cost: crate::cost::compare(
            &params.prices,
            &oram.usage,
            &baseline.usage,
            w.sizes.iter().sum(),
        ),
        floor,
        oram,
        baseline,
        params,
    })
}

fn size(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    } else if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    } else if b >= 1 << 10 {
        format!("{:.0} KiB", b as f64 / 1024.0)
    } else {
        format!("{b} B")
    }
}

fn kv(s: &mut String, k: &str, v: String) {
    s.push_str(&format!("  {k:<30} {v}\n"));
}

fn row(s: &mut String, k: &str, r: &GatewayReport, f: impl Fn(&SideReport) -> String) {
    s.push_str(&format!("  {k:<30} {:>22} {:>22}\n", f(&r.oram), f(&r.baseline)));
}

/// The emulated link, as words for the workload line.
fn link_text(p: &GatewayBench) -> String {
    match (p.rtt_ms, p.mbit) {
        (0, None) => String::new(),
        (rtt, None) => format!(" behind a {rtt} ms link"),
        (rtt, Some(m)) => format!(" behind a {rtt} ms, {m} Mbit/s link"),
    }
}

fn triple(count: u64, p50: f64, p95: f64, p99: f64) -> String {
    if count == 0 {
        "-".to_string()
    } else {
        format!("{p50:.1} / {p95:.1} / {p99:.1}")
    }
}

fn lat(l: &Latency) -> String {
    triple(l.count, l.p50_ms, l.p95_ms, l.p99_ms)
}

/// What the engine was given: its cache (the engines that have one), block size and packing.
fn engine_shape(p: &GatewayBench) -> String {
    use blindfold_gateway::server::OramEngine;
    let mut parts = Vec::new();
    if matches!(p.engine, OramEngine::PathOram | OramEngine::Tao) {
        parts.push(format!("cache {} MiB", p.cache_mib));
    }
    parts.push(format!("{} blocks", size(u64::from(p.block_size))));
    if p.engine == OramEngine::Tao && p.pack_levels > 1 {
        parts.push(format!("{} levels per store object", p.pack_levels));
    }
    format!(" ({})", parts.join(", "))
}

/// The report as a human-readable table.
pub fn render(r: &GatewayReport) -> String {
    let p = &r.params;
    let mut s = String::new();
    kv(&mut s, "machine", r.machine.summary());
    kv(
        &mut s,
        "workload",
        format!(
            "{} ops on {} objects ({}–{}, log-uniform; {} loaded), {:.0}% GET, {} clients, \
             store {}{}, capacity {}, engine {}{}",
            p.ops,
            p.objects,
            size(p.min_size),
            size(p.max_size),
            size(r.dataset_bytes),
            p.read_ratio * 100.0,
            p.concurrency,
            p.store,
            link_text(p),
            size(r.capacity_bytes),
            p.engine,
            engine_shape(p),
        ),
    );
    s.push_str(&format!(
        "  {:<30} {:>22} {:>22}\n",
        "",
        format!("gateway ({})", p.engine),
        "baseline (no ORAM)"
    ));
    row(&mut s, "ops/s", r, |x| format!("{:.1}", x.ops_per_sec));
    row(&mut s, "logical MB/s", r, |x| format!("{:.1}", x.mb_per_sec));
    row(&mut s, "all ops p50/p95/p99 ms", r, |x| triple(1, x.p50_ms, x.p95_ms, x.p99_ms));
    row(&mut s, "GET p50/p95/p99 ms", r, |x| lat(&x.get));
    row(&mut s, "PUT p50/p95/p99 ms", r, |x| lat(&x.put));
    for i in 0..r.oram.by_size.len() {
        let k = format!("{} p50/p95/p99 ms", r.oram.by_size[i].sizes);
        row(&mut s, &k, r, |x| lat(&x.by_size[i].latency));
    }
    row(&mut s, "store bytes / logical byte", r, |x| format!("{:.2}×", x.bandwidth_overhead));
    row(&mut s, "store MB up / down", r, |x| {
        format!("{:.0} / {:.0}", x.store_bytes_up as f64 / 1e6, x.store_bytes_down as f64 / 1e6)
    });
    row(&mut s, "store round trips", r, |x| x.store_round_trips.to_string());
    row(&mut s, "trusted memory after the run", r, |x| {
        blindfold_gateway::server::human_bytes(x.trusted_bytes)
    });
    if r.oram.store_log.is_some() {
        row(&mut s, "store-side log: group commits", r, |x| match &x.store_log {
            Some(l) => l.group_commits.to_string(),
            None => "— (no log)".into(),
        });
        row(&mut s, "  KiB per group commit / op", r, |x| match &x.store_log {
            Some(l) => {
                format!("{:.0} / {:.0}", l.bytes_per_group_commit / 1024.0, l.bytes_per_op / 1024.0)
            }
            None => "—".into(),
        });
        row(&mut s, "  share of bytes sent", r, |x| match &x.store_log {
            Some(l) => format!("{:.0} %", l.share_of_bytes_up * 100.0),
            None => "—".into(),
        });
    }
    row(&mut s, "CPU cores busy", r, |x| format!("{:.2} of {}", x.cores_busy, r.machine.cores));
    row(&mut s, "machine load average (1 min)", r, |x| format!("{:.1}", x.load_average));
    row(&mut s, "measured / load seconds", r, |x| {
        format!("{:.1} / {:.1}", x.seconds, x.load_seconds)
    });
    kv(
        &mut s,
        "slowdown vs baseline",
        format!("{:.1}× (median latency {:.1}×)", r.slowdown, r.p50_ratio),
    );
    let published: Vec<String> =
        THESIS.iter().map(|(n, lo, hi)| format!("{n} {lo}–{hi}×")).collect();
    kv(
        &mut s,
        "published slowdowns",
        format!(
            "{} (Thoresen, \"Oblivious RAM in practice\", NTNU 2019: a home user's files on a \
             public cloud store)",
            published.join(", ")
        ),
    );
    let measured = r.oram.seconds.min(r.baseline.seconds);
    let verdict = if measured < MIN_VERDICT_SECONDS {
        format!(
            "none: a side measured only {measured:.1} s, too short to judge (at least \
             {MIN_VERDICT_SECONDS:.0} s: more --ops, or without --quick)"
        )
    } else {
        let beats: Vec<&str> =
            THESIS.iter().filter(|(_, lo, _)| r.slowdown < *lo).map(|(n, _, _)| *n).collect();
        format!(
            "{:.1}× {} blindfold's target of under {AIM}×{}",
            r.slowdown,
            if r.slowdown < AIM { "meets" } else { "misses" },
            if beats.is_empty() {
                String::new()
            } else {
                format!("; below the published {}", beats.join(", "))
            }
        )
    };
    kv(&mut s, "verdict", verdict);
    s.push_str(&r.floor.render(30));
    let note = if p.rtt_ms == 0 && p.mbit.is_none() {
        "(the thesis's baseline was a public cloud store over a WAN; this one is a local store, \
         so this ratio measures CPU and local I/O, not network round trips: try --rtt-ms)"
            .to_string()
    } else {
        format!(
            "(both sides reach their store through the same emulated link{}, as the thesis's \
             gateway reached a public cloud)",
            link_text(p)
        )
    };
    kv(&mut s, "", note);
    s.push_str(&crate::cost::render(&r.cost));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use blindfold_gateway::server::OramEngine;

    #[test]
    fn the_workload_line_names_the_cache_block_size_and_packing() {
        let p = GatewayBench {
            cache_mib: 256,
            block_size: 65536,
            pack_levels: 2,
            ..GatewayBench::default()
        };
        assert_eq!(engine_shape(&p), " (cache 256 MiB, 64 KiB blocks, 2 levels per store object)");
        let p = GatewayBench { engine: OramEngine::ObliviStore, ..GatewayBench::default() };
        assert_eq!(engine_shape(&p), " (4 KiB blocks)");
    }
}
