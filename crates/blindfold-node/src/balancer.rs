//! The oblivious load balancer: a [`SharedEngine`] whose blocks live on ORAM nodes.
//!
//! # Design
//!
//! The balancer keeps, in trusted memory and its state directory, a position map from each
//! logical block to its place `(node, local id)`, or to the *eviction cache* when the balancer
//! holds the block itself. Each node's engine holds `0..blocks` local ids; the top
//! [`DUMMY_IDS`] of them are the node's dummy ids, never given to a block; the others are
//! handed out from a per-node free list.
//!
//! Every logical access, read or write, whatever the block:
//!
//! 1. reads one block from the node the block is assigned to: from its place if it is on a
//!    node, else (the block waits in the cache, or its read by an earlier access is in
//!    flight) a *fake read* of a random local id on the node the cache assigned it to; a
//!    block never written is read (fakely) from a uniformly random node. Then the block is in
//!    the cache, assigned a fresh, secret, uniformly random node; the local id it came from is
//!    freed at the next commit;
//! 2. makes `ν` *evictions* (ObliviStore's eviction cache, `ν` = `evictions_per_access`,
//!    default 2): each picks a node uniformly at random and writes to it a cached block
//!    assigned to that node (at a local id from its free list) if there is one, else a dummy
//!    block to one of its dummy ids.
//!
//! So an access sends exactly one block read and `ν` block writes. The writes go to nodes
//! drawn uniformly for the evictions, and a real write looks like a dummy one (same size,
//! encrypted). The read goes to the node the block's previous access drew, which no one has
//! seen: whether or not an eviction has carried the block there yet, the read goes there, so
//! it is uniform and independent of the evictions seen since. Two simpler designs leak here:
//! writing the block straight back to a random node at its access ties that write's node to
//! the block's next read, and making a fake read for a cached block at a *random* node (as
//! for a block never written) makes a block accessed again soon more likely to be read where
//! a recent eviction went (it is there only if such an eviction took it). The test
//! `node_choice_is_uniform_and_independent_of_the_blocks` checks both.
//!
//! A batch of `k` accesses sends one Access request to *every* node (empty ones too), holding
//! that node's share of the `k` reads and `νk` writes: the number of requests never varies, and
//! their sizes depend only on how many of the uniformly drawn reads and writes fell on each
//! node.
//!
//! No request names a local id twice among its reads or among its writes: a fake read draws
//! its id among those the batch does not read yet from that node, and each dummy eviction of a
//! batch to a node takes a dummy id of its own (a batch holds at most `DUMMY_IDS / ν`
//! accesses, so there are always enough). The node runs a request as exactly one batch of
//! engine reads and one of engine writes, so what its store sees per request depends only on
//! the request's counts. (Before, every dummy went to one id, and the node split a request at
//! a repeated id into several engine calls; how many evictions are dummies follows how full
//! the cache is, which follows the workload, so a node's store saw a block read again and
//! again as more requests per access. `node_stores_see_the_same_traffic_for_every_workload`
//! checks this over real nodes.)
//!
//! # Concurrent accesses to one block
//!
//! The second of two concurrent accesses to a block finds it in the cache (the first moved it
//! there when it was planned): it makes its fake read at once, at the node the first access
//! drew, and takes its answer from the first access's result (waiting for it if it has not
//! arrived). Nothing it sends waits for the first access.
//!
//! # Durability and crash obliviousness
//!
//! The state directory holds a sealed checkpoint and a redo log (the frame format of
//! `blindfold_proxy::state_file`). Before a batch's requests go out, an *intent* record names
//! its reads (node, local id, and the block with the new node it drew) and is fsynced
//! (group commit: concurrent batches share one fsync). A [`SharedEngine::commit`] waits for the
//! batches in flight, commits every node's engine, then logs a *commit* record with every block
//! whose place changed (its new place, or its data and node while it is in the cache); only
//! then are the old local ids freed, so a place a durable record names is never overwritten.
//! After a crash the balancer replays the commit records and then repeats every read of the
//! intents logged after the last one — the same reads the network saw, in the same shape — and
//! moves each block they had taken out of its place into the cache under the node its intent
//! drew. A block's next read therefore never goes to a place the network saw it read from.
//!
//! # Block digests (for `recover`)
//!
//! Whenever an eviction places a block on a node, the balancer records beside its place a
//! 16-byte keyed digest of (block id, data) ([`BlockDigestKey`], whose random key lives in the
//! sealed checkpoint); checkpoints and commit records carry it. After the loss of the state
//! directory, [`Balancer::recover`] (in the `recover` module) uses these digests to tell which
//! places of the snapshot's checkpoint still hold their block. Trusted memory grows by 16 bytes
//! per placed block (36 with its place, instead of 20). A block placed by a
//! version without digests keeps none until its next access places it again.
//!
//! # Growth
//!
//! A growth to `N` logical blocks ([`SharedEngine::grow_in_place`]) first makes room: with no
//! access in flight, every node holding fewer than [`node_blocks_needed`] local ids is asked to
//! grow (it rebuilds its own tree), and the new ids (the former dummy ids among them) join the
//! free lists; then, once the gateway has recorded the new capacity, the balancer serves `N`.
//! No block moves. A balancer opened for more blocks than its state holds finishes such a
//! growth (growing the nodes still too small); a node holding more ids than the state says is
//! taken as it is, one holding fewer is refused.
//!
//! # Security
//!
//! The network between balancer and nodes (TLS with the cluster's certificates) sees, per
//! batch, one request per node whose size gives that node's count of reads and writes, and
//! their timing. The nodes are trusted as in ObliviStore's distributed setting: each sees the
//! local ids it is asked for (its own ORAM hides them from its store). See SECURITY.md.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use blindfold_crypto::{BlockDigestKey, MasterKey, StateSealer};
use blindfold_oram::BlockId;
use blindfold_proxy::engine::EngineFactory;
use blindfold_proxy::state_file::{self, Frame as LogFrame};
use blindfold_proxy::{
    EngineGauges, InPlaceGrowth, ProxyError, Result, SharedEngine, VerifyReport,
};
use futures::future::LocalBoxFuture;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::certs::ClusterTls;
use crate::client::NodeClient;
use crate::wire::{Access, MAX_BLOCKS_PER_RPC};
use crate::NodeError;

/// Version 0002: places carry their block's digest and the checkpoint the digest key.
pub(crate) const CHECKPOINT_MAGIC: &[u8; 8] = b"BFLB0002";
/// Version 0001, still read: places without digests.
const CHECKPOINT_MAGIC_V1: &[u8; 8] = b"BFLB0001";
const COMMIT_MAGIC: u32 = 0xB1F0_1B01;
const INTENT_MAGIC: u32 = 0xB1F0_1B02;
/// The directory (inside the balancer's state directory) holding a recover's plan until the
/// recovered balancer is opened (`Balancer::recover`), which removes it.
pub const RECOVER_PLAN_DIR: &str = "recover-plan";
/// Public description of the cluster beside the checkpoint; its presence marks a data
/// directory whose blocks live on nodes.
pub const NODES_FILE: &str = "nodes.json";
/// Local ids at the top of every node kept for dummy evictions: each dummy of a batch writes
/// to one of its own, so a node never sees a local id twice in one request (and runs every
/// request as one read batch and one write batch, whatever the ids).
pub const DUMMY_IDS: u64 = 128;
/// Accesses planned together at most: `DUMMY_IDS / ν`, so that even a batch whose evictions
/// all fall on one node and are all dummies has a dummy id for each; larger batches are split
/// (by count only).
fn max_batch(evictions: u32) -> usize {
    (DUMMY_IDS / u64::from(evictions.max(1))).max(1) as usize
}

