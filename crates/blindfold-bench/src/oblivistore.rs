//! `blindfold bench oblivistore`: the experiments of seed 001 (ObliviStore's extended abstract,
//! Figures 2–7) for the partition engines, with the TaoStore engine beside them.
//!
//! Every point drives an engine directly (an `Arc<dyn SharedEngine>`, as the gateway's object
//! layer does) with closed-loop clients: each draws a block uniformly at random, reads it or
//! (`1 − read_ratio` of the time) writes it, waits for the answer and draws the next. Every
//! block is written once before the first point. A point ends after `ops` operations or
//! `max_seconds`, whichever comes first (operations in flight then are finished and counted).
//! Writes are committed every [`COMMIT_EVERY`] in the background, as a gateway under load
//! groups its commits.
//!
//! Each ORAM node's store is `backend → SeekCountingStore → link`, the link being a
//! [`LatencyStore`] of the point's round trip (switched between points: the engine is filled
//! once, over no link, and then measured at every round trip in turn).
//!
//! 1. **Latency** (Figures 4 and 5): throughput and response time at each round trip of
//!    `rtts_ms`. The number of clients grows with the round trip unless `clients` fixes it
//!    ([`clients_for`]): by Little's law a closed loop keeps `throughput × response time`
//!    requests in flight, so a fixed number of clients would measure the clients rather
//!    than the engine at a long round trip. After the fill, `ops / 4` operations warm the
//!    engine up (no link, not measured).
//! 2. **Seeks** (Figure 7): seeks per logical operation with the cells in a file, no link. A
//!    seek is a maximal run of contiguous cells in one store request ([`crate::seeks`]); every
//!    row counts them, this experiment is the one on the file backend.
//! 3. **Nodes** (Figure 6): aggregate throughput by number of ORAM nodes behind one load
//!    balancer, each node with its own store and its own link (`nodes_rtt_ms`, and `mbit` per
//!    direction: the paper's nodes each had their own disks and network), and `nodes ×` the
//!    clients of one node. [`build_balanced`] serves the nodes over gRPC with mutual TLS on
//!    loopback, the load balancer of `blindfold serve --nodes` in front — one node included,
//!    so that the scaling is measured on one system (the engine alone at one node is the
//!    latency experiment's row at the same round trip).
//!
//! The blow-up is the bytes moved to and from the stores (sealed cells, both ways) over the
//! logical bytes of the operations, counted from the start of a point until the work it
//! caused has landed (the commit and, for ObliviStore, the evictions still in flight).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use blindfold_crypto::{CellSealer, MasterKey, StoreId};
use blindfold_gateway::engine::SharedEngine;
use blindfold_oram::oblivistore::ObliviStoreConfig;
use blindfold_oram::BlockId;
use blindfold_proxy::{DurableObliviStore, DurableTao, TaoConfig};
use blindfold_store::{
    ByteRange, CellId, FileStore, Geometry, LatencyStore, LinkConfig, MemoryStore, Store, StoreUrl,
    SyncMode,
};
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use tokio::time::Instant;

use crate::floor::{Floor, FloorParams, Limits, PerOp};
use crate::machine::Machine;
use crate::plots::{bar_plot, linear_plot, Series};
use crate::progress::bar;
use crate::seeks::{SeekCountingStore, SeekCounts};

/// Engines this benchmark knows, in table order.
pub const ENGINES: [&str; 4] = ["oblivistore", "curious", "curious-path", "tao"];

/// How often the clients' writes are committed during a point.
pub const COMMIT_EVERY: Duration = Duration::from_millis(100);

/// The paper's and the figures.
pub mod reference {
    /// Seed 001, §2.3: aggregate throughput with 10 ORAM nodes (11 machines, 20 SSDs), MB/s.
    pub const PAPER_MB_PER_SEC: f64 = 31.5;
    /// Seed 001, Figure 7: seeks per ORAM operation, at most (1–10 TB ORAMs).
    pub const PAPER_SEEKS_PER_OP: f64 = 10.0;
    /// Seed 001, §2.1: response time above the round trip with 7 HDDs, ms.
    pub const PAPER_HDD_OVERHEAD_MS: (f64, f64) = (140.0, 200.0);
    /// Issue 10: ObliviStore on this machine, MB/s (10^6 bytes).
    pub const TARGET_MB_PER_SEC: f64 = 31.5;
    /// Issue 10: a Java ObliviStore port here (memory, 2^16 × 4 KiB): requests/s and blow-up.
    pub const JAVA_OBLIVISTORE: (f64, f64) = (2457.0, 22.0);
    /// Issue 10: the same port's CURIOUS: requests/s and blow-up.
    pub const JAVA_CURIOUS: (f64, f64) = (1188.0, 64.0);
    /// Issue 10: ours must serve this many times the port's request rates.
    pub const TARGET_FACTOR: f64 = 3.0;
    /// Issue 10: with n nodes, at least this share of n times one node's throughput counts as
    /// "nearly linear".
    pub const LINEAR_SHARE: f64 = 0.8;
}

/// Where the cells live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// In this process's memory.
    Memory,
    /// In one file per node under the work directory (no fsync: the paper's disks had none
    /// to wait for either; the engine's own redo log is still synced).
    File,
}

impl std::str::FromStr for StoreKind {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "memory" => Ok(StoreKind::Memory),
            "file" => Ok(StoreKind::File),
            o => Err(format!("unknown store {o:?}: memory or file")),
        }
    }
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoreKind::Memory => "memory",
            StoreKind::File => "file",
        })
    }
}

/// Parameters.
#[derive(Clone, Debug, Serialize)]
pub struct ObliviStoreBench {
    /// Engines to measure (of [`ENGINES`]).
    pub engines: Vec<String>,
    /// Round trips of experiment 1, ms.
    pub rtts_ms: Vec<u64>,
    /// Numbers of ORAM nodes of experiment 3.
    pub nodes: Vec<usize>,
    /// Round trip of each node's link in experiment 3, ms.
    pub nodes_rtt_ms: u64,
    /// Bandwidth of each node's link in experiment 3, each way, Mbit/s (`None`: unlimited).
    /// The paper's nodes each had their own disks and network, which bounded each node: so
    /// here a node's link does, by default at 100 Mbit/s.
    pub nodes_mbit: Option<u64>,
    /// Bandwidth of every link of experiments 1 and 2, each way, Mbit/s (`None`: unlimited).
    pub mbit: Option<u64>,
    /// Logical blocks.
    pub blocks: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// Closed-loop clients per node (`None`: [`clients_for`] the round trip).
    pub clients: Option<usize>,
    /// Operations per point, at most.
    pub ops: u64,
    /// Seconds per point, at most.
    pub max_seconds: f64,
    /// Share of reads.
    pub read_ratio: f64,
    /// Backend of experiments 1 and 3.
    pub store: StoreKind,
    /// Run experiment 2 (seeks on the file backend).
    pub seeks: bool,
    /// Where engine state and file stores go (a temporary directory per engine, removed
    /// after).
    pub work_dir: PathBuf,
    /// Seed of the workload.
    pub seed: u64,
    /// A reduced run (`--quick`).
    pub quick: bool,
    /// Draw progress bars.
    #[serde(skip)]
    pub progress: bool,
}