/// Options of a balancer.
#[derive(Clone, Debug)]
pub struct BalancerConfig {
    /// Evictions per access (ObliviStore's ν); at least 1. More keeps the cache smaller at the
    /// price of more writes.
    pub evictions_per_access: u32,
    /// Seed of the balancer's randomness (tests); `None` draws one from the OS.
    pub seed: Option<u64>,
    /// Keep a record of every request sent (what the network sees), for tests.
    pub record: bool,
    /// Redo log size after which a commit also writes a checkpoint.
    pub log_limit: u64,
}

impl Default for BalancerConfig {
    fn default() -> Self {
        Self { evictions_per_access: 2, seed: None, record: false, log_limit: 64 << 20 }
    }
}

/// One request as the network sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RpcRecord {
    /// The batch it belongs to.
    pub batch: u64,
    /// Accesses in the batch.
    pub accesses: usize,
    /// Index of the node.
    pub node: usize,
    /// Blocks read.
    pub reads: usize,
    /// Blocks written.
    pub writes: usize,
    /// Bytes of the request body.
    pub request_bytes: usize,
}

/// The local ids a node needs for a balancer of `blocks` logical blocks over `nodes` nodes:
/// its share, room for the random imbalance of uniform placement, and the dummy ids
/// ([`DUMMY_IDS`]).
pub fn node_blocks_needed(blocks: u64, nodes: usize) -> u64 {
    let share = blocks.div_ceil(nodes.max(1) as u64);
    let slack = ((share as f64).sqrt() * 4.0).ceil() as u64;
    share + slack.max(16) + DUMMY_IDS
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct NodeRecord {
    pub(crate) id: [u8; 16],
    pub(crate) blocks: u64,
}

/// A block's digest ([`BlockDigestKey::digest`]); `None` for a block placed by a version
/// that kept none.
pub(crate) type Digest = Option<[u8; 16]>;

#[derive(Serialize, Deserialize)]
pub(crate) struct Checkpoint {
    pub(crate) blocks: u64,
    pub(crate) block_size: u32,
    pub(crate) evictions: u32,
    pub(crate) nodes: Vec<NodeRecord>,
    pub(crate) placed: Vec<(u64, u32, u64, Digest)>,
    pub(crate) cached: Vec<(u64, u32, Vec<u8>)>,
    pub(crate) digest_key: [u8; 32],
}

/// The checkpoint of format 0001.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
pub(crate) struct CheckpointV1 {
    pub(crate) blocks: u64,
    pub(crate) block_size: u32,
    pub(crate) evictions: u32,
    pub(crate) nodes: Vec<NodeRecord>,
    pub(crate) placed: Vec<(u64, u32, u64)>,
    pub(crate) cached: Vec<(u64, u32, Vec<u8>)>,
}

/// Decodes checkpoint file bytes of either format (sealed under `sealer`); a checkpoint of
/// format 0001 gets a fresh digest key and no digests.
pub(crate) fn decode_checkpoint(
    buf: &[u8],
    sealer: &StateSealer,
) -> std::result::Result<Checkpoint, String> {
    if buf.starts_with(CHECKPOINT_MAGIC_V1) {
        let c: CheckpointV1 = state_file::decode_checkpoint(buf, CHECKPOINT_MAGIC_V1, sealer)?;
        let key = BlockDigestKey::generate().map_err(|e| e.to_string())?;
        return Ok(Checkpoint {
            blocks: c.blocks,
            block_size: c.block_size,
            evictions: c.evictions,
            nodes: c.nodes,
            placed: c.placed.into_iter().map(|(b, n, l)| (b, n, l, None)).collect(),
            cached: c.cached,
            digest_key: *key.expose_bytes(),
        });
    }
    state_file::decode_checkpoint(buf, CHECKPOINT_MAGIC, sealer)
}

/// Whether `buf` (a snapshot's engine checkpoint) is a balancer's, of any format.
pub fn is_balancer_checkpoint(buf: &[u8]) -> bool {
    buf.starts_with(CHECKPOINT_MAGIC) || buf.starts_with(CHECKPOINT_MAGIC_V1)
}

/// Refuses, saying what to do, a snapshot's engine checkpoint `buf` that is not a balancer's
/// (`recover --nodes` given the snapshot of a gateway whose blocks are in its own store).
pub fn expect_balancer_checkpoint(buf: &[u8]) -> std::result::Result<(), String> {
    if is_balancer_checkpoint(buf) {
        return Ok(());
    }
    Err("the snapshot is of a gateway that keeps its blocks in its own store, not on ORAM \
         nodes: recover it without --nodes and --tls-dir"
        .into())
}

// New variants go at the end: bincode numbers them in order, and old logs must still decode.
#[derive(Serialize, Deserialize)]
enum Entry {
    Placed(u32, u64),
    Cached(u32, Vec<u8>),
    /// Placed, with the block's digest.
    PlacedDigest(u32, u64, [u8; 16]),
}

#[derive(Serialize, Deserialize)]
struct CommitRecord {
    entries: Vec<(u64, Entry)>,
}

/// One read of a batch: node, local id, and the block with the node it drew (none for a
/// fake read of a block that stays unwritten).
type IntentRead = (u32, u64, Option<(u64, u32)>);

#[derive(Serialize, Deserialize)]
struct IntentRecord {
    /// (node, local id, for a real read: the block and its new node).
    reads: Vec<IntentRead>,
}

#[derive(Serialize, Deserialize)]
struct NodesFile {
    format: String,
    nodes: Vec<NodesFileEntry>,
}

#[derive(Serialize, Deserialize)]
struct NodesFileEntry {
    url: String,
    id: String,
    blocks: u64,
    /// The name the node's certificate proved (absent in files of older versions).
    #[serde(default)]
    name: Option<String>,
}

/// The result of a read in flight, for the accesses that wait for it.
type Loaded = Option<std::result::Result<Vec<u8>, String>>;
type Load = watch::Receiver<Loaded>;
/// A frame waiting for the log writer, and who to tell when it is durable.
type Queued =
    (Vec<u8>, tokio::sync::oneshot::Sender<std::result::Result<state_file::Mirrored, String>>);

struct Cached {
    /// The block's data; `None` while the read that fetches it is in flight.
    data: Option<Vec<u8>>,
    /// That read's result, for accesses that come meanwhile.
    load: Option<Load>,
    /// The node it goes to.
    assigned: u32,
    /// Bumped by every write, so an eviction of older data does not place the block.
    version: u64,
    evicting: bool,
}

struct State {
    rng: ChaCha20Rng,
    placed: HashMap<u64, (u32, u64)>,
    /// The digest of each placed block that has one.
    digests: HashMap<u64, [u8; 16]>,
    cache: HashMap<u64, Cached>,
    free: Vec<Vec<u64>>,
    /// Local ids freed at the next commit.
    pending_free: Vec<(u32, u64)>,
    /// Blocks whose place changed since the last commit.
    dirty: BTreeSet<u64>,
    batches: u64,
    /// Local ids each node holds (more after a growth).
    node_blocks: Vec<u64>,
}

enum Answer {
    Now(Vec<u8>),
    Read(usize, usize),
    Wait(Load),
    Written,
}

struct Plan {
    batch: u64,
    per_node: Vec<Access>,
    answers: Vec<Answer>,
    loads: Vec<(u64, usize, usize, watch::Sender<Loaded>)>,
    evictions: Vec<(u64, u32, u64, u64)>,
    intent: IntentRecord,
}

/// The redo log with group commit: whoever holds the file writes every frame queued so far
/// with one fsync. With a mirror attached to `tap` (the gateway's log in its store,
/// `--durability store`) the frames also go there, in log order, and an append returns once
/// both hold them; a checkpoint is handed to the mirror as the log is emptied.
struct LogWriter {
    dir: PathBuf,
    file: tokio::sync::Mutex<std::fs::File>,
    queue: parking_lot::Mutex<Vec<Queued>>,
    bytes: AtomicU64,
    tap: state_file::Tap,
}

impl LogWriter {
    fn open(dir: &Path) -> Result<Self> {
        let file = state_file::open_log(dir)?;
        let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(Self {
            dir: dir.to_path_buf(),
            file: tokio::sync::Mutex::new(file),
            queue: parking_lot::Mutex::new(Vec::new()),
            bytes: AtomicU64::new(bytes),
            tap: state_file::Tap::default(),
        })
    }

    async fn append(&self, frame: Vec<u8>) -> Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.queue.lock().push((frame, tx));
        {
            let file = self.file.lock().await;
            let batch = std::mem::take(&mut *self.queue.lock());
            if !batch.is_empty() {
                let (frames, senders): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
                // Queued to the mirror in log order under the file's lock; its round trip is
                // waited for after the lock is let go.
                let written =
                    state_file::append_frames_mirroring(&file, &self.dir, &self.tap, frames)
                        .await
                        .map_err(|e| e.to_string());
                let written = written.map(|(len, mirrored)| {
                    self.bytes.fetch_add(len, Ordering::SeqCst);
                    mirrored
                });
                for s in senders {
                    let _ = s.send(written.clone());
                }
            }
        }
        // (The error names the log's path already.)
        let mirrored = rx
            .await
            .map_err(|_| ProxyError::State("the redo log writer stopped".into()))?
            .map_err(ProxyError::State)?;
        mirrored.wait().await
    }

    /// Empties the log after a checkpoint, and hands the checkpoint to the mirror (with the
    /// file's lock held: no frame comes between them).
    async fn empty(&self) -> Result<()> {
        let file = self.file.lock().await;
        state_file::empty_log(&file, &self.dir)?;
        self.bytes.store(0, Ordering::SeqCst);
        self.tap.checkpointed(&self.dir).await
    }

    /// The log wants a checkpoint: it passed `limit` bytes, or its mirror is filling up.
    fn full(&self, limit: u64) -> bool {
        self.bytes.load(Ordering::SeqCst) > limit || self.tap.wants_checkpoint()
    }
}