impl Default for ObliviStoreBench {
    /// The full run: 2^16 blocks of 4 KiB (as the Java port's run), the paper's round trips
    /// from 0 to 1 s, 1, 2 and 4 nodes, up to 20,000 operations or 20 s per point.
    fn default() -> Self {
        Self {
            engines: ENGINES.iter().map(|s| s.to_string()).collect(),
            rtts_ms: vec![0, 50, 100, 200, 500, 1000],
            nodes: vec![1, 2, 4],
            nodes_rtt_ms: 50,
            nodes_mbit: Some(100),
            mbit: None,
            blocks: 1 << 16,
            block_size: 4096,
            clients: None,
            ops: 20_000,
            max_seconds: 20.0,
            read_ratio: 0.5,
            store: StoreKind::Memory,
            seeks: true,
            work_dir: std::env::temp_dir(),
            seed: 1,
            quick: false,
            progress: true,
        }
    }
}

impl ObliviStoreBench {
    /// `--quick`: 4,096 blocks, round trips 0, 50 and 200 ms, 1 and 2 nodes, up to 4,000
    /// operations or 6 s per point (well under three minutes on two cores).
    pub fn quick() -> Self {
        Self {
            rtts_ms: vec![0, 50, 200],
            nodes: vec![1, 2],
            blocks: 4096,
            ops: 4_000,
            max_seconds: 6.0,
            quick: true,
            ..Self::default()
        }
    }

    fn link(&self, rtt_ms: u64) -> LinkConfig {
        link_of(rtt_ms, self.mbit)
    }

    /// Each node's link in experiment 3.
    fn nodes_link(&self) -> LinkConfig {
        link_of(self.nodes_rtt_ms, self.nodes_mbit)
    }

    fn logical_bytes(&self) -> u64 {
        self.blocks * u64::from(self.block_size)
    }
}

fn bandwidth(mbit: Option<u64>) -> String {
    mbit.map_or("unlimited bandwidth".into(), |m| format!("{m} Mbit/s each way"))
}

fn link_of(rtt_ms: u64, mbit: Option<u64>) -> LinkConfig {
    match mbit {
        Some(m) => LinkConfig::wan(rtt_ms, m),
        None => LinkConfig::unlimited(Duration::from_millis(rtt_ms)),
    }
}

/// The partition engines keep at most 1,024 eviction permits out, each access holding 1 + ν of
/// them (about 975 accesses in flight with ν = 0.05); clients beyond that only queue, and a
/// point's last requests take `clients ÷ throughput` to drain.
pub const OBLIVISTORE_CLIENTS: usize = 768;

/// Clients per node for `engine` at a round trip of `rtt_ms` when `--clients` does not fix
/// them: 64, plus 4 per millisecond of round trip, at most 4,096 (64 at 0 ms, 264 at 50 ms,
/// 4,064 at 1 s), so that an engine whose requests in flight grow with its clients (TaoStore's)
/// has enough to keep busy; for ObliviStore at most [`OBLIVISTORE_CLIENTS`].
pub fn clients_for(engine: &str, rtt_ms: u64) -> usize {
    let by_rtt = (64 + 4 * rtt_ms).min(4096) as usize;
    if matches!(engine, "oblivistore" | "curious" | "curious-path") {
        by_rtt.min(OBLIVISTORE_CLIENTS)
    } else {
        by_rtt
    }
}

/// One measured point. The first twelve fields are the issue's; the rest say what was run.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Engine name.
    pub engine: String,
    /// ORAM nodes behind the load balancer.
    pub nodes: usize,
    /// Round trip of each node's link, ms.
    pub rtt_ms: u64,
    /// Closed-loop clients (all nodes together).
    pub clients: usize,
    /// Operations per second.
    pub ops_per_sec: f64,
    /// Logical megabytes (10^6 bytes) per second.
    pub mb_per_sec: f64,
    /// Mean response time, ms.
    pub mean_response_ms: f64,
    /// 99th-percentile response time, ms.
    pub p99_response_ms: f64,
    /// Bytes to and from the stores per logical byte.
    pub blowup: f64,
    /// Seeks (runs of contiguous cells per store request) per operation.
    pub seeks_per_op: f64,
    /// Largest trusted memory seen during the point, bytes.
    pub trusted_bytes: u64,
    /// `latency`, `seeks` or `nodes`.
    pub experiment: String,
    /// Backend.
    pub store: StoreKind,
    /// Logical blocks.
    pub blocks: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// Operations measured.
    pub ops: u64,
    /// Seconds the point took.
    pub seconds: f64,
    /// Median response time, ms.
    pub p50_response_ms: f64,
    /// Store read requests per operation.
    pub read_requests_per_op: f64,
    /// Store write requests per operation.
    pub write_requests_per_op: f64,
    /// Trusted memory over the logical data.
    pub trusted_per_logical_byte: f64,
    /// Bytes the stores hold.
    pub store_bytes: u64,
    /// Bytes the stores hold over the logical data.
    pub store_per_logical_byte: f64,
    /// Where it ran.
    pub machine: String,
    /// The floor this machine sets for the point's bytes (every byte written sealed, every
    /// byte read opened) and one round trip per operation, overlapped across the clients; and
    /// the share of it reached.
    pub floor: Option<Floor>,
}

/// A point that could not run, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    /// Experiment.
    pub experiment: String,
    /// Engine.
    pub engine: String,
    /// Nodes.
    pub nodes: usize,
    /// Why.
    pub reason: String,
}

/// A target or a paper figure, and whether the rows meet it.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    /// What is asked.
    pub target: String,
    /// What was measured (or why nothing was).
    pub measured: String,
    /// `None`: not measured.
    pub met: Option<bool>,
}

/// The result of a run.
#[derive(Clone, Debug, Serialize)]
pub struct ObliviStoreReport {
    /// Where it ran.
    pub machine: Machine,
    /// Parameters.
    pub params: ObliviStoreBench,
    /// Every measured point.
    pub rows: Vec<Row>,
    /// Points that could not run.
    pub skipped: Vec<Skipped>,
    /// The seed's figures beside ours.
    pub paper: Vec<Verdict>,
    /// The targets.
    pub targets: Vec<Verdict>,
}

/// One node's link: the store behind a [`LatencyStore`] that can be changed between points.
#[derive(Debug)]
struct LinkSwitch {
    direct: Arc<dyn Store>,
    current: parking_lot::RwLock<Arc<dyn Store>>,
}

impl LinkSwitch {
    fn new(direct: Arc<dyn Store>, link: LinkConfig) -> Self {
        let s = Self { current: parking_lot::RwLock::new(Arc::clone(&direct)), direct };
        s.set(link);
        s
    }

    /// Requests from now on cross `link` (requests in flight finish on the old one).
    fn set(&self, link: LinkConfig) {
        let none = link.rtt.is_zero()
            && link.up_bits_per_sec.is_none()
            && link.down_bits_per_sec.is_none();
        *self.current.write() = if none {
            Arc::clone(&self.direct)
        } else {
            Arc::new(LatencyStore::new(Arc::clone(&self.direct), link))
        };
    }

    fn now(&self) -> Arc<dyn Store> {
        Arc::clone(&self.current.read())
    }
}

#[async_trait]
impl Store for LinkSwitch {
    fn geometry(&self) -> Geometry {
        self.direct.geometry()
    }
    async fn read(&self, cells: &[CellId]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        self.now().read(cells).await
    }
    async fn read_ranges(&self, r: &[ByteRange]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        self.now().read_ranges(r).await
    }
    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> blindfold_store::Result<()> {
        self.now().write(cells).await
    }
    async fn flush(&self) -> blindfold_store::Result<()> {
        self.now().flush().await
    }
}

/// One ORAM node's store: `backend → SeekCountingStore → link`.
#[derive(Debug)]
pub struct Node {
    counter: Arc<SeekCountingStore<Arc<dyn Store>>>,
    link: Arc<LinkSwitch>,
    bytes: u64,
}

impl Node {
    /// A fresh store of `geometry` (a file `dir/name.cells` for [`StoreKind::File`]) behind
    /// `link`.
    async fn new(
        kind: StoreKind,
        geometry: Geometry,
        link: LinkConfig,
        dir: &Path,
        name: &str,
    ) -> Result<Self> {
        let backend: Arc<dyn Store> = match kind {
            StoreKind::Memory => Arc::new(MemoryStore::new(geometry)),
            StoreKind::File => {
                let path = dir.join(format!("{name}.cells"));
                let fs = tokio::task::spawn_blocking(move || {
                    FileStore::create_or_open(&path, geometry, SyncMode::None)
                })
                .await
                .context("creating the cell file")??;
                Arc::new(fs)
            }
        };
        let counter = Arc::new(SeekCountingStore::new(backend));
        let link = Arc::new(LinkSwitch::new(Arc::clone(&counter) as Arc<dyn Store>, link));
        Ok(Self { counter, link, bytes: geometry.total_bytes() })
    }

    /// What the engine talks to.
    fn store(&self) -> Arc<dyn Store> {
        Arc::clone(&self.link) as Arc<dyn Store>
    }
}

/// An engine ready to measure, with its nodes' stores.
#[derive(Debug)]
pub struct Built {
    /// The engine, as the gateway's object layer sees it.
    pub engine: Arc<dyn SharedEngine>,
    nodes: Vec<Node>,
    /// ObliviStore and CURIOUS evict in the background: wait for them before counting.
    oblivistore: Vec<DurableObliviStore>,
    /// The ORAM nodes' gRPC servers (more than one node), stopped when this is dropped.
    _servers: Vec<(tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>)>,
    _dir: tempfile::TempDir,
}

impl Built {
    /// Every node's link becomes `link`.
    pub fn set_link(&self, link: LinkConfig) {
        for n in &self.nodes {
            n.link.set(link);
        }
    }

    /// The stores' counters, all nodes together.
    pub fn counts(&self) -> SeekCounts {
        self.nodes.iter().fold(SeekCounts::default(), |a, n| a.plus(&n.counter.counts()))
    }

    /// Bytes the stores hold.
    pub fn store_bytes(&self) -> u64 {
        self.nodes.iter().map(|n| n.bytes).sum()
    }

    /// Commits, and waits until the work already caused has landed.
    pub async fn settle(&self) -> Result<()> {
        self.engine.commit().await?;
        for o in &self.oblivistore {
            o.settle().await?;
        }
        Ok(())
    }
}

/// Builds engine `name` over `nodes` ORAM nodes, each with a fresh store of `kind` behind
/// `link`, for `blocks` blocks of `block_size` bytes; its state and files go to a temporary
/// directory under `work_dir`, removed when the result is dropped.
///
/// One node is the engine itself; with more, see [`build_balanced`].
pub async fn build_engine(
    name: &str,
    nodes: usize,
    link: LinkConfig,
    kind: StoreKind,
    blocks: u64,
    block_size: u32,
    work_dir: &Path,
) -> Result<Built> {
    if nodes != 1 {
        return build_balanced(name, nodes, link, kind, blocks, block_size, work_dir).await;
    }
    let dir = engine_dir(name, work_dir)?;
    let key = MasterKey::generate();
    let (engine, node, oblivistore) =
        one_engine(name, kind, link, dir.path(), "node0", blocks, block_size, &key).await?;
    Ok(Built {
        engine,
        nodes: vec![node],
        oblivistore: oblivistore.into_iter().collect(),
        _servers: Vec::new(),
        _dir: dir,
    })
}

/// Checks `name` and makes a temporary directory for its state under `work_dir`.
fn engine_dir(name: &str, work_dir: &Path) -> Result<tempfile::TempDir> {
    if !ENGINES.contains(&name) {
        bail!("unknown engine {name:?}: {}", ENGINES.join(", "));
    }
    std::fs::create_dir_all(work_dir)
        .with_context(|| format!("creating {}", work_dir.display()))?;
    Ok(tempfile::Builder::new().prefix("bench-oblivistore-").tempdir_in(work_dir)?)
}