/// The oblivious load balancer over ORAM nodes (see the module documentation).
pub struct Balancer {
    dir: PathBuf,
    nodes: Vec<NodeClient>,
    instances: Vec<u64>,
    /// Logical blocks (more after a growth).
    blocks: AtomicU64,
    block_size: usize,
    evictions: u32,
    sealer: Arc<StateSealer>,
    digest_key: BlockDigestKey,
    log: LogWriter,
    log_limit: u64,
    /// Accesses hold it shared; a commit holds it alone, so it sees no batch half done.
    quiet: tokio::sync::RwLock<()>,
    state: parking_lot::Mutex<State>,
    poisoned: AtomicBool,
    trace: Option<parking_lot::Mutex<Vec<RpcRecord>>>,
}

impl std::fmt::Debug for Balancer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balancer")
            .field("dir", &self.dir)
            .field("nodes", &self.nodes)
            .field("blocks", &self.blocks.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn state_err(e: impl std::fmt::Display) -> ProxyError {
    ProxyError::State(e.to_string())
}

pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Whether the ORAM state directory `oram_dir` belongs to a balancer.
pub fn is_balancer_dir(oram_dir: &Path) -> bool {
    oram_dir.join(NODES_FILE).exists()
}

/// The free local ids of each node (below its dummy ids) given the blocks placed: popped from
/// the end, low ids first.
fn free_lists(node_blocks: &[u64], placed: &HashMap<u64, (u32, u64)>) -> Vec<Vec<u64>> {
    let mut used: Vec<Vec<bool>> =
        node_blocks.iter().map(|&b| vec![false; (b - DUMMY_IDS) as usize]).collect();
    for &(node, local) in placed.values() {
        used[node as usize][local as usize] = true;
    }
    used.iter().map(|u| (0..u.len() as u64).rev().filter(|&i| !u[i as usize]).collect()).collect()
}

/// Asks every node holding fewer than `need` local ids to grow to `need` (all at once);
/// `held` is updated with what each node holds then. A node grown before a failure stays
/// grown: a node holding more ids than the balancer uses is harmless.
async fn grow_nodes(nodes: &[NodeClient], held: &mut [u64], need: u64) -> Result<usize> {
    let grown = futures::future::join_all(
        nodes
            .iter()
            .zip(held.iter())
            .enumerate()
            .filter(|(_, (_, &h))| h < need)
            .map(|(i, (c, _))| async move { (i, c.grow(need).await) }),
    )
    .await;
    let count = grown.len();
    let mut failed = Vec::new();
    for (i, result) in grown {
        match result {
            Ok(info) => held[i] = info.blocks,
            Err(e) => failed.push(e.to_string()),
        }
    }
    if !failed.is_empty() {
        return Err(ProxyError::State(failed.join("; ")));
    }
    Ok(count)
}

/// Writes [`NODES_FILE`], the cluster's public description: `nodes` in the order the state
/// numbers them, each holding `held` local ids.
pub(crate) fn write_nodes_file(
    dir: &Path,
    nodes: &[NodeClient],
    held: &[u64],
) -> std::result::Result<(), NodeError> {
    let nodes_file = NodesFile {
        format: "blindfold-balancer".into(),
        nodes: nodes
            .iter()
            .zip(held)
            .map(|(c, &blocks)| NodesFileEntry {
                url: c.url().to_owned(),
                id: hex::encode(c.info().id),
                blocks,
                name: Some(c.name().to_owned()),
            })
            .collect(),
    };
    let path = dir.join(NODES_FILE);
    write_private(&path, &serde_json::to_vec_pretty(&nodes_file).expect("json"))
        .map_err(|e| NodeError::Io { path, source: e })
}

impl Balancer {
    /// Connects to the nodes at `urls` and creates (`creating`) or opens the balancer whose
    /// state lives in `dir` (a gateway's `<data-dir>/oram`), for `blocks` logical blocks of
    /// `block_size` bytes. Opening after an unclean stop repeats the reads logged since the last
    /// commit before it returns (see the module documentation).
    #[allow(clippy::too_many_arguments)]
    pub async fn open(
        dir: &Path,
        urls: &[String],
        tls: &ClusterTls,
        blocks: u64,
        block_size: u32,
        key: &MasterKey,
        creating: bool,
        config: BalancerConfig,
    ) -> std::result::Result<Self, NodeError> {
        Self::open_rotating(dir, urls, tls, blocks, block_size, (key, None), creating, config).await
    }

    /// As [`Balancer::open`] during a key rotation: `keys` is the key to seal under and the
    /// key being retired. The checkpoint and the redo log open under either (a crash can leave
    /// a checkpoint under the new key beside a log under the old one), and the state is written
    /// again under the new key before the balancer serves: from then on nothing of it is under
    /// the old key. (Its blocks live on the nodes, each of which rotates its own key.)
    #[allow(clippy::too_many_arguments)]
    pub async fn open_rotating(
        dir: &Path,
        urls: &[String],
        tls: &ClusterTls,
        blocks: u64,
        block_size: u32,
        (key, previous): (&MasterKey, Option<&MasterKey>),
        creating: bool,
        config: BalancerConfig,
    ) -> std::result::Result<Self, NodeError> {
        if urls.is_empty() {
            return Err(NodeError::Config("--nodes names no node".into()));
        }
        if config.evictions_per_access == 0 || u64::from(config.evictions_per_access) > DUMMY_IDS {
            return Err(NodeError::Config(format!(
                "evictions per access must be between 1 and {DUMMY_IDS}"
            )));
        }
        let clients = futures::future::try_join_all(
            urls.iter().enumerate().map(|(i, u)| NodeClient::connect(u, i, tls)),
        )
        .await?;
        // Each node is the one its certificate names: two addresses answered by the same name
        // are one node standing in for another (or one node given twice).
        for (i, a) in clients.iter().enumerate() {
            if let Some(b) = clients[..i].iter().find(|b| b.name() == a.name()) {
                return Err(NodeError::Config(format!(
                    "{} and {} both proved to be {}: a node cannot stand in for another (is \
                     one of them started with another node's --tls-dir?)",
                    b.url(),
                    a.url(),
                    a.name()
                )));
            }
        }
        for c in &clients {
            if c.info().block_size != block_size {
                return Err(NodeError::Config(format!(
                    "node {} serves blocks of {} bytes, the gateway uses {block_size}: start \
                     the node with --block-size {block_size}",
                    c.url(),
                    c.info().block_size
                )));
            }
        }
        let mut ids: Vec<[u8; 16]> = clients.iter().map(|c| c.info().id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(NodeError::Config("two --nodes entries reach the same node".into()));
        }
        let sealer = StateSealer::new(key);
        let (ckpt, frames) = if creating {
            if dir.join(state_file::CHECKPOINT).exists() {
                return Err(NodeError::Config(format!(
                    "{} already holds a balancer's state",
                    dir.display()
                )));
            }
            let need = node_blocks_needed(blocks, clients.len());
            for c in &clients {
                if c.info().blocks < need {
                    return Err(NodeError::Config(format!(
                        "node {} holds {} blocks; {} blocks over {} nodes need at least {need} \
                         per node (its share, slack for uneven placement and {DUMMY_IDS} dummy \
                         blocks): \
                         start it with --blocks {need} or more",
                        c.url(),
                        c.info().blocks,
                        blocks,
                        clients.len()
                    )));
                }
            }
            blindfold_proxy::make_private(dir)?;
            let ckpt = Checkpoint {
                blocks,
                block_size,
                evictions: config.evictions_per_access,
                nodes: clients
                    .iter()
                    .map(|c| NodeRecord { id: c.info().id, blocks: c.info().blocks })
                    .collect(),
                placed: Vec::new(),
                cached: Vec::new(),
                digest_key: *BlockDigestKey::generate()
                    .map_err(|e| NodeError::Config(e.to_string()))?
                    .expose_bytes(),
            };
            state_file::write_checkpoint_as(dir, CHECKPOINT_MAGIC, &ckpt, &sealer)?;
            (ckpt, Vec::new())
        } else {
            let path = dir.join(state_file::CHECKPOINT);
            let buf = std::fs::read(&path)
                .map_err(|e| NodeError::Io { path: path.clone(), source: e })?;
            let retiring = previous.map(StateSealer::new);
            let ckpt: Checkpoint = match decode_checkpoint(&buf, &sealer) {
                Err(_) if retiring.is_some() => {
                    decode_checkpoint(&buf, retiring.as_ref().expect("checked"))
                }
                other => other,
            }
            .map_err(|m| NodeError::Config(format!("{}: {m}", path.display())))?;
            let log = dir.join(state_file::REDO_LOG);
            let read = |s: &StateSealer| {
                state_file::read_frames_with_legacy(&log, &[COMMIT_MAGIC, INTENT_MAGIC], &[], s)
            };
            let (frames, _, torn) = match (read(&sealer), &retiring) {
                (Err(_), Some(old)) => read(old)?,
                (r, _) => r?,
            };
            if torn > 0 {
                tracing::info!(
                    torn,
                    "the balancer's redo log ends in a torn record (a crash while writing it)"
                );
            }
            (ckpt, frames)
        };
        // More blocks than the state has: a growth the gateway recorded before a crash let
        // the balancer take it (finished below, once the nodes are known).
        if ckpt.blocks > blocks || ckpt.block_size != block_size {
            return Err(NodeError::Config(format!(
                "the balancer's state is for {} blocks of {} bytes, not {blocks} of {block_size}",
                ckpt.blocks, ckpt.block_size
            )));
        }
        // The nodes in the order the state numbers them.
        let mut ordered = Vec::with_capacity(ckpt.nodes.len());
        for rec in &ckpt.nodes {
            let Some(c) = clients.iter().find(|c| c.info().id == rec.id) else {
                return Err(NodeError::Config(format!(
                    "node {} of this balancer is not among --nodes (give every node it was \
                     created with, in any order)",
                    hex::encode(rec.id)
                )));
            };
            // A node may hold more than it had (it grew, see [`Balancer::grow_in_place`]),
            // never fewer: its local ids keep their blocks through a growth.
            if c.info().blocks < rec.blocks {
                return Err(NodeError::Config(format!(
                    "node {} now holds {} blocks, fewer than the {} it had: it does not hold \
                     this cluster's data (was its data directory replaced?)",
                    c.url(),
                    c.info().blocks,
                    rec.blocks
                )));
            }
            ordered.push(c.clone());
        }
        if ordered.len() != clients.len() {
            return Err(NodeError::Config(format!(
                "--nodes names {} nodes; this balancer was created with {}",
                clients.len(),
                ordered.len()
            )));
        }
        let mut node_blocks: Vec<u64> = ordered.iter().map(|c| c.info().blocks).collect();
        if blocks > ckpt.blocks {
            let need = node_blocks_needed(blocks, ordered.len());
            tracing::info!(
                from = ckpt.blocks,
                to = blocks,
                "finishing a growth: the nodes hold at least {need} local ids each"
            );
            grow_nodes(&ordered, &mut node_blocks, need).await.map_err(|e| {
                NodeError::Config(format!(
                    "finishing the growth to {blocks} blocks: {e}; the gateway cannot start \
                     until every node holds {need} blocks"
                ))
            })?;
        }
        let nodes_path = dir.join(NODES_FILE);
        // The name each node proved the last time: the node holding a node's data must prove
        // the same name again.
        if !creating {
            let before: Option<NodesFile> =
                std::fs::read(&nodes_path).ok().and_then(|b| serde_json::from_slice(&b).ok());
            for e in before.map(|f| f.nodes).unwrap_or_default() {
                let Some(was) = e.name else { continue };
                if let Some(c) = ordered.iter().find(|c| hex::encode(c.info().id) == e.id) {
                    if c.name() != was {
                        return Err(NodeError::Config(format!(
                            "node {} holds the data of {was} but proved to be {}: a node \
                             cannot stand in for another",
                            c.url(),
                            c.name()
                        )));
                    }
                }
            }
        }
        write_nodes_file(dir, &ordered, &node_blocks)?;
        let seed = config.seed.unwrap_or_else(rand::random);
        let mut state = State {
            rng: ChaCha20Rng::seed_from_u64(seed),
            placed: ckpt.placed.iter().map(|&(b, n, l, _)| (b, (n, l))).collect(),
            digests: ckpt.placed.iter().filter_map(|&(b, _, _, d)| Some((b, d?))).collect(),
            cache: ckpt
                .cached
                .into_iter()
                .map(|(b, n, d)| {
                    (
                        b,
                        Cached {
                            data: Some(d),
                            load: None,
                            assigned: n,
                            version: 0,
                            evicting: false,
                        },
                    )
                })
                .collect(),
            free: Vec::new(),
            pending_free: Vec::new(),
            dirty: BTreeSet::new(),
            batches: 0,
            node_blocks,
        };
        let mut intents = Vec::new();
        for LogFrame { magic, body } in frames {
            if magic == COMMIT_MAGIC {
                let rec: CommitRecord =
                    state_file::decode_record(&body).map_err(NodeError::Config)?;
                for (b, e) in rec.entries {
                    match e {
                        Entry::Placed(n, l) => {
                            state.cache.remove(&b);
                            state.placed.insert(b, (n, l));
                            state.digests.remove(&b);
                        }
                        Entry::PlacedDigest(n, l, d) => {
                            state.cache.remove(&b);
                            state.placed.insert(b, (n, l));
                            state.digests.insert(b, d);
                        }
                        Entry::Cached(n, d) => {
                            state.placed.remove(&b);
                            state.digests.remove(&b);
                            state.cache.insert(
                                b,
                                Cached {
                                    data: Some(d),
                                    load: None,
                                    assigned: n,
                                    version: 0,
                                    evicting: false,
                                },
                            );
                        }
                    }
                }
                intents.clear();
            } else {
                let rec: IntentRecord =
                    state_file::decode_record(&body).map_err(NodeError::Config)?;
                intents.push(rec);
            }
        }
        let n = ordered.len();
        if let Some((c, held)) =
            ordered.iter().zip(&state.node_blocks).find(|(_, &held)| held <= DUMMY_IDS)
        {
            return Err(NodeError::Config(format!(
                "node {} holds {held} blocks: a node needs more than the {DUMMY_IDS} it keeps \
                 for dummy evictions",
                c.url(),
            )));
        }
        for (&b, &(node, local)) in state.placed.iter() {
            if node as usize >= n || local >= state.node_blocks[node as usize] || b >= blocks {
                return Err(NodeError::Config(format!(
                    "the balancer's state places a block outside the nodes ({}): damaged",
                    dir.display()
                )));
            }
            if local + DUMMY_IDS >= state.node_blocks[node as usize] {
                return Err(NodeError::Config(format!(
                    "the balancer's state ({}) places a block among node {}'s top {DUMMY_IDS} \
                     local ids, which this version keeps for dummy evictions: the state was made \
                     by an older blindfold; copy the objects out with that version and into a \
                     new cluster",
                    dir.display(),
                    ordered[node as usize].url()
                )));
            }
        }
        if state.cache.values().any(|c| c.assigned as usize >= n) {
            return Err(NodeError::Config("the balancer's state names an unknown node".into()));
        }
        let balancer = Self {
            dir: dir.to_path_buf(),
            instances: ordered.iter().map(|c| c.info().instance).collect(),
            nodes: ordered,
            blocks: AtomicU64::new(blocks),
            block_size: block_size as usize,
            evictions: ckpt.evictions,
            sealer: Arc::new(sealer),
            digest_key: BlockDigestKey::from_bytes(ckpt.digest_key),
            log: LogWriter::open(dir)?,
            log_limit: config.log_limit,
            quiet: tokio::sync::RwLock::new(()),
            state: parking_lot::Mutex::new(state),
            poisoned: AtomicBool::new(false),
            trace: config.record.then(|| parking_lot::Mutex::new(Vec::new())),
        };
        if !intents.is_empty() {
            balancer.repeat_reads(intents).await?;
        }
        {
            let mut st = balancer.state.lock();
            st.free = free_lists(&st.node_blocks, &st.placed);
        }
        if !creating {
            // Everything replayed is folded into a fresh checkpoint.
            balancer.checkpoint().await?;
            // A recover's plan is done with once its balancer opens.
            let plan = dir.join(RECOVER_PLAN_DIR);
            if plan.exists() {
                std::fs::remove_dir_all(&plan)
                    .map_err(|e| NodeError::Io { path: plan, source: e })?;
            }
        } else {
            balancer.log.empty().await?;
        }
        Ok(balancer)
    }

    /// After an unclean stop: the reads logged since the last commit, sent again as they were
    /// (node and local id, fake ones too); a block they had taken out of its place goes to the
    /// cache under the node its latest intent drew.
    async fn repeat_reads(&self, intents: Vec<IntentRecord>) -> std::result::Result<(), NodeError> {
        let n = self.nodes.len();
        let node_blocks = self.state.lock().node_blocks.clone();
        tracing::warn!(
            batches = intents.len(),
            "the balancer stopped uncleanly: repeating the reads it had sent since its last commit"
        );
        for intent in intents {
            let mut per_node: Vec<Vec<u64>> = vec![Vec::new(); n];
            let mut slots = Vec::with_capacity(intent.reads.len());
            for &(node, local, _) in &intent.reads {
                if node as usize >= n || local >= node_blocks[node as usize] {
                    return Err(NodeError::Config("a redo record names an unknown place".into()));
                }
                let reads = &mut per_node[node as usize];
                // Intents of this version name distinct ids per node; an older one's repeated
                // id is read once (a node refuses a request that names an id twice).
                let slot = reads.iter().position(|&l| l == local).unwrap_or_else(|| {
                    reads.push(local);
                    reads.len() - 1
                });
                slots.push((node as usize, slot));
            }
            let results = futures::future::try_join_all(
                per_node
                    .into_iter()
                    .enumerate()
                    .map(|(i, reads)| self.send(i, Access { reads, writes: Vec::new() })),
            )
            .await?;
            let mut st = self.state.lock();
            for (&(node, local, real), &(i, slot)) in intent.reads.iter().zip(&slots) {
                let Some((b, assigned)) = real else { continue };
                if st.placed.get(&b) == Some(&(node, local)) {
                    st.placed.remove(&b);
                    st.digests.remove(&b);
                    let data = results[i][slot].clone();
                    st.cache.insert(
                        b,
                        Cached {
                            data: Some(data),
                            load: None,
                            assigned,
                            version: 0,
                            evicting: false,
                        },
                    );
                } else if let Some(c) = st.cache.get_mut(&b) {
                    // Read again (from a place an earlier eviction of this run gave it): the
                    // node drawn then is the one no one has seen.
                    c.assigned = assigned;
                }
            }
        }
        Ok(())
    }

    /// The requests sent so far (with [`BalancerConfig::record`]).
    pub fn trace(&self) -> Vec<RpcRecord> {
        self.trace.as_ref().map(|t| t.lock().clone()).unwrap_or_default()
    }

    /// The nodes, in the order the state numbers them.
    pub fn nodes(&self) -> &[NodeClient] {
        &self.nodes
    }

    /// Where block `b` is now: `Some((node, local id))` on a node, `None` in the cache or never
    /// written (tests).
    #[doc(hidden)]
    pub fn place_of(&self, b: u64) -> Option<(u32, u64)> {
        self.state.lock().placed.get(&b).copied()
    }

    /// Blocks ever written (on a node or in the cache).
    pub fn blocks_written(&self) -> usize {
        let st = self.state.lock();
        st.placed.len() + st.cache.len()
    }

    /// Blocks the balancer holds in its eviction cache now.
    pub fn cached_blocks(&self) -> usize {
        self.state.lock().cache.len()
    }

    /// Sends one node its share of a batch (split into requests of at most
    /// [`MAX_BLOCKS_PER_RPC`] blocks); returns the blocks read.
    async fn send(&self, node: usize, access: Access) -> Result<Vec<Vec<u8>>> {
        let client = &self.nodes[node];
        let mut out = Vec::with_capacity(access.reads.len());
        let mut reads = access.reads.into_iter().peekable();
        let mut writes = access.writes.into_iter().peekable();
        loop {
            let r: Vec<u64> = reads.by_ref().take(MAX_BLOCKS_PER_RPC).collect();
            let w: Vec<(u64, Vec<u8>)> =
                writes.by_ref().take(MAX_BLOCKS_PER_RPC - r.len()).collect();
            let (instance, blocks) = client.access(&Access { reads: r, writes: w }).await?;
            if instance != self.instances[node] {
                return Err(ProxyError::State(format!(
                    "node {} restarted (it may have lost writes it had not committed); restart \
                     the gateway: it resumes from its last commit",
                    client.url()
                )));
            }
            out.extend(blocks);
            if reads.peek().is_none() && writes.peek().is_none() {
                return Ok(out);
            }
        }
    }

    fn plan(&self, st: &mut State, ops: Vec<(u64, Option<Vec<u8>>)>) -> Plan {
        let n = self.nodes.len();
        let bs = self.block_size;
        st.batches += 1;
        // Local ids each node is asked to read in this batch: the places of the blocks read
        // from them first, then each fake read's id, drawn among the others, so that no node is
        // asked for an id twice in one request.
        let mut reading: Vec<std::collections::HashSet<u64>> =
            vec![std::collections::HashSet::new(); n];
        for (b, _) in &ops {
            if let Some(&(p, x)) = st.placed.get(b) {
                reading[p as usize].insert(x);
            }
        }
        let mut plan = Plan {
            batch: st.batches,
            per_node: (0..n).map(|_| Access { reads: Vec::new(), writes: Vec::new() }).collect(),
            answers: Vec::with_capacity(ops.len()),
            loads: Vec::new(),
            evictions: Vec::new(),
            intent: IntentRecord { reads: Vec::with_capacity(ops.len()) },
        };
        for (b, write) in ops {
            let is_write = write.is_some();
            if let Some((p, x)) = st.placed.remove(&b) {
                st.digests.remove(&b);
                // A real read from the block's place; the block moves to the cache.
                let assigned = st.rng.gen_range(0..n as u32);
                let slot = plan.per_node[p as usize].reads.len();
                plan.per_node[p as usize].reads.push(x);
                plan.intent.reads.push((p, x, Some((b, assigned))));
                st.pending_free.push((p, x));
                st.dirty.insert(b);
                let (load, answer) = if is_write {
                    (None, Answer::Written)
                } else {
                    let (tx, rx) = watch::channel(None);
                    plan.loads.push((b, p as usize, slot, tx));
                    (Some(rx), Answer::Read(p as usize, slot))
                };
                st.cache
                    .insert(b, Cached { data: write, load, assigned, version: 0, evicting: false });
                plan.answers.push(answer);
                continue;
            }
            // A fake read, at the node the block is assigned to if it is cached (the node its
            // last access drew and nobody saw), else at a uniformly random node.
            let assigned = st.rng.gen_range(0..n as u32);
            let node = match st.cache.get(&b) {
                Some(c) => c.assigned as usize,
                None => st.rng.gen_range(0..n),
            };
            // A batch reads at most `max_batch` ids of a node of more than `DUMMY_IDS` blocks:
            // a free one is always found.
            let local = loop {
                let l = st.rng.gen_range(0..st.node_blocks[node]);
                if reading[node].insert(l) {
                    break l;
                }
            };
            plan.per_node[node].reads.push(local);
            let answer = match (st.cache.get_mut(&b), write) {
                (Some(c), write) => {
                    // The read showed its node: the block goes to a fresh one, and an eviction
                    // under way (to the node just shown) must not place it.
                    c.assigned = assigned;
                    c.version += 1;
                    st.dirty.insert(b);
                    plan.intent.reads.push((node as u32, local, Some((b, assigned))));
                    match write {
                        Some(data) => {
                            c.data = Some(data);
                            c.load = None;
                            Answer::Written
                        }
                        None => match (&c.data, &c.load) {
                            (Some(d), _) => Answer::Now(d.clone()),
                            (None, Some(load)) => Answer::Wait(load.clone()),
                            (None, None) => Answer::Now(vec![0; bs]),
                        },
                    }
                }
                (None, Some(data)) => {
                    st.cache.insert(
                        b,
                        Cached {
                            data: Some(data),
                            load: None,
                            assigned,
                            version: 0,
                            evicting: false,
                        },
                    );
                    st.dirty.insert(b);
                    plan.intent.reads.push((node as u32, local, Some((b, assigned))));
                    Answer::Written
                }
                (None, None) => {
                    plan.intent.reads.push((node as u32, local, None));
                    Answer::Now(vec![0; bs])
                }
            };
            plan.answers.push(answer);
        }
        let accesses = plan.answers.len();
        // Each dummy eviction of the batch to a node takes the next of its dummy ids.
        let mut dummies = vec![0u64; n];
        for _ in 0..accesses * self.evictions as usize {
            let q = st.rng.gen_range(0..n);
            let candidate = if st.free[q].is_empty() {
                None
            } else {
                st.cache
                    .iter()
                    .filter(|(_, c)| c.assigned as usize == q && c.data.is_some() && !c.evicting)
                    .map(|(&b, _)| b)
                    .min()
            };
            match candidate {
                Some(b) => {
                    let y = st.free[q].pop().expect("checked non-empty");
                    let c = st.cache.get_mut(&b).expect("candidate is cached");
                    c.evicting = true;
                    let data = c.data.clone().expect("candidate has data");
                    plan.evictions.push((b, q as u32, y, c.version));
                    plan.per_node[q].writes.push((y, data));
                }
                None => {
                    debug_assert!(dummies[q] < DUMMY_IDS, "a batch is at most max_batch accesses");
                    let dummy = st.node_blocks[q] - 1 - dummies[q];
                    dummies[q] += 1;
                    plan.per_node[q].writes.push((dummy, vec![0; bs]));
                }
            }
        }
        plan
    }

    fn poison(&self, e: ProxyError) -> ProxyError {
        if !self.poisoned.swap(true, Ordering::SeqCst) {
            tracing::error!(error = %e, "the balancer stopped: restart the gateway to resume from its last commit");
        }
        e
    }

    fn check_poisoned(&self) -> Result<()> {
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(ProxyError::Poisoned);
        }
        Ok(())
    }

    fn check_block(&self, b: BlockId) -> Result<()> {
        let blocks = self.blocks.load(Ordering::SeqCst);
        if b.0 >= blocks {
            return Err(ProxyError::State(format!(
                "block {} is beyond the balancer's {blocks} blocks",
                b.0
            )));
        }
        Ok(())
    }

    /// Runs accesses (reads with `None`, writes with their data), in order.
    async fn access(&self, ops: Vec<(u64, Option<Vec<u8>>)>) -> Result<Vec<Option<Vec<u8>>>> {
        let mut out = Vec::with_capacity(ops.len());
        let mut ops = ops.into_iter().peekable();
        while ops.peek().is_some() {
            let chunk: Vec<_> = ops.by_ref().take(max_batch(self.evictions)).collect();
            out.extend(self.access_batch(chunk).await?);
        }
        // Reads alone never make the gateway commit: bound the intents a restart repeats
        // and the log they fill.
        if self.log.full(self.log_limit) {
            self.commit().await?;
            let _quiet = self.quiet.write().await;
            if self.log.full(self.log_limit) {
                self.checkpoint().await?;
            }
        }
        Ok(out)
    }

    async fn access_batch(&self, ops: Vec<(u64, Option<Vec<u8>>)>) -> Result<Vec<Option<Vec<u8>>>> {
        let _quiet = self.quiet.read().await;
        self.check_poisoned()?;
        let accesses = ops.len();
        let mut plan = {
            let mut st = self.state.lock();
            self.plan(&mut st, ops)
        };
        // The reads' places and the blocks' new nodes are durable before anyone sees them.
        let frame = state_file::encode_frame(INTENT_MAGIC, &plan.intent, &self.sealer)?;
        self.log.append(frame).await.map_err(|e| self.poison(e))?;
        let per_node = std::mem::take(&mut plan.per_node);
        if let Some(trace) = &self.trace {
            let mut t = trace.lock();
            for (i, a) in per_node.iter().enumerate() {
                t.push(RpcRecord {
                    batch: plan.batch,
                    accesses,
                    node: i,
                    reads: a.reads.len(),
                    writes: a.writes.len(),
                    request_bytes: crate::wire::access_len(
                        a.reads.len(),
                        a.writes.len(),
                        self.block_size,
                    ),
                });
            }
        }
        let sent = futures::future::try_join_all(
            per_node.into_iter().enumerate().map(|(i, a)| self.send(i, a)),
        )
        .await;
        let results = match sent {
            Ok(r) => r,
            Err(e) => {
                for (_, _, _, tx) in plan.loads {
                    let _ = tx.send(Some(Err(e.to_string())));
                }
                return Err(self.poison(e));
            }
        };
        {
            let mut st = self.state.lock();
            for (b, node, slot, tx) in plan.loads {
                let data = results[node][slot].clone();
                if let Some(c) = st.cache.get_mut(&b) {
                    if c.data.is_none() {
                        c.data = Some(data.clone());
                    }
                    c.load = None;
                }
                let _ = tx.send(Some(Ok(data)));
            }
            for (b, q, y, version) in plan.evictions {
                match st.cache.get_mut(&b) {
                    Some(c) if c.version == version => {
                        let digest = c.data.as_ref().map(|d| self.digest_key.digest(b, d));
                        st.cache.remove(&b);
                        st.placed.insert(b, (q, y));
                        if let Some(d) = digest {
                            st.digests.insert(b, d);
                        }
                        st.dirty.insert(b);
                    }
                    Some(c) => {
                        // Written again meanwhile: the block stays cached, the place is freed.
                        c.evicting = false;
                        st.pending_free.push((q, y));
                    }
                    None => st.pending_free.push((q, y)),
                }
            }
        }
        let mut out = Vec::with_capacity(plan.answers.len());
        for a in plan.answers {
            out.push(match a {
                Answer::Now(d) => Some(d),
                Answer::Read(node, slot) => Some(results[node][slot].clone()),
                Answer::Wait(mut rx) => {
                    let got = rx
                        .wait_for(|v| v.is_some())
                        .await
                        .map_err(|_| ProxyError::Poisoned)?
                        .clone()
                        .expect("waited for a value");
                    Some(got.map_err(|_| ProxyError::Poisoned)?)
                }
                Answer::Written => None,
            });
        }
        Ok(out)
    }

    async fn commit_nodes(&self) -> Result<()> {
        let instances =
            futures::future::try_join_all(self.nodes.iter().map(|c| c.commit())).await?;
        for (i, instance) in instances.into_iter().enumerate() {
            if instance != self.instances[i] {
                return Err(ProxyError::State(format!(
                    "node {} restarted (it may have lost writes it had not committed); restart \
                     the gateway: it resumes from its last commit",
                    self.nodes[i].url()
                )));
            }
        }
        Ok(())
    }

    /// Commit under the quiet lock.
    async fn commit_quiet(&self) -> Result<()> {
        self.check_poisoned()?;
        if self.state.lock().dirty.is_empty() {
            return Ok(());
        }
        // Nodes first: every place the record names then holds its block durably.
        self.commit_nodes().await.map_err(|e| self.poison(e))?;
        let record = {
            let st = self.state.lock();
            let entries = st
                .dirty
                .iter()
                .map(|&b| {
                    let e = match (st.placed.get(&b), st.cache.get(&b)) {
                        (Some(&(n, l)), _) => match st.digests.get(&b) {
                            Some(&d) => Entry::PlacedDigest(n, l, d),
                            None => Entry::Placed(n, l),
                        },
                        // No access is in flight under the quiet lock, but one whose caller
                        // dropped it part-way leaves its read unfinished for good: the
                        // block's data is not here, so stop rather than log a guess.
                        (None, Some(c)) => Entry::Cached(c.assigned, c.data.clone()?),
                        (None, None) => unreachable!("blocks are never removed"),
                    };
                    Some((b, e))
                })
                .collect::<Option<Vec<_>>>();
            match entries {
                Some(entries) => CommitRecord { entries },
                None => {
                    drop(st);
                    return Err(self.poison(ProxyError::State(
                        "an access was abandoned while its block was being read: restart the \
                         gateway, it resumes from its last commit"
                            .into(),
                    )));
                }
            }
        };
        let frame = state_file::encode_frame(COMMIT_MAGIC, &record, &self.sealer)?;
        self.log.append(frame).await.map_err(|e| self.poison(e))?;
        {
            let mut st = self.state.lock();
            st.dirty.clear();
            let freed = std::mem::take(&mut st.pending_free);
            for (n, l) in freed {
                st.free[n as usize].push(l);
            }
        }
        if self.log.full(self.log_limit) {
            self.checkpoint().await?;
        }
        Ok(())
    }

    /// A step of a growth to `blocks` logical blocks (see [`InPlaceGrowth`]). Making room asks
    /// every node holding fewer than [`node_blocks_needed`] local ids to grow (each node rebuilds
    /// its own tree, obliviously, as any gateway's growth does) and hands out the new local ids;
    /// no block moves, so nothing the nodes see depends on the blocks. Adopting serves the new
    /// logical blocks. Each step ends with a checkpoint.
    async fn grow_step(&self, blocks: u64, step: InPlaceGrowth) -> Result<String> {
        let _quiet = self.quiet.write().await;
        self.commit_quiet().await?;
        let now = self.blocks.load(Ordering::SeqCst);
        if blocks < now {
            return Err(ProxyError::State(format!(
                "the balancer holds {now} blocks already: it does not shrink"
            )));
        }
        let n = self.nodes.len();
        let need = node_blocks_needed(blocks, n);
        match step {
            InPlaceGrowth::MakeRoom => {
                let mut held = self.state.lock().node_blocks.clone();
                let grown = grow_nodes(&self.nodes, &mut held, need).await;
                // What grew is used even when another node failed: it holds the ids now.
                {
                    let mut st = self.state.lock();
                    if held != st.node_blocks {
                        st.node_blocks = held.clone();
                        st.free = free_lists(&st.node_blocks, &st.placed);
                    }
                }
                self.checkpoint().await?;
                write_nodes_file(&self.dir, &self.nodes, &held).map_err(state_err)?;
                let grown = grown.map_err(|e| {
                    ProxyError::State(format!("not every node grew to {need} blocks: {e}"))
                })?;
                Ok(format!(
                    "{grown} of {n} nodes grew to {need} local ids (each rebuilt its own tree)"
                ))
            }
            InPlaceGrowth::Adopt => {
                if self.state.lock().node_blocks.iter().any(|&h| h < need) {
                    return Err(ProxyError::State(format!(
                        "a node holds fewer than the {need} blocks {blocks} logical blocks need"
                    )));
                }
                self.blocks.store(blocks, Ordering::SeqCst);
                self.checkpoint().await?;
                Ok(format!("the balancer serves {blocks} blocks"))
            }
        }
    }

    /// Writes the whole state as a checkpoint and empties the log (quiet: no batch in flight).
    async fn checkpoint(&self) -> Result<()> {
        let ckpt = {
            let st = self.state.lock();
            let cached: Vec<(u64, u32, Vec<u8>)> = st
                .cache
                .iter()
                .map(|(&b, c)| {
                    (b, c.assigned, c.data.clone().unwrap_or_else(|| vec![0; self.block_size]))
                })
                .collect();
            let mut placed: Vec<(u64, u32, u64, Digest)> = st
                .placed
                .iter()
                .map(|(&b, &(n, l))| (b, n, l, st.digests.get(&b).copied()))
                .collect();
            placed.sort_unstable();
            Checkpoint {
                blocks: self.blocks.load(Ordering::SeqCst),
                block_size: self.block_size as u32,
                evictions: self.evictions,
                nodes: self
                    .nodes
                    .iter()
                    .zip(&st.node_blocks)
                    .map(|(c, &blocks)| NodeRecord { id: c.info().id, blocks })
                    .collect(),
                placed,
                cached,
                digest_key: *self.digest_key.expose_bytes(),
            }
        };
        let dir = self.dir.clone();
        let sealer = Arc::clone(&self.sealer);
        tokio::task::spawn_blocking(move || {
            state_file::write_checkpoint_as(&dir, CHECKPOINT_MAGIC, &ckpt, &sealer)
        })
        .await
        .map_err(state_err)??;
        self.log.empty().await
    }
}