/// As [`build_engine`], but always through the load balancer, one node included (the
/// baseline of the scaling experiment): each node is the engine behind a gRPC server with
/// mutual TLS on loopback, and the result is the oblivious load balancer of
/// `blindfold serve --nodes`.
pub async fn build_balanced(
    name: &str,
    nodes: usize,
    link: LinkConfig,
    kind: StoreKind,
    blocks: u64,
    block_size: u32,
    work_dir: &Path,
) -> Result<Built> {
    if nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    let dir = engine_dir(name, work_dir)?;
    let key = MasterKey::generate();
    // ObliviStore's distributed setting: `nodes` ORAM nodes (each its own engine, store and
    // link) served over mutually authenticated gRPC on loopback, the oblivious load balancer
    // of `blindfold serve --nodes` in front.
    let hosts = vec!["127.0.0.1".to_string(); nodes];
    let certs = dir.path().join("certs");
    blindfold_node::write_cluster_certs(&certs, &hosts)?;
    let per_node = blindfold_node::balancer::node_blocks_needed(blocks, nodes) + 8;
    let (mut built_nodes, mut engines, mut urls, mut servers) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..nodes {
        let label = format!("node{i}");
        let node_key = MasterKey::generate();
        let (engine, node, oblivistore) =
            one_engine(name, kind, link, dir.path(), &label, per_node, block_size, &node_key)
                .await?;
        let info = blindfold_node::wire::NodeInfo {
            id: StoreId::random().0,
            blocks: per_node,
            block_size,
            instance: rand::random(),
        };
        let service = blindfold_node::node::NodeService::new(engine, info);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        urls.push(format!("https://{}", listener.local_addr()?));
        let tls = blindfold_node::ClusterTls::load(&certs.join(format!("node-{}", i + 1)))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        servers.push((
            stop,
            tokio::spawn(async move {
                let _ = blindfold_node::node::serve(service, listener, &tls, async move {
                    let _ = stopped.await;
                })
                .await;
            }),
        ));
        built_nodes.push(node);
        engines.extend(oblivistore);
    }
    let tls = blindfold_node::ClusterTls::load(&certs.join("balancer"))?;
    let balancer = blindfold_node::Balancer::open(
        &dir.path().join("balancer"),
        &urls,
        &tls,
        blocks,
        block_size,
        &key,
        true,
        blindfold_node::BalancerConfig::default(),
    )
    .await?;
    Ok(Built {
        engine: Arc::new(balancer),
        nodes: built_nodes,
        oblivistore: engines,
        _servers: servers,
        _dir: dir,
    })
}

/// One engine `name` over a fresh store of `kind` behind `link` (`dir/label.cells` for files).
#[allow(clippy::too_many_arguments)]
async fn one_engine(
    name: &str,
    kind: StoreKind,
    link: LinkConfig,
    dir: &Path,
    label: &str,
    blocks: u64,
    block_size: u32,
    key: &MasterKey,
) -> Result<(Arc<dyn SharedEngine>, Node, Option<DurableObliviStore>)> {
    let state = dir.join(format!("{label}-state"));
    let id = StoreId::random();
    if name == "tao" {
        let config = TaoConfig::builder(blocks, block_size).build()?;
        let node = Node::new(kind, DurableTao::geometry(&config)?, link, dir, label).await?;
        let e = DurableTao::create(&state, config, node.store(), key, id).await?;
        return Ok((Arc::new(e), node, None));
    }
    let config = if name == "curious" {
        ObliviStoreConfig::curious(blocks, block_size, blindfold_gateway::server::CURIOUS_B)?
    } else if name == "curious-path" {
        use blindfold_gateway::server::{CURIOUS_B, CURIOUS_Z};
        ObliviStoreConfig::curious_path(blocks, block_size, CURIOUS_B, CURIOUS_Z)?
    } else {
        ObliviStoreConfig::new(blocks, block_size)?
    };
    let node = Node::new(kind, DurableObliviStore::geometry(&config)?, link, dir, label).await?;
    let e =
        DurableObliviStore::create(&state, config, node.store(), key, id, &mut |_, _| {}).await?;
    Ok((Arc::new(e.clone()), node, Some(e)))
}

fn block_data(block: u64, salt: u64, size: usize) -> Vec<u8> {
    let mut v = vec![0u8; size];
    v[..8].copy_from_slice(&block.to_le_bytes());
    v[8..16].copy_from_slice(&salt.to_le_bytes());
    v
}

/// Writes every block once (over whatever link is set), then commits.
async fn fill(b: &Built, p: &ObliviStoreBench, what: &str) -> Result<()> {
    let per = b.engine.batch_blocks().max(1) as u64;
    let pb = bar(p.blocks, what, p.progress);
    let size = p.block_size as usize;
    let engine = &b.engine;
    let mut done = futures::stream::iter((0..p.blocks).step_by(per as usize))
        .map(|start| {
            let batch: Vec<_> = (start..(start + per).min(p.blocks))
                .map(|i| (BlockId(i), block_data(i, 0, size)))
                .collect();
            let n = batch.len() as u64;
            async move { engine.write_many(batch).await.map(|()| n) }
        })
        .buffer_unordered(8);
    while let Some(n) = done.next().await {
        pb.inc(n?);
    }
    b.settle().await?;
    pb.finish_and_clear();
    let warm = ObliviStoreBench { ops: (p.ops / 4).max(1), ..p.clone() };
    measure(b, p.clients.unwrap_or(64), &warm, "warming up").await?;
    Ok(())
}

struct Measured {
    latencies_us: Vec<u64>,
    seconds: f64,
    counts: SeekCounts,
    trusted_max: u64,
}

/// Runs `clients` closed-loop clients against `b` until `p.ops` operations or
/// `p.max_seconds`; then lets the work they caused land.
async fn measure(b: &Built, clients: usize, p: &ObliviStoreBench, what: &str) -> Result<Measured> {
    let before = b.counts();
    let stop = Arc::new(AtomicBool::new(false));
    let committer = {
        let (engine, stop) = (Arc::clone(&b.engine), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut max = engine.gauges().trusted_bytes;
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(COMMIT_EVERY).await;
                max = max.max(engine.gauges().trusted_bytes);
                engine.commit().await?;
            }
            anyhow::Ok(max)
        })
    };
    let pb = bar(p.ops, what, p.progress);
    let issued = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(p.max_seconds);
    let mut tasks = Vec::with_capacity(clients);
    for c in 0..clients {
        let (engine, issued, pb) = (Arc::clone(&b.engine), Arc::clone(&issued), pb.clone());
        let (ops, blocks, size, read_ratio) =
            (p.ops, p.blocks, p.block_size as usize, p.read_ratio);
        let mut rng = ChaCha8Rng::seed_from_u64(p.seed ^ ((c as u64 + 1) << 24));
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline && issued.fetch_add(1, Ordering::SeqCst) < ops {
                let block = rng.gen_range(0..blocks);
                let t0 = Instant::now();
                if rng.gen_bool(read_ratio) {
                    let got = engine.read_many(&[BlockId(block)]).await?;
                    if got.first().map(|d| &d[..8]) != Some(&block.to_le_bytes()[..]) {
                        bail!("block {block} came back wrong");
                    }
                } else {
                    let data = block_data(block, rng.gen(), size);
                    engine.write_many(vec![(BlockId(block), data)]).await?;
                }
                lat.push(t0.elapsed().as_micros() as u64);
                pb.inc(1);
            }
            anyhow::Ok(lat)
        }));
    }
    let mut latencies_us = Vec::new();
    let mut failed = None;
    for t in tasks {
        match t.await.context("client task") {
            Ok(Ok(l)) => latencies_us.extend(l),
            Ok(Err(e)) | Err(e) => failed = failed.or(Some(e)),
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    let trusted = committer.await.context("committer task")??;
    if let Some(e) = failed {
        return Err(e);
    }
    let trusted_max = trusted.max(b.engine.gauges().trusted_bytes);
    b.settle().await?;
    pb.finish_and_clear();
    latencies_us.sort_unstable();
    Ok(Measured { latencies_us, seconds, counts: b.counts().since(&before), trusted_max })
}

fn percentile_ms(sorted_us: &[u64], q: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    sorted_us[((sorted_us.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0
}

#[allow(clippy::too_many_arguments)]
fn row(
    experiment: &str,
    engine: &str,
    nodes: usize,
    rtt_ms: u64,
    clients: usize,
    kind: StoreKind,
    b: &Built,
    m: &Measured,
    p: &ObliviStoreBench,
    machine: &Machine,
) -> Row {
    let ops = m.latencies_us.len() as u64;
    let per_op = |v: u64| if ops == 0 { 0.0 } else { v as f64 / ops as f64 };
    let logical = p.logical_bytes() as f64;
    let bs = u64::from(p.block_size);
    Row {
        engine: engine.into(),
        nodes,
        rtt_ms,
        clients,
        ops_per_sec: ops as f64 / m.seconds,
        mb_per_sec: (ops * bs) as f64 / m.seconds / 1e6,
        mean_response_ms: if ops == 0 {
            0.0
        } else {
            m.latencies_us.iter().sum::<u64>() as f64 / ops as f64 / 1000.0
        },
        p99_response_ms: percentile_ms(&m.latencies_us, 0.99),
        blowup: per_op(m.counts.bytes_read + m.counts.bytes_written) / bs as f64,
        seeks_per_op: per_op(m.counts.seeks),
        trusted_bytes: m.trusted_max,
        experiment: experiment.into(),
        store: kind,
        blocks: p.blocks,
        block_size: p.block_size,
        ops,
        seconds: m.seconds,
        p50_response_ms: percentile_ms(&m.latencies_us, 0.5),
        read_requests_per_op: per_op(m.counts.read_requests),
        write_requests_per_op: per_op(m.counts.write_requests),
        trusted_per_logical_byte: m.trusted_max as f64 / logical,
        store_bytes: b.store_bytes(),
        store_per_logical_byte: b.store_bytes() as f64 / logical,
        machine: machine.summary(),
        floor: None,
    }
}

/// `n` nodes' links as one for the floor: each node has a link of its own, and the load
/// balancer spreads the bytes evenly over the nodes (its node choice is uniform), so together
/// they carry `n` times one link's bandwidth at the same round trip. (Counting one link for
/// all the nodes made two nodes look like 156 % of their floor.)
fn links_of(link: LinkConfig, n: usize) -> LinkConfig {
    let times = |b: Option<u64>| b.map(|b| b.saturating_mul(n.max(1) as u64));
    LinkConfig {
        up_bits_per_sec: times(link.up_bits_per_sec),
        down_bits_per_sec: times(link.down_bits_per_sec),
        ..link
    }
}

/// Limits measured once per backend used in a run.
struct FloorLimits {
    cell_size: u32,
    work_dir: PathBuf,
    memory: Option<Limits>,
    file: Option<Limits>,
}

impl FloorLimits {
    /// `r` with its floor: the limits of its backend behind `link`.
    async fn add(&mut self, mut r: Row, m: &Measured, link: LinkConfig) -> Result<Row> {
        let (slot, url) = match r.store {
            StoreKind::Memory => (&mut self.memory, StoreUrl::Memory),
            StoreKind::File => (
                &mut self.file,
                StoreUrl::File { dir: self.work_dir.clone(), sync: SyncMode::None },
            ),
        };
        if slot.is_none() {
            *slot = Some(
                crate::floor::measure(&FloorParams::new(self.cell_size).with_store(&url)).await?,
            );
        }
        let mut limits = slot.clone().expect("measured above");
        limits.link = Some(link.into());
        let ops = r.ops.max(1) as f64;
        let op = PerOp::from_bytes(
            m.counts.bytes_written as f64 / ops,
            m.counts.bytes_read as f64 / ops,
            1.0,
            r.clients,
            limits.cores,
        );
        r.floor = Some(Floor::of(&limits, &op, r.ops_per_sec));
        Ok(r)
    }
}

fn say(p: &ObliviStoreBench, line: String) {
    if p.progress {
        eprintln!("{line}");
    }
}

/// Runs the three experiments (inside a multi-threaded tokio runtime).
pub async fn run(p: &ObliviStoreBench) -> Result<ObliviStoreReport> {
    if p.engines.is_empty() {
        bail!("no engine to measure: --engines takes {}", ENGINES.join(", "));
    }
    if let Some(e) = p.engines.iter().find(|e| !ENGINES.contains(&e.as_str())) {
        bail!("unknown engine {e:?}: --engines takes {}", ENGINES.join(", "));
    }
    if p.nodes.contains(&0) {
        bail!("--nodes must be at least 1");
    }
    if p.block_size < 16 {
        bail!("blocks must be at least 16 bytes");
    }
    if p.blocks == 0 || p.ops == 0 || p.clients == Some(0) {
        bail!("--blocks, --ops and --clients must be at least 1");
    }
    if p.max_seconds.is_nan() || p.max_seconds <= 0.0 {
        bail!("the time per point must be positive");
    }
    if !(0.0..=1.0).contains(&p.read_ratio) {
        bail!("the read ratio must be between 0 and 1");
    }
    p.link(0).validate()?;
    p.nodes_link().validate()?;
    let machine = Machine::current();
    let mut floors = FloorLimits {
        // The partition engines seal one block per cell.
        cell_size: p.block_size + CellSealer::OVERHEAD as u32,
        work_dir: p.work_dir.clone(),
        memory: None,
        file: None,
    };
    let mut rows: Vec<Row> = Vec::new();
    let mut skipped = Vec::new();
    let none = LinkConfig::unlimited(Duration::ZERO);
    let clients = |name: &str, rtt: u64| p.clients.unwrap_or_else(|| clients_for(name, rtt));
    let skip = |skipped: &mut Vec<Skipped>, experiment: &str, engine: &str, nodes, e: String| {
        say(p, format!("  {experiment}: {engine} at {nodes} node(s) skipped: {e}"));
        skipped.push(Skipped {
            experiment: experiment.into(),
            engine: engine.into(),
            nodes,
            reason: e,
        });
    };
    for name in &p.engines {
        let name = name.as_str();
        // Experiment 1.
        say(p, format!("{name}: {} blocks of {} B on {}", p.blocks, p.block_size, p.store));
        match build_engine(name, 1, none, p.store, p.blocks, p.block_size, &p.work_dir).await {
            Err(e) => skip(&mut skipped, "latency", name, 1, format!("{e:#}")),
            Ok(b) => {
                fill(&b, p, &format!("filling {name}")).await?;
                for &rtt in &p.rtts_ms {
                    b.set_link(p.link(rtt));
                    let c = clients(name, rtt);
                    let m = measure(&b, c, p, &format!("{name} {rtt} ms")).await?;
                    let r = row("latency", name, 1, rtt, c, p.store, &b, &m, p, &machine);
                    let r = floors.add(r, &m, p.link(rtt)).await?;
                    say(p, line(&r));
                    rows.push(r);
                }
            }
        }
        // Experiment 3, every node count through the load balancer.
        for &n in &p.nodes {
            let link = p.nodes_link();
            match build_balanced(name, n, none, p.store, p.blocks, p.block_size, &p.work_dir).await
            {
                Err(e) => skip(&mut skipped, "nodes", name, n, format!("{e:#}")),
                Ok(b) => {
                    fill(&b, p, &format!("filling {name} ×{n}")).await?;
                    b.set_link(link);
                    let c = n * clients(name, p.nodes_rtt_ms);
                    let m = measure(&b, c, p, &format!("{name} {n} nodes")).await?;
                    let r = row("nodes", name, n, p.nodes_rtt_ms, c, p.store, &b, &m, p, &machine);
                    let r = floors.add(r, &m, links_of(link, n)).await?;
                    say(p, line(&r));
                    rows.push(r);
                }
            }
        }
        // Experiment 2: seeks on the file backend, no link.
        if p.seeks {
            let same = rows
                .iter()
                .find(|r| {
                    r.engine == name
                        && r.experiment == "latency"
                        && r.store == StoreKind::File
                        && r.rtt_ms == 0
                })
                .cloned();
            if let Some(r) = same {
                rows.push(Row { experiment: "seeks".into(), ..r });
                continue;
            }
            match build_engine(name, 1, none, StoreKind::File, p.blocks, p.block_size, &p.work_dir)
                .await
            {
                Err(e) => skip(&mut skipped, "seeks", name, 1, format!("{e:#}")),
                Ok(b) => {
                    fill(&b, p, &format!("filling {name} (file)")).await?;
                    let c = clients(name, 0);
                    let m = measure(&b, c, p, &format!("{name} file")).await?;
                    let r = row("seeks", name, 1, 0, c, StoreKind::File, &b, &m, p, &machine);
                    let r = floors.add(r, &m, none).await?;
                    say(p, line(&r));
                    rows.push(r);
                }
            }
        }
    }
    let (paper, targets) = verdicts(&rows, p);
    Ok(ObliviStoreReport { machine, params: p.clone(), rows, skipped, paper, targets })
}

fn line(r: &Row) -> String {
    format!(
        "  {:<7} {:<12} {:>2} node(s) {:>5} ms {:>5} clients: {:>8.1} ops/s {:>7.2} MB/s, mean \
         {:.1} ms, p99 {:.1} ms, {:.1}× blow-up, {:.1} seeks/op{}",
        r.experiment,
        r.engine,
        r.nodes,
        r.rtt_ms,
        r.clients,
        r.ops_per_sec,
        r.mb_per_sec,
        r.mean_response_ms,
        r.p99_response_ms,
        r.blowup,
        r.seeks_per_op,
        r.floor.as_ref().map_or(String::new(), |f| format!(
            ", {:.1} % of a {} floor of {:.0} ops/s",
            f.of_floor * 100.0,
            f.bound,
            f.ops_per_sec
        )),
    )
}

fn best<'a>(rows: impl Iterator<Item = &'a Row>) -> Option<&'a Row> {
    rows.max_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec))
}