fn check_distinct(blocks: impl Iterator<Item = u64>) -> Result<()> {
    let mut seen: Vec<u64> = blocks.collect();
    seen.sort_unstable();
    if seen.windows(2).any(|w| w[0] == w[1]) {
        return Err(ProxyError::State("a batch of block accesses names a block twice".into()));
    }
    Ok(())
}

#[async_trait::async_trait]
impl SharedEngine for Balancer {
    fn block_size(&self) -> usize {
        self.block_size
    }

    fn kind(&self) -> &'static str {
        "nodes"
    }

    fn durable(&self) -> bool {
        true
    }

    fn batch_blocks(&self) -> usize {
        max_batch(self.evictions)
    }

    /// The redo log's tap: `--durability store` mirrors it to the gateway's store, whose
    /// checkpoints then carry the balancer's state ([`Balancer::recover`] is not needed after
    /// losing the gateway's machine: its store holds every commit).
    async fn journal_tap(&self) -> Option<state_file::Tap> {
        Some(self.log.tap.clone())
    }

    fn gauges(&self) -> EngineGauges {
        let Some(st) = self.state.try_lock() else { return EngineGauges::default() };
        let cached = st.cache.len() as u64;
        EngineGauges {
            stash: cached,
            stash_max: cached,
            subtree: 0,
            trusted_bytes: st.placed.len() as u64 * 36 + cached * (self.block_size as u64 + 32),
        }
    }

    async fn read_many(&self, blocks: &[BlockId]) -> Result<Vec<Vec<u8>>> {
        check_distinct(blocks.iter().map(|b| b.0))?;
        for &b in blocks {
            self.check_block(b)?;
        }
        let out = self.access(blocks.iter().map(|b| (b.0, None)).collect()).await?;
        Ok(out.into_iter().map(|d| d.expect("a read answers with data")).collect())
    }

    async fn write_many(&self, blocks: Vec<(BlockId, Vec<u8>)>) -> Result<()> {
        check_distinct(blocks.iter().map(|b| b.0 .0))?;
        for (b, d) in &blocks {
            self.check_block(*b)?;
            if d.len() != self.block_size {
                return Err(ProxyError::State(format!(
                    "a block of {} bytes written to an engine of {}-byte blocks",
                    d.len(),
                    self.block_size
                )));
            }
        }
        self.access(blocks.into_iter().map(|(b, d)| (b.0, Some(d))).collect()).await?;
        Ok(())
    }

    async fn commit(&self) -> Result<()> {
        let _quiet = self.quiet.write().await;
        self.commit_quiet().await
    }

    async fn shutdown(&self) -> Result<()> {
        let _quiet = self.quiet.write().await;
        self.commit_quiet().await?;
        self.checkpoint().await
    }

    /// A key rotation's sweep of the balancer: one step. Its blocks live on the nodes, whose
    /// own rotations re-seal them; its state was re-sealed under the new key when it opened
    /// ([`Balancer::open_rotating`]), and the step writes it once more (a checkpoint).
    async fn sweep_paths(&self) -> u64 {
        1
    }

    async fn sweep(&self, _range: std::ops::Range<u64>) -> Result<()> {
        let _quiet = self.quiet.write().await;
        self.commit_quiet().await?;
        self.checkpoint().await
    }

    async fn grow_in_place(&self, blocks: u64, step: InPlaceGrowth) -> Option<Result<String>> {
        Some(self.grow_step(blocks, step).await)
    }

    fn verify<'a>(
        &'a self,
        progress: &'a mut dyn FnMut(u64, u64),
    ) -> LocalBoxFuture<'a, Result<VerifyReport>> {
        Box::pin(async move {
            let total = self.nodes.len() as u64;
            let mut all = VerifyReport { cells_checked: 0, never_written: 0, failures: Vec::new() };
            for (i, c) in self.nodes.iter().enumerate() {
                progress(i as u64, total);
                let r = c.verify().await?;
                all.cells_checked += r.cells_checked;
                all.never_written += r.never_written;
                all.failures.extend(
                    r.failures
                        .into_iter()
                        .map(|(cell, why)| (cell, format!("node {}: {why}", c.url()))),
                );
            }
            progress(total, total);
            Ok(all)
        })
    }
}

/// An [`EngineFactory`] that opens a balancer over the nodes at `urls` for a gateway's data
/// directory.
pub fn engine_factory(urls: Vec<String>, tls: ClusterTls, config: BalancerConfig) -> EngineFactory {
    Box::new(move |dir, params, key, previous, creating| {
        Box::pin(async move {
            let b = Balancer::open_rotating(
                &dir,
                &urls,
                &tls,
                params.blocks,
                params.block_size,
                (&key, previous.as_deref()),
                creating,
                config,
            )
            .await?;
            Ok(Arc::new(b) as Arc<dyn SharedEngine>)
        })
    })
}