/// The seed's figures and the targets, checked against `rows`.
fn verdicts(rows: &[Row], p: &ObliviStoreBench) -> (Vec<Verdict>, Vec<Verdict>) {
    use reference::*;
    let os = |r: &&Row| r.engine == "oblivistore";
    let mut paper = Vec::new();
    let top = best(rows.iter().filter(os));
    paper.push(Verdict {
        target: format!(
            "{PAPER_MB_PER_SEC} MB/s of 4 KB blocks with 10 ORAM nodes + 1 load balancer \
             (11 machines, 20 SSDs)"
        ),
        measured: top.map_or("ObliviStore not measured".into(), |r| {
            format!(
                "ObliviStore {:.1} MB/s on one 2-core machine ({} ms, {} node(s), {})",
                r.mb_per_sec, r.rtt_ms, r.nodes, r.store
            )
        }),
        met: top.map(|r| r.mb_per_sec >= PAPER_MB_PER_SEC),
    });
    let seeks = rows.iter().find(|r| r.engine == "oblivistore" && r.experiment == "seeks");
    paper.push(Verdict {
        target: format!("under {PAPER_SEEKS_PER_OP} seeks per operation (Figure 7, 1–10 TB)"),
        measured: seeks.map_or("not measured".into(), |r| {
            format!("ObliviStore {:.2} seeks/op on the file backend", r.seeks_per_op)
        }),
        met: seeks.map(|r| r.seeks_per_op < PAPER_SEEKS_PER_OP),
    });
    let over: Vec<String> = rows
        .iter()
        .filter(|r| os(r) && r.experiment == "latency" && r.rtt_ms > 0)
        .map(|r| format!("{:.0}", r.mean_response_ms - r.rtt_ms as f64))
        .collect();
    let (lo, hi) = PAPER_HDD_OVERHEAD_MS;
    paper.push(Verdict {
        target: format!("response time {lo}–{hi} ms + RTT with 7 HDDs (Figure 5)"),
        measured: if over.is_empty() {
            "not measured (no round trip above 0)".into()
        } else {
            format!("ObliviStore: RTT + {} ms (mean, by round trip)", over.join(" / "))
        },
        met: None,
    });

    let mut targets = Vec::new();
    targets.push(Verdict {
        target: format!("ObliviStore ≥ {TARGET_MB_PER_SEC} MB/s on this machine"),
        measured: top.map_or("ObliviStore not measured".into(), |r| {
            format!("{:.1} MB/s ({:.0} ops/s at {} ms)", r.mb_per_sec, r.ops_per_sec, r.rtt_ms)
        }),
        met: top.map(|r| r.mb_per_sec >= TARGET_MB_PER_SEC),
    });
    for (engine, (rate, blow)) in [
        ("oblivistore", JAVA_OBLIVISTORE),
        ("curious", JAVA_CURIOUS),
        ("curious-path", JAVA_CURIOUS),
    ] {
        let want = TARGET_FACTOR * rate;
        let same_kind = |r: &&Row| {
            r.engine == engine
                && r.experiment == "latency"
                && r.store == StoreKind::Memory
                && r.rtt_ms == 0
                && r.nodes == 1
        };
        let r = best(rows.iter().filter(same_kind));
        let size_note = if p.blocks == 1 << 16 && p.block_size == 4096 {
            String::new()
        } else {
            format!("; {} blocks of {} B, the port ran 2^16 × 4 KiB", p.blocks, p.block_size)
        };
        targets.push(Verdict {
            target: format!(
                "{engine} ≥ {want:.0} req/s ({TARGET_FACTOR}× the Java port's {rate}) at ≤ {blow}× \
                 bandwidth, memory, no link"
            ),
            measured: r.map_or(format!("{engine} not measured at 0 ms in memory"), |r| {
                format!("{:.0} req/s at {:.1}×{size_note}", r.ops_per_sec, r.blowup)
            }),
            met: r.map(|r| r.ops_per_sec >= want && r.blowup <= blow),
        });
    }
    let one = rows.iter().find(|r| os(r) && r.experiment == "nodes" && r.nodes == 1);
    let more: Vec<&Row> =
        rows.iter().filter(|r| os(r) && r.experiment == "nodes" && r.nodes > 1).collect();
    targets.push(Verdict {
        target: format!(
            "ObliviStore's aggregate throughput nearly linear in the nodes while the per-node link \
             is the bottleneck (≥ {}·n × one node's, all behind the load balancer; per-node link \
             {} ms, {})",
            LINEAR_SHARE,
            p.nodes_rtt_ms,
            bandwidth(p.nodes_mbit),
        ),
        measured: match (one, more.is_empty()) {
            (Some(o), false) => more
                .iter()
                .map(|r| {
                    format!("{} nodes: {:.2}× one node", r.nodes, r.ops_per_sec / o.ops_per_sec)
                })
                .collect::<Vec<_>>()
                .join(", "),
            _ => "not measured: no run with more than one node".into(),
        },
        met: one.filter(|_| !more.is_empty()).map(|o| {
            more.iter().all(|r| r.ops_per_sec >= LINEAR_SHARE * r.nodes as f64 * o.ops_per_sec)
        }),
    });
    (paper, targets)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

fn mark(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "-",
    }
}

/// The report as tables.
pub fn render(r: &ObliviStoreReport) -> String {
    let p = &r.params;
    let mut s = String::new();
    let _ = writeln!(s, "blindfold bench oblivistore{}", if p.quick { " --quick" } else { "" });
    let _ = writeln!(s, "  machine: {}", r.machine.summary());
    let _ = writeln!(
        s,
        "  {} blocks of {} B ({}{}), every block written first; {:.0} % reads; uniform blocks",
        p.blocks,
        p.block_size,
        mib(p.logical_bytes()),
        if p.quick { ", reduced for --quick" } else { "" },
        p.read_ratio * 100.0
    );
    let _ = writeln!(
        s,
        "  closed-loop clients per node: {}; each point: {} ops or {} s, whichever first; \
         commits every {} ms",
        p.clients.map_or(
            format!(
                "64 + 4 per ms of round trip, at most 4096 (oblivistore: at most {})",
                OBLIVISTORE_CLIENTS
            ),
            |c| c.to_string()
        ),
        p.ops,
        p.max_seconds,
        COMMIT_EVERY.as_millis()
    );
    let _ = writeln!(
        s,
        "  links: {}; nodes experiment (all through the load balancer) at {} ms and {} per \
         node; seeks on the file backend",
        bandwidth(p.mbit),
        p.nodes_rtt_ms,
        bandwidth(p.nodes_mbit)
    );
    let _ = writeln!(
        s,
        "\n  {:<8} {:<12} {:>5} {:>6} {:>7} {:<6} {:>9} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7} {:>10}",
        "exp",
        "engine",
        "nodes",
        "rtt ms",
        "clients",
        "store",
        "ops/s",
        "MB/s",
        "mean ms",
        "p50 ms",
        "p99 ms",
        "blowup",
        "seeks",
        "trusted"
    );
    for x in &r.rows {
        let _ = writeln!(
            s,
            "  {:<8} {:<12} {:>5} {:>6} {:>7} {:<6} {:>9.1} {:>7.2} {:>8.1} {:>8.1} {:>8.1} {:>6.1}× {:>7.2} {:>10}",
            x.experiment,
            x.engine,
            x.nodes,
            x.rtt_ms,
            x.clients,
            x.store.to_string(),
            x.ops_per_sec,
            x.mb_per_sec,
            x.mean_response_ms,
            x.p50_response_ms,
            x.p99_response_ms,
            x.blowup,
            x.seeks_per_op,
            mib(x.trusted_bytes)
        );
    }
    if !r.skipped.is_empty() {
        let _ = writeln!(s, "\n  not run:");
        for k in &r.skipped {
            let _ = writeln!(
                s,
                "    {} {} at {} node(s): {}",
                k.experiment, k.engine, k.nodes, k.reason
            );
        }
    }
    let _ = writeln!(s, "\n  per logical byte (largest trusted memory over the points):");
    for e in ENGINES {
        let mine: Vec<&Row> = r.rows.iter().filter(|x| x.engine == e).collect();
        if let Some(first) = mine.iter().find(|x| x.nodes == 1).or(mine.first()) {
            let trusted = mine.iter().map(|x| x.trusted_per_logical_byte).fold(0.0, f64::max);
            let _ = writeln!(
                s,
                "    {:<12} store {:.2} B, trusted memory {:.4} B ({:.2} %)",
                e,
                first.store_per_logical_byte,
                trusted,
                trusted * 100.0
            );
        }
    }
    let _ =
        writeln!(s, "\n  published (ObliviStore, Stefanov and Shi, IEEE S&P 2013), for reference:");
    for v in &r.paper {
        let _ = writeln!(s, "    {:<8} {} — ours: {}", mark(v.met), v.target, v.measured);
    }
    let _ = writeln!(s, "\n  targets:");
    for v in &r.targets {
        let _ = writeln!(s, "    {:<8} {} — {}", mark(v.met), v.target, v.measured);
    }
    s
}

/// Writes `oblivistore.csv` and the plots into `dir`; returns the files written.
pub fn save(r: &ObliviStoreReport, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut out = Vec::new();
    let mut csv = String::from(
        "experiment,engine,nodes,rtt_ms,clients,store,blocks,block_size,ops,seconds,ops_per_sec,\
         mb_per_sec,mean_response_ms,p50_response_ms,p99_response_ms,blowup,seeks_per_op,\
         read_requests_per_op,write_requests_per_op,trusted_bytes,trusted_per_logical_byte,\
         store_bytes,store_per_logical_byte\n",
    );
    for x in &r.rows {
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{:.3},{:.3},{:.4},{:.3},{:.3},{:.3},{:.3},{:.4},{:.4},\
             {:.4},{},{:.6},{},{:.4}",
            x.experiment,
            x.engine,
            x.nodes,
            x.rtt_ms,
            x.clients,
            x.store,
            x.blocks,
            x.block_size,
            x.ops,
            x.seconds,
            x.ops_per_sec,
            x.mb_per_sec,
            x.mean_response_ms,
            x.p50_response_ms,
            x.p99_response_ms,
            x.blowup,
            x.seeks_per_op,
            x.read_requests_per_op,
            x.write_requests_per_op,
            x.trusted_bytes,
            x.trusted_per_logical_byte,
            x.store_bytes,
            x.store_per_logical_byte
        );
    }
    let p = dir.join("oblivistore.csv");
    std::fs::write(&p, csv).with_context(|| format!("writing {}", p.display()))?;
    out.push(p);

    let engines: Vec<&str> =
        ENGINES.into_iter().filter(|e| r.rows.iter().any(|x| x.engine == *e)).collect();
    let by = |exp: &str, x: fn(&Row) -> f64, y: fn(&Row) -> f64| -> Vec<Series> {
        engines
            .iter()
            .map(|e| {
                let mut pts: Vec<(f64, f64)> = r
                    .rows
                    .iter()
                    .filter(|r| r.engine == *e && r.experiment == exp)
                    .map(|r| (x(r), y(r)))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                (e.to_string(), pts)
            })
            .collect()
    };
    let rtt = |r: &Row| r.rtt_ms as f64;
    let p = dir.join("throughput-by-rtt.svg");
    linear_plot(
        &p,
        "Throughput by network round trip (Figure 4)",
        "round trip (ms)",
        "ops/s",
        &by("latency", rtt, |r| r.ops_per_sec),
        &[],
        true,
    )?;
    out.push(p);
    let mut resp = by("latency", rtt, |r| r.mean_response_ms);
    let ideal = "ideal (= round trip)";
    let rtts: Vec<f64> = {
        let mut v: Vec<f64> = r.params.rtts_ms.iter().map(|&x| x as f64).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    resp.push((ideal.into(), rtts.iter().map(|&x| (x, x)).collect()));
    let p = dir.join("response-time-by-rtt.svg");
    linear_plot(
        &p,
        "Mean response time by network round trip (Figure 5)",
        "round trip (ms)",
        "ms",
        &resp,
        &[ideal],
        true,
    )?;
    out.push(p);
    let seek_rows: Vec<&Row> = r.rows.iter().filter(|x| x.experiment == "seeks").collect();
    let groups: Vec<String> = seek_rows.iter().map(|x| x.engine.clone()).collect();
    let p = dir.join("seeks-per-op.svg");
    bar_plot(
        &p,
        "Seeks per operation, file backend (Figure 7)",
        "seeks per operation",
        &groups,
        &[
            ("measured".into(), seek_rows.iter().map(|x| Some(x.seeks_per_op)).collect()),
            (
                "paper: under 10".into(),
                seek_rows
                    .iter()
                    .map(|x| (x.engine == "oblivistore").then_some(reference::PAPER_SEEKS_PER_OP))
                    .collect(),
            ),
        ],
    )?;
    out.push(p);
    let mut nodes = by("nodes", |r| r.nodes as f64, |r| r.ops_per_sec);
    let linear: Vec<Series> = nodes
        .iter()
        .filter_map(|(e, pts)| {
            let one = pts.iter().find(|p| p.0 == 1.0)?.1;
            let mut ns: Vec<f64> = r.params.nodes.iter().map(|&n| n as f64).collect();
            ns.sort_by(f64::total_cmp);
            Some((format!("{e}: linear"), ns.into_iter().map(|n| (n, n * one)).collect()))
        })
        .collect();
    let dashed: Vec<String> = linear.iter().map(|s| s.0.clone()).collect();
    nodes.extend(linear);
    let dashed: Vec<&str> = dashed.iter().map(String::as_str).collect();
    let p = dir.join("throughput-by-nodes.svg");
    linear_plot(
        &p,
        "Aggregate throughput by number of ORAM nodes (Figure 6)",
        "ORAM nodes",
        "ops/s",
        &nodes,
        &dashed,
        false,
    )?;
    out.push(p);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn n_nodes_links_carry_n_times_the_bandwidth_at_the_same_round_trip() {
        let one = LinkConfig::wan(50, 100);
        let four = links_of(one, 4);
        assert_eq!(four.rtt, one.rtt);
        assert_eq!(four.up_bits_per_sec, Some(400_000_000));
        assert_eq!(four.down_bits_per_sec, Some(400_000_000));
        assert_eq!(links_of(LinkConfig::unlimited(one.rtt), 4), LinkConfig::unlimited(one.rtt));
        assert_eq!(links_of(one, 1), one);
    }
}
