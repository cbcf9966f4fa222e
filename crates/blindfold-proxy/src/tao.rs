//! [`TaoOram`]: a concurrent, asynchronous Path ORAM proxy in the style of TaoStore (Sahin et
//! al., seed 000), serving many logical requests at once over one sealed store.
//!
//! # Design
//!
//! The processor, the subtree, the eviction and the batching of write-backs are the I/O-free
//! scheme [`blindfold_oram::tao::TaoScheme`], whose plans (which path each request reads, which
//! buckets each write-back covers) are tested there on their own. This driver holds it under
//! one lock and adds what needs I/O or concurrency: the sequencer, one task per request, the
//! reads, opening and sealing under the trusted versions, retries, and the writer task.
//!
//! * **Sequencer.** Every request takes a ticket when it arrives; its reply is released only
//!   after the replies of all earlier requests. Replies therefore leave in arrival order, and
//!   their timing says nothing about which requests hit the same block.
//! * **Processor.** On arrival (under the state lock, without any I/O) the block's leaf is
//!   looked up and at once replaced by a fresh random one. If a *real* read of the same block is
//!   already in flight, this request fetches the path to a uniformly random leaf instead (a
//!   *fake read*) and is answered from the real one when it arrives; otherwise it fetches the
//!   path to the block's old leaf. Either way the store sees one path to a fresh, uniformly
//!   random leaf per request, whatever the workload.
//! * **Subtree.** Fetched buckets are kept, decrypted, in an in-memory subtree. A bucket in the
//!   subtree is always fresher than its stored copy, so the fetched copy of a bucket already in
//!   the subtree is ignored (not even decrypted). Every path is fetched whole: which cells are
//!   read never depends on what the subtree holds.
//! * **Eviction.** After a path arrives and its request is served, blocks from the stash and the
//!   path are placed greedily, as deep as possible, into the path's buckets in the subtree.
//! * **Write-back.** Every `k` fetched paths close a batch. A background writer seals the union
//!   of a batch's buckets under the next versions and writes it as one store request; writes
//!   run one after the other, in order, so readers never wait for them and the store never
//!   holds two writes of a cell at once. If batches closed while the previous write was in
//!   flight, the next write covers all of them at once (current contents of the union of their
//!   buckets), so the write-back rate is not capped at one batch per round trip. A bucket leaves the subtree only when a
//!   write-back of it has completed, it has not changed since, and no fetched path that has not
//!   yet been written back covers it (paths are *pinned* from the moment they are requested to
//!   the completion of the write-back that includes them).
//!
//! Why a fetched copy can be trusted when its bucket is not in the subtree: the path was pinned
//! when the request was issued, so if the bucket was not in the subtree then, no write-back of
//! it was running (a bucket stays in the subtree until its write-back completes); and if it
//! entered the subtree later, it is still there on arrival (pinned) and the fetched copy is
//! ignored. So the stored copy did not change while the fetch was in flight, and it opens under
//! the trusted version of the cell. A stale or replayed cell fails authentication.
//!
//! Locks are never held across an `.await`; decryption and sealing happen outside the lock.
//! Each request runs on its own spawned task, so a caller that drops its future does not leave
//! the engine half-way through a request.
//!
//! The bucket format is the one of [`blindfold_oram::PathOram`] (`Z` slots of `id + 1`, leaf,
//! block) and the store layout is the same, so a store filled by
//! [`SealedPathOram::bulk_load`](crate::SealedPathOram::bulk_load) can be taken over with
//! [`TaoOram::from_path_state`]. Cells never written read as empty buckets, so a fresh store
//! needs no initialisation.
//!
//! ```
//! use std::sync::Arc;
//! use blindfold_crypto::{CellSealer, MasterKey, StoreId};
//! use blindfold_oram::BlockId;
//! use blindfold_proxy::{TaoConfig, TaoOram};
//! use blindfold_store::{MemoryStore, Store};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let config = TaoConfig::builder(1000, 64).write_back_every(8).build().unwrap();
//! let store: Arc<dyn Store> = Arc::new(MemoryStore::new(config.geometry().unwrap()));
//! let sealer = CellSealer::new(&MasterKey::generate(), StoreId::random(), 0);
//! let oram = Arc::new(TaoOram::new(config, store, sealer).unwrap());
//! // Many requests in flight at once; replies come back in submission order.
//! let writes: Vec<_> = (0..20u8)
//!     .map(|i| oram.submit(BlockId(u64::from(i)), blindfold_oram::Op::Write(vec![i; 64])))
//!     .collect::<Result<_, _>>()
//!     .unwrap();
//! for w in writes {
//!     w.await.unwrap();
//! }
//! assert_eq!(oram.read(BlockId(7)).await.unwrap(), vec![7; 64]);
//! // Quiesce, then save the trusted state (position map, stash, versions).
//! oram.flush().await.unwrap();
//! let state = oram.export_state().unwrap();
//! assert_eq!(state.posmap.len(), 1000);
//! # });
//! ```
//!
//! # Security
//!
//! The store sees, per logical request, one read of one whole path (all `L + 1` buckets) to a
//! leaf drawn uniformly at random and never used before; and after every `k` paths a batched
//! write of exactly the buckets of those `k` paths (a set fixed by their leaves, which the store
//! already saw), sealed under fresh nonces — or, if the previous write was still in flight, one
//! write of the buckets of every batch closed meanwhile. [`TaoOram::flush`] writes back the
//! paths of an incomplete batch the same way. What leaks: the number of requests and when they
//! arrive, when replies leave (in arrival order), when flushes happen, and how many batches
//! each write covers (a function of those times and of the store's own reply times). Which block a request touches,
//! whether it is a read or a write, and whether two requests touch the same block do not leak,
//! also when the store delays or reorders replies at will: the requests' paths are fixed at
//! arrival, before any reply.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use blindfold_crypto::CellSealer;
use blindfold_oram::path::SLOT_HEADER;
use blindfold_oram::tao::{TaoBlock, TaoRequest, TaoScheme, TaoSchemeConfig, Ticket};
use blindfold_oram::{
    BlockId, BucketId, Leaf, Op, OramError, PathOramConfig, PosMapMode, TreeShape,
};
use blindfold_store::{CellId, Geometry, Store};
use parking_lot::Mutex;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch, Notify};

use crate::retry::{with_retry, write_sealed, RetryPolicy};
use crate::sealing::{check_geometry, open_cell_in, seal_cell_with};
use crate::{ProxyError, Result, SealedPathOram, SealedPathState, VersionTable};

pub use blindfold_oram::tao::{Reveal, TaoStats};

/// Default number of fetched paths per write-back (TaoStore's `k`).
pub const DEFAULT_WRITE_BACK_EVERY: usize = 40;

/// Default bound on the stash, in blocks.
pub const DEFAULT_STASH_LIMIT: usize = 1000;

/// Default bound on the subtree, in buckets.
pub const DEFAULT_SUBTREE_LIMIT: usize = 1 << 18;

/// Validated parameters of a [`TaoOram`]. Build with [`TaoConfig::builder`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaoConfig {
    tree: PathOramConfig,
    write_back_every: usize,
    stash_limit: usize,
    subtree_limit: usize,
}

/// Builder for [`TaoConfig`].
#[derive(Clone, Debug)]
pub struct TaoConfigBuilder {
    blocks: u64,
    block_size: u32,
    z: u32,
    leaves: Option<u64>,
    write_back_every: usize,
    stash_limit: usize,
    subtree_limit: usize,
}

impl TaoConfig {
    /// Starts a configuration for `blocks` logical blocks of `block_size` bytes.
    pub fn builder(blocks: u64, block_size: u32) -> TaoConfigBuilder {
        TaoConfigBuilder {
            blocks,
            block_size,
            z: 4,
            leaves: None,
            write_back_every: DEFAULT_WRITE_BACK_EVERY,
            stash_limit: DEFAULT_STASH_LIMIT,
            subtree_limit: DEFAULT_SUBTREE_LIMIT,
        }
    }

    /// The tree's parameters, as a (non-recursive, uncached) Path ORAM configuration.
    pub fn tree(&self) -> &PathOramConfig {
        &self.tree
    }
    /// Logical capacity in blocks.
    pub fn blocks(&self) -> u64 {
        self.tree.blocks()
    }
    /// Bytes per block.
    pub fn block_size(&self) -> u32 {
        self.tree.block_size()
    }
    /// Slots per bucket.
    pub fn z(&self) -> u32 {
        self.tree.z()
    }
    /// Shape of the tree.
    pub fn shape(&self) -> TreeShape {
        self.tree.trees()[0].shape
    }
    /// Fetched paths per write-back (`k`).
    pub fn write_back_every(&self) -> usize {
        self.write_back_every
    }
    /// Stash bound in blocks.
    pub fn stash_limit(&self) -> usize {
        self.stash_limit
    }
    /// Subtree bound in buckets.
    pub fn subtree_limit(&self) -> usize {
        self.subtree_limit
    }
    /// The same configuration with write-back interval `k` (the tree is unchanged, so state
    /// exported under one `k` can be imported under another).
    pub fn with_write_back_every(mut self, k: usize) -> Result<Self> {
        if k == 0 {
            return Err(OramError::InvalidConfig(
                "write-back interval k must be at least 1".into(),
            )
            .into());
        }
        self.write_back_every = k;
        Ok(self)
    }
    /// The parameters of the I/O-free scheme ([`TaoScheme`]) the engine drives.
    pub fn scheme(&self) -> Result<TaoSchemeConfig> {
        Ok(TaoSchemeConfig::new(
            &self.tree,
            self.write_back_every,
            self.stash_limit,
            self.subtree_limit,
        )?)
    }
    /// The store shape this configuration needs (the same as [`SealedPathOram::geometry`]).
    pub fn geometry(&self) -> Result<Geometry> {
        SealedPathOram::geometry(&self.tree)
    }
}

impl TaoConfigBuilder {
    /// Slots per bucket (default 4).
    pub fn z(mut self, z: u32) -> Self {
        self.z = z;
        self
    }
    /// Leaves of the tree (rounded up to a power of two; default `blocks / Z`).
    pub fn leaves(mut self, leaves: u64) -> Self {
        self.leaves = Some(leaves);
        self
    }
    /// Write back after every `k` fetched paths (default 40).
    pub fn write_back_every(mut self, k: usize) -> Self {
        self.write_back_every = k;
        self
    }
    /// Stash bound in blocks (default 1000).
    pub fn stash_limit(mut self, blocks: usize) -> Self {
        self.stash_limit = blocks;
        self
    }
    /// Subtree bound in buckets (default 2^18).
    pub fn subtree_limit(mut self, buckets: usize) -> Self {
        self.subtree_limit = buckets;
        self
    }
    /// Checks the parameters.
    pub fn build(self) -> Result<TaoConfig> {
        let bad = |m: String| Err(ProxyError::Oram(OramError::InvalidConfig(m)));
        if self.write_back_every == 0 {
            return bad("write-back interval k must be at least 1".into());
        }
        if self.stash_limit == 0 || self.subtree_limit == 0 {
            return bad("stash and subtree limits must be at least 1".into());
        }
        let mut b = PathOramConfig::builder(self.blocks, self.block_size)
            .z(self.z)
            .stash_limit(self.stash_limit)
            .posmap(PosMapMode::InMemory);
        if let Some(l) = self.leaves {
            b = b.leaves(l);
        }
        let tree = b.build()?;
        Ok(TaoConfig {
            tree,
            write_back_every: self.write_back_every,
            stash_limit: self.stash_limit,
            subtree_limit: self.subtree_limit,
        })
    }
}

/// Trusted state of a quiescent [`TaoOram`] (after [`TaoOram::flush`]): enough to continue
/// with [`TaoOram::from_state`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaoState {
    /// Parameters.
    pub config: TaoConfig,
    /// Position map: leaf + 1 per block, 0 if never assigned.
    pub posmap: Vec<u32>,
    /// Stash: (block id, leaf, contents).
    pub stash: Vec<(u64, u32, Vec<u8>)>,
    /// Version of every cell.
    pub versions: VersionTable,
    /// Statistics so far.
    pub stats: TaoStats,
}

/// A resident bucket ([`TaoOram::keep_top_resident`]) as a write-back wrote it, open: what
/// the durable engine logs instead of the sealed cell ([`TaoOram::take_top_written`]).
#[derive(Clone, Debug)]
pub(crate) struct TopWritten {
    pub(crate) cell: u64,
    pub(crate) version: u64,
    /// The bucket's blocks: id, leaf, contents (shared with the engine, not copied).
    pub(crate) blocks: Vec<(u64, u32, Arc<[u8]>)>,
}

struct State {
    /// Position map, stash, subtree, pins and batching: everything but the I/O.
    scheme: TaoScheme,
    versions: VersionTable,
    /// Fake reads waiting for the real read of their block ([`TaoScheme::arrive`] names them).
    waiters: HashMap<Ticket, oneshot::Sender<Vec<u8>>>,
    /// Resident buckets that write-backs left alone because they had not changed.
    top_unchanged: u64,
    /// Resident buckets written back since [`TaoOram::take_top_written`] last took them, the
    /// latest write of each (`None`: not recorded; see [`TaoOram::record_top_writes`]).
    top_written: Option<HashMap<u64, TopWritten>>,
    /// Resident buckets written back (to `top_written`) but not sealed since; see
    /// [`TaoOram::seal_top`].
    top_unsealed: BTreeSet<u64>,
    /// Released when the most recent request's reply is released.
    seq_tail: Option<oneshot::Receiver<()>>,
    /// Closed batches waiting for the writer.
    wb_queue: Vec<Vec<Leaf>>,
    /// Whether the writer task is running.
    wb_running: bool,
    in_flight: usize,
    poisoned: bool,
}

impl State {
    /// No request in flight, no batch open, no write-back running: what
    /// [`TaoOram::export_state`] and [`TaoOram::seal_top`] need (after a flush).
    fn check_quiescent(&self) -> Result<()> {
        if self.in_flight != 0 || self.scheme.batch_open() || self.wb_running {
            return Err(ProxyError::State(
                "TaoStore engine is not quiescent: flush with no request in flight first".into(),
            ));
        }
        Ok(())
    }

    /// Whether bucket `b` is part of the resident tree top ([`TaoOram::keep_top_resident`]).
    fn is_resident(&self, b: u64) -> bool {
        self.scheme.is_resident(BucketId(b))
    }

    /// A request entered: one more in flight.
    fn admit(&mut self) {
        self.in_flight += 1;
        let stats = self.scheme.stats_mut();
        stats.max_in_flight = stats.max_in_flight.max(self.in_flight);
    }

    /// Hands the waiting fake reads their answers.
    fn answer_waiters(&mut self, answered: Vec<(Ticket, Vec<u8>)>) {
        for (ticket, data) in answered {
            if let Some(reply) = self.waiters.remove(&ticket) {
                // A waiter whose task is gone has nobody to answer.
                let _ = reply.send(data);
            }
        }
    }

    /// Queues a closed batch for the writer; returns whether the writer must be started.
    fn queue_batch(&mut self, paths: Vec<Leaf>) -> bool {
        self.wb_queue.push(paths);
        !std::mem::replace(&mut self.wb_running, true)
    }
}

struct Shared {
    config: TaoConfig,
    /// The scheme's parameters, for encoding and decoding buckets outside the lock.
    scheme: TaoSchemeConfig,
    store: Arc<dyn Store>,
    sealer: CellSealer,
    retry: RetryPolicy,
    state: Mutex<State>,
    /// Signalled whenever a request completes or a write-back finishes.
    changed: Notify,
}

/// Concurrent oblivious storage engine (TaoStore design) over a sealed store. See the module
/// docs for the design and what the store learns.
///
/// All methods take `&self`; share it as `Arc<TaoOram>` between tasks. Must be used inside a
/// tokio runtime (each request runs on a spawned task).
///
/// Any storage failure that outlasts the retries, and any integrity violation, *poisons* the
/// instance: later requests fail with [`ProxyError::Poisoned`]; reload exported state.
pub struct TaoOram {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TaoOram {
    // Leaves and block ids are secrets: print only public parameters.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaoOram")
            .field("config", &self.shared.config)
            .field("store", &self.shared.store)
            .finish_non_exhaustive()
    }
}

struct Begun {
    request: TaoRequest,
    /// A fake read's answer, sent when the real read of its block arrives.
    later: Option<oneshot::Receiver<Vec<u8>>>,
    prev: Option<oneshot::Receiver<()>>,
    release: oneshot::Sender<()>,
    /// When set, the path is read only once this turns `true` (the reveal is logged).
    go: Option<watch::Receiver<bool>>,
}

impl TaoOram {
    /// A new, empty engine (never-written cells read as empty buckets: no initialisation).
    pub fn new(config: TaoConfig, store: Arc<dyn Store>, sealer: CellSealer) -> Result<Self> {
        Self::with_rng(config, store, sealer, ChaCha20Rng::from_entropy())
    }

    /// A new, empty engine drawing leaves from `rng` (seeded for reproducible tests).
    pub fn with_rng(
        config: TaoConfig,
        store: Arc<dyn Store>,
        sealer: CellSealer,
        rng: ChaCha20Rng,
    ) -> Result<Self> {
        let state = TaoState {
            posmap: vec![0; config.blocks() as usize],
            stash: Vec::new(),
            versions: VersionTable::new(config.tree.total_cells()),
            stats: TaoStats::default(),
            config,
        };
        Self::from_state(state, store, sealer, rng)
    }

    /// Continues from exported trusted state.
    pub fn from_state(
        state: TaoState,
        store: Arc<dyn Store>,
        sealer: CellSealer,
        rng: ChaCha20Rng,
    ) -> Result<Self> {
        let config = state.config;
        check_geometry(store.geometry(), config.geometry()?)?;
        let bad = |m: &str| Err(ProxyError::State(format!("imported TaoStore state: {m}")));
        if state.versions.len() != config.tree.total_cells() {
            return bad("version table size does not match the configuration");
        }
        let scheme_config = config.scheme()?;
        let scheme =
            TaoScheme::new(scheme_config.clone(), state.posmap, state.stash, state.stats, rng)
                .map_err(|e| ProxyError::State(format!("imported TaoStore state: {e}")))?;
        let st = State {
            scheme,
            versions: state.versions,
            waiters: HashMap::new(),
            top_unchanged: 0,
            top_written: None,
            top_unsealed: BTreeSet::new(),
            seq_tail: None,
            wb_queue: Vec::new(),
            wb_running: false,
            in_flight: 0,
            poisoned: false,
        };
        Ok(Self {
            shared: Arc::new(Shared {
                config,
                scheme: scheme_config,
                store,
                sealer,
                retry: RetryPolicy::default(),
                state: Mutex::new(st),
                changed: Notify::new(),
            }),
        })
    }

    /// Takes over a store filled by [`SealedPathOram`] (for example by its bulk load): same
    /// tree, same bucket format. The Path ORAM must have used an in-memory position map, no
    /// cached levels and the tree shape of `config`.
    pub fn from_path_state(
        config: TaoConfig,
        state: SealedPathState,
        store: Arc<dyn Store>,
        sealer: CellSealer,
        rng: ChaCha20Rng,
    ) -> Result<Self> {
        let oram = state.oram;
        let same = oram.config.trees() == config.tree.trees()
            && oram.config.block_size() == config.block_size()
            && oram.config.z() == config.z()
            && oram.config.cache_levels() == 0
            && oram.config.posmap() == PosMapMode::InMemory
            && oram.stashes.len() == 1;
        if !same {
            return Err(ProxyError::State(
                "the Path ORAM state does not have this engine's tree".into(),
            ));
        }
        let stash = oram.stashes.into_iter().next().unwrap_or_default();
        let tao = TaoState {
            posmap: oram.top,
            stash,
            versions: state.versions,
            stats: TaoStats::default(),
            config,
        };
        Self::from_state(tao, store, sealer, rng)
    }

    /// The parameters.
    pub fn config(&self) -> &TaoConfig {
        &self.shared.config
    }

    /// The key epoch it seals under now (it moves on after 2^31 seals).
    pub fn current_epoch(&self) -> u32 {
        self.shared.sealer.current_epoch()
    }

    /// Keeps the top `buckets` buckets of the tree (heap order) in the subtree, open, once they
    /// are fetched, and writes one back only when its contents changed since the store last
    /// held them. Only for buckets the store below keeps in trusted memory (a
    /// [`crate::pinned::PinnedStore`]): the untrusted store never sees those cells, so what it
    /// sees is unchanged, while the engine no longer re-opens them on every fetch nor re-seals
    /// (and the durable engine no longer logs) the ones a write-back did not change. Not while
    /// rotating the key: a sweep must re-seal every cell. The open copies count as trusted
    /// memory ([`TaoOram::trusted_bytes`]) but not against `subtree_limit`.
    pub fn keep_top_resident(&self, buckets: u64) {
        self.shared.state.lock().scheme.keep_top_resident(buckets);
    }

    /// From now on, a write-back of a resident bucket ([`TaoOram::keep_top_resident`]) neither
    /// seals nor writes it: it takes a new version and is handed, open, to
    /// [`TaoOram::take_top_written`] (the durable engine logs it by block), and the store below
    /// keeps its older sealed copy (or none: see [`TaoOram::take_newly_open`]) until
    /// [`TaoOram::seal_top`]. Nobody opens that copy meanwhile: a resident bucket stays in the
    /// subtree once fetched.
    pub(crate) fn record_top_writes(&self) {
        self.shared.state.lock().top_written.get_or_insert_with(HashMap::new);
    }

    /// The resident buckets that entered the subtree, open, since the last call. They stay
    /// there for good, and the engine never reads the store's copies of them again.
    pub(crate) fn take_newly_open(&self) -> Vec<u64> {
        self.shared.state.lock().scheme.take_newly_open().into_iter().map(|b| b.0).collect()
    }

    /// Seals, under their current versions, the resident buckets written back since the last
    /// call ([`TaoOram::record_top_writes`]) and the resident buckets `also` (held open), for
    /// the store below to hold before its copies are read outside the engine (a verify).
    /// Only when quiescent, as [`TaoOram::export_state`].
    pub(crate) fn seal_top(&self, also: &[u64]) -> Result<Vec<(u64, Vec<u8>)>> {
        let open: Vec<(u64, u64, Vec<TaoBlock>)> = {
            let mut s = self.shared.state.lock();
            s.check_quiescent()?;
            let mut cells = std::mem::take(&mut s.top_unsealed);
            cells.extend(also.iter().copied().filter(|&b| s.is_resident(b)));
            cells
                .into_iter()
                .map(|b| {
                    // A resident bucket, once in the subtree, stays there.
                    let blocks = s.scheme.held_bucket(BucketId(b)).ok_or_else(|| {
                        ProxyError::State(format!("tree top bucket {b} is not held open"))
                    })?;
                    Ok((b, s.versions.get(b), blocks.to_vec()))
                })
                .collect::<Result<_>>()?
        };
        let sh = &self.shared;
        let mut sealed = Vec::with_capacity(open.len());
        for (b, version, blocks) in open {
            let cell = sh.seal_bucket(b, version, &blocks)?;
            sealed.push((b, version, cell));
        }
        let mut s = sh.state.lock();
        for (b, version, cell) in &sealed {
            s.versions.record(*b, *version, cell);
        }
        Ok(sealed.into_iter().map(|(b, _, cell)| (b, cell)).collect())
    }

    /// Every resident bucket held open in the subtree, open, with its current version, sorted
    /// by cell: what a checkpoint keeps of the tree top instead of sealed cells. Only when
    /// quiescent, as [`TaoOram::export_state`].
    pub(crate) fn open_top(&self) -> Result<Vec<TopWritten>> {
        let s = self.shared.state.lock();
        s.check_quiescent()?;
        let mut out: Vec<TopWritten> = s
            .scheme
            .resident_buckets()
            .map(|(b, blocks)| TopWritten {
                cell: b.0,
                version: s.versions.get(b.0),
                blocks: blocks.iter().map(|e| (e.id, e.leaf, e.data.clone())).collect(),
            })
            .collect();
        out.sort_unstable_by_key(|w| w.cell);
        Ok(out)
    }

    /// The resident buckets written back since the last call (the latest write of each, sorted
    /// by cell); empty unless [`TaoOram::record_top_writes`] was called. Call it with the
    /// engine flushed, so that every write it returns is complete.
    pub(crate) fn take_top_written(&self) -> Vec<TopWritten> {
        let mut s = self.shared.state.lock();
        let Some(written) = s.top_written.as_mut() else { return Vec::new() };
        let mut out: Vec<TopWritten> = written.drain().map(|(_, w)| w).collect();
        out.sort_unstable_by_key(|w| w.cell);
        out
    }

    /// Resident buckets ([`TaoOram::keep_top_resident`]) that write-backs left alone because
    /// their contents had not changed, since this engine was opened.
    pub fn top_unchanged(&self) -> u64 {
        self.shared.state.lock().top_unchanged
    }

    /// The store this engine reads and writes.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.shared.store
    }

    /// Reads a block (zeros if never written).
    pub async fn read(&self, block: BlockId) -> Result<Vec<u8>> {
        self.access(block, Op::Read).await
    }

    /// Writes a block.
    pub async fn write(&self, block: BlockId, data: Vec<u8>) -> Result<()> {
        self.access(block, Op::Write(data)).await.map(drop)
    }

    /// One logical access; returns the block's contents before it. Requests are ordered by
    /// the moment this is called: a request sees the effect of every request that arrived
    /// before it, and its reply is released after theirs.
    pub async fn access(&self, block: BlockId, op: Op) -> Result<Vec<u8>> {
        self.submit(block, op)?.await
    }

    /// Submits a request *now* and returns its reply as a future. The request's place in the
    /// order is fixed by this call (not by when the future is first polled), and it is served
    /// even if the future is dropped.
    pub fn submit(&self, block: BlockId, op: Op) -> Result<Reply> {
        let begun = self.shared.begin(block, op)?;
        let shared = Arc::clone(&self.shared);
        Ok(Reply(tokio::spawn(async move { shared.finish(begun).await })))
    }

    /// Paths a sweep covers: one per leaf. Every stored cell lies on at least one.
    pub fn sweep_paths(&self) -> u64 {
        self.shared.shape().leaves()
    }

    /// Reads the path to `leaf` and writes it back (with the next write-back, evicting what
    /// fits, as any request does), remapping no block: a step of a sweep that rewrites every
    /// stored cell in a fixed order, e.g. to re-seal them under a new key. The path depends
    /// only on `leaf`, so the store learns only that a sweep runs; the leaves of requests stay
    /// fresh and uniform. Ordered with requests as [`TaoOram::submit`] is.
    pub fn sweep(&self, leaf: u64) -> Result<Reply> {
        let shape = self.shared.shape();
        if leaf >= shape.leaves() {
            return Err(ProxyError::State(format!(
                "sweep path {leaf} out of range (a sweep has {} paths)",
                shape.leaves()
            )));
        }
        let begun = {
            let mut guard = self.shared.state.lock();
            let s = &mut *guard;
            if s.poisoned {
                return Err(ProxyError::Poisoned);
            }
            let request =
                s.scheme.start_sweep(Leaf(leaf)).map_err(|e| ProxyError::State(e.to_string()))?;
            let (release, rx) = oneshot::channel();
            let prev = s.seq_tail.replace(rx);
            s.in_flight += 1;
            Begun { request, later: None, prev, release, go: None }
        };
        let shared = Arc::clone(&self.shared);
        Ok(Reply(tokio::spawn(async move { shared.finish(begun).await })))
    }

    /// Submits `ops` now, in order, like [`TaoOram::submit`] each, but holds back their path
    /// reads: `journal` is called with what the requests will reveal (in arrival order, the
    /// whole batch contiguous with no other request between) while the engine's lock is held,
    /// and the reads start only once the returned sender is set to `true`. Dropping the
    /// sender instead fails the requests and poisons the engine (nothing was revealed, but
    /// the position map already moved on).
    ///
    /// A driver makes the reveals durable between the two, so that no crash can bring a block
    /// back on a leaf the store has seen. Invalid `ops` are refused before any is submitted.
    pub fn submit_gated(
        &self,
        ops: Vec<(BlockId, Op)>,
        journal: impl FnOnce(&[Reveal]),
    ) -> Result<(Vec<Reply>, watch::Sender<bool>)> {
        for (block, op) in &ops {
            self.shared.validate(*block, op)?;
        }
        let (go, rx) = watch::channel(false);
        let begun = {
            let mut guard = self.shared.state.lock();
            let mut begun = Vec::with_capacity(ops.len());
            for (block, op) in ops {
                begun.push(self.shared.begin_locked(&mut guard, block, op, Some(rx.clone()))?);
            }
            let reveals: Vec<Reveal> = begun.iter().map(|b| b.request.reveal()).collect();
            journal(&reveals);
            begun
        };
        let replies = begun
            .into_iter()
            .map(|b| {
                let shared = Arc::clone(&self.shared);
                Reply(tokio::spawn(async move { shared.finish(b).await }))
            })
            .collect();
        Ok((replies, go))
    }

    /// Waits until `n` more requests fit under the trusted-memory high-water mark: half of
    /// `subtree_limit`, counting the buckets held plus a whole path for every request in
    /// flight and for each of the `n`. Always admits when nothing is in flight (then the
    /// subtree can only shrink by the requests finishing and their write-backs), so it never
    /// waits forever. Callers that admit one at a time (a mutex over this call and the
    /// `submit`) keep the subtree below the mark plus one batch of paths, whatever the load:
    /// back-pressure instead of [`ProxyError::Capacity`].
    pub async fn wait_for_room(&self, n: usize) {
        let sh = &self.shared;
        let per_path = sh.shape().levels() as usize;
        let high = sh.config.subtree_limit / 2;
        sh.wait_until(|s| {
            s.poisoned
                || s.in_flight == 0
                || s.scheme.held().saturating_add((s.in_flight + n).saturating_mul(per_path))
                    <= high
        })
        .await
    }

    /// After a crash: moves every block named in `reveals` (logged by
    /// [`TaoOram::submit_gated`] since the state this engine was loaded from) to its last
    /// logged new leaf. Reads the path of every logged reveal again, in order — paths the
    /// store saw before the crash, or would have seen — and nothing else, then places the
    /// blocks as deep as their new leaves allow; [`TaoOram::flush`] then writes the paths
    /// back. Call on a fresh, quiescent engine before any request.
    ///
    /// Why every block is found: reveals are logged in arrival order and made durable as a
    /// prefix, and a block's first request after the loaded state reads the path of its
    /// loaded leaf (a fake read happens only while an earlier request of the block is in
    /// flight), so that path is among the ones read here, or the block is in the stash.
    pub async fn replay_reveals(&self, reveals: &[Reveal]) -> Result<()> {
        let sh = &self.shared;
        {
            let s = sh.state.lock();
            s.scheme.replay_check(reveals).map_err(|e| ProxyError::State(e.to_string()))?;
            if s.in_flight != 0 {
                return Err(ProxyError::State("replay needs a fresh, quiescent engine".into()));
            }
        }
        for r in reveals {
            let buckets = sh.state.lock().scheme.replay_read(r);
            let cells: Vec<CellId> = buckets.iter().map(|b| CellId(b.0)).collect();
            let fetched = match with_retry(sh.retry, || sh.store.read(&cells)).await {
                Ok(f) => f,
                Err(e) => {
                    sh.state.lock().poisoned = true;
                    return Err(e.into());
                }
            };
            let opened = match sh.open_fetched(&buckets, fetched.into_iter().map(Some).collect()) {
                Ok(opened) => opened,
                Err(e) => {
                    sh.state.lock().poisoned = true;
                    return Err(e);
                }
            };
            sh.state.lock().scheme.replay_arrive(opened);
        }
        sh.state.lock().scheme.replay_settle(reveals).map_err(ProxyError::Capacity)
    }

    /// Waits until no request is in flight, writes back every path fetched so far (an
    /// incomplete batch too), waits for every write-back and flushes the store. Afterwards the
    /// subtree is empty and [`TaoOram::export_state`] succeeds, as long as no new request
    /// arrived meanwhile.
    pub async fn flush(&self) -> Result<()> {
        let sh = &self.shared;
        sh.wait_until(|s| s.in_flight == 0).await;
        let job = {
            let mut s = sh.state.lock();
            if s.poisoned {
                return Err(ProxyError::Poisoned);
            }
            match s.scheme.close_batch() {
                Some(paths) => s.queue_batch(paths),
                None => false,
            }
        };
        if job {
            sh.spawn_writer();
        }
        sh.wait_until(|s| !s.wb_running).await;
        if sh.state.lock().poisoned {
            return Err(ProxyError::Poisoned);
        }
        with_retry(sh.retry, || sh.store.flush()).await?;
        Ok(())
    }

    /// Exports the trusted state. Only when quiescent: after [`TaoOram::flush`] with no request
    /// in flight.
    pub fn export_state(&self) -> Result<TaoState> {
        let s = self.shared.state.lock();
        if s.poisoned {
            return Err(ProxyError::Poisoned);
        }
        s.check_quiescent()?;
        // What a flush leaves: nothing but resident buckets, each as the store holds it.
        if !s.scheme.settled() {
            return Err(ProxyError::State(
                "TaoStore engine is not quiescent: buckets wait for their write-back; flush first"
                    .into(),
            ));
        }
        let (posmap, stash) = s.scheme.export();
        Ok(TaoState {
            config: self.shared.config.clone(),
            posmap,
            stash,
            versions: s.versions.clone(),
            stats: s.scheme.stats().clone(),
        })
    }

    /// Statistics so far.
    pub fn stats(&self) -> TaoStats {
        self.shared.state.lock().scheme.stats().clone()
    }

    /// Blocks in the stash now.
    pub fn stash_len(&self) -> usize {
        self.shared.state.lock().scheme.stash_len()
    }

    /// Buckets in the subtree now, the resident tree top aside
    /// ([`TaoOram::keep_top_resident`]).
    pub fn subtree_len(&self) -> usize {
        self.shared.state.lock().scheme.held()
    }

    /// Bytes of trusted memory now: position map, stash, subtree and version table.
    pub fn trusted_bytes(&self) -> u64 {
        let s = self.shared.state.lock();
        let block = u64::from(self.shared.config.block_size()) + SLOT_HEADER as u64;
        let scheme = &s.scheme;
        let slots = scheme.subtree_blocks() as u64;
        scheme.posmap_len() as u64 * 4
            + (scheme.stash_len() as u64 + slots) * block
            + scheme.subtree_buckets() as u64 * 16
            + s.versions.trusted_bytes()
    }

    /// Blocks whose current path crosses one of the cells `bad` (which, while those cells are
    /// damaged, cannot be read), sorted. Blocks in the stash are not among them.
    pub fn blocks_through(&self, bad: &[u64]) -> Vec<u64> {
        self.shared.state.lock().scheme.blocks_through(bad)
    }

    /// Whether a failure poisoned the instance.
    pub fn is_poisoned(&self) -> bool {
        self.shared.state.lock().poisoned
    }
}

impl Shared {
    fn shape(&self) -> TreeShape {
        self.config.shape()
    }

    /// Arrival: sequencer ticket, then the scheme's leaf lookup, remap and choice of a real or
    /// fake read. No I/O.
    fn begin(&self, block: BlockId, op: Op) -> Result<Begun> {
        self.validate(block, &op)?;
        let mut guard = self.state.lock();
        self.begin_locked(&mut guard, block, op, None)
    }

    /// Checks one request's arguments.
    fn validate(&self, block: BlockId, op: &Op) -> Result<()> {
        Ok(self.scheme.validate(block, op)?)
    }

    /// [`Shared::begin`] with the state locked and the arguments validated.
    fn begin_locked(
        &self,
        s: &mut State,
        block: BlockId,
        op: Op,
        go: Option<watch::Receiver<bool>>,
    ) -> Result<Begun> {
        if s.poisoned {
            return Err(ProxyError::Poisoned);
        }
        let (release, rx) = oneshot::channel();
        let prev = s.seq_tail.replace(rx);
        let request = s.scheme.start(block, op);
        let later = request.is_fake().then(|| {
            let (reply, answer) = oneshot::channel();
            s.waiters.insert(request.ticket(), reply);
            answer
        });
        s.admit();
        Ok(Begun { request, later, prev, release, go })
    }

    /// Serves a request, then releases its reply in arrival order.
    async fn finish(self: Arc<Self>, begun: Begun) -> Result<Vec<u8>> {
        let Begun { request, later, prev, release, go } = begun;
        let result = self.serve(request, later, go).await;
        if let Some(prev) = prev {
            // An error means the earlier request's task is gone; its reply is released too.
            let _ = prev.await;
        }
        let _ = release.send(());
        result
    }

    async fn serve(
        self: &Arc<Self>,
        request: TaoRequest,
        later: Option<oneshot::Receiver<Vec<u8>>>,
        go: Option<watch::Receiver<bool>>,
    ) -> Result<Vec<u8>> {
        let real = request.is_real();
        let block = request.block();
        let allowed = match go {
            Some(mut go) => go.wait_for(|v| *v).await.is_ok(),
            None => true,
        };
        let outcome = if allowed {
            self.fetch_and_evict(request).await
        } else {
            Err(ProxyError::State("the reveal log could not be written; path not read".into()))
        };
        let answer = {
            let mut s = self.state.lock();
            s.in_flight -= 1;
            match outcome {
                Ok((answer, None)) => Ok(answer),
                // The request took effect and the state is consistent; only the bound on
                // trusted memory was exceeded.
                Ok((_, Some(what))) => Err(ProxyError::Capacity(what)),
                Err(e) => {
                    if real {
                        // Dropping the waiters tells them the read failed.
                        for ticket in s.scheme.abandon(block) {
                            s.waiters.remove(&ticket);
                        }
                    }
                    s.poisoned = true;
                    tracing::warn!(error = %e, "TaoStore request failed; instance poisoned");
                    Err(e)
                }
            }
        };
        self.changed.notify_waiters();
        match answer? {
            Some(data) => Ok(data),
            None => match later {
                Some(rx) => rx.await.map_err(|_| ProxyError::Poisoned),
                None => Err(ProxyError::State("TaoStore request left unanswered".into())),
            },
        }
    }

    /// Opens the fetched copies of the path `buckets` that the scheme needs (those not in the
    /// subtree), under their trusted versions, outside the lock.
    fn open_fetched(
        &self,
        buckets: &[BucketId],
        mut fetched: Vec<Option<Vec<u8>>>,
    ) -> Result<Vec<(BucketId, Vec<TaoBlock>)>> {
        // Which fetched buckets are not in the subtree yet, and their trusted versions
        // (version, key epoch).
        let absent: Vec<(usize, u64, u32)> = {
            let s = self.state.lock();
            s.scheme
                .to_open(buckets)
                .into_iter()
                .map(|i| (i, s.versions.get(buckets[i].0), s.versions.epoch(buckets[i].0)))
                .collect()
        };
        let mut opened = Vec::with_capacity(absent.len());
        for (i, version, epoch) in absent {
            let raw = fetched[i].take().unwrap_or_default();
            let blocks = if version == 0 {
                Vec::new()
            } else {
                let (buf, plain) =
                    open_cell_in(&self.sealer, CellId(buckets[i].0), version, epoch, raw)?;
                self.scheme.decode_bucket(&buf[plain])?
            };
            opened.push((buckets[i], blocks));
        }
        Ok(opened)
    }

    /// Fetches the path, opens what the scheme needs, and lets the scheme answer, evict and
    /// close a batch every `k` paths.
    async fn fetch_and_evict(
        self: &Arc<Self>,
        request: TaoRequest,
    ) -> Result<(Option<Vec<u8>>, Option<String>)> {
        let buckets: Vec<BucketId> = self.scheme.path(request.leaf()).collect();
        // Resident buckets already held open need no read (they never leave the subtree, and
        // the store below keeps them in trusted memory: the untrusted store sees the same).
        let wanted = self.state.lock().scheme.to_fetch(&buckets);
        let mut fetched: Vec<Option<Vec<u8>>> = vec![None; buckets.len()];
        if !wanted.is_empty() {
            let read: Vec<CellId> = wanted.iter().map(|&i| CellId(buckets[i].0)).collect();
            let raw = with_retry(self.retry, || self.store.read(&read)).await?;
            for (i, cell) in wanted.into_iter().zip(raw) {
                fetched[i] = Some(cell);
            }
        }
        let opened = self.open_fetched(&buckets, fetched)?;

        let mut guard = self.state.lock();
        let s = &mut *guard;
        let arrived = s.scheme.arrive(request, opened);
        s.answer_waiters(arrived.answered);
        let job = match arrived.closed {
            Some(paths) => s.queue_batch(paths),
            None => false,
        };
        drop(guard);
        if job {
            self.spawn_writer();
        }
        Ok((arrived.answer, arrived.over))
    }

    fn spawn_writer(self: &Arc<Self>) {
        let shared = Arc::clone(self);
        tokio::spawn(async move { shared.writer().await });
    }

    /// The writer: one write-back at a time, in order. Each takes every closed batch queued so
    /// far (normally one; several when the previous write was slow), snapshots the current
    /// contents of the union of their paths' buckets under the next versions, seals and
    /// writes them as one batch, then lets go of the buckets nobody needs any more.
    ///
    /// Being one task, it never has two writes of a cell in flight, so the store can never
    /// apply an older version over a newer one. Writing several queued batches at once keeps
    /// the write-back rate from being capped at one batch per round trip; how many batches a
    /// write covers depends only on when requests arrived and when the store answered.
    async fn writer(&self) {
        loop {
            let (paths, wb, cells, top) = {
                let mut guard = self.state.lock();
                let s = &mut *guard;
                if s.wb_queue.is_empty() || s.poisoned {
                    s.wb_running = false;
                    drop(guard);
                    self.changed.notify_waiters();
                    return;
                }
                let batches = std::mem::take(&mut s.wb_queue);
                s.scheme.stats_mut().write_backs += batches.len() as u64;
                let paths: Vec<Leaf> = batches.into_iter().flatten().collect();
                let mut wb = s.scheme.snapshot(&paths);
                s.top_unchanged += wb.unchanged;
                let mut cells = Vec::with_capacity(wb.buckets.len());
                // Resident buckets handed over open instead of sealed (record_top_writes).
                let mut top = Vec::new();
                for (b, blocks) in std::mem::take(&mut wb.buckets) {
                    let b = b.0;
                    let version = s.versions.next(b);
                    s.versions.set(b, version);
                    if s.is_resident(b) && s.top_written.is_some() {
                        let blocks =
                            blocks.iter().map(|e| (e.id, e.leaf, e.data.clone())).collect();
                        top.push(TopWritten { cell: b, version, blocks });
                        continue;
                    }
                    cells.push((b, version, blocks));
                }
                (paths, wb, cells, top)
            };
            let count = cells.len() as u64;
            // Key epoch each cell was sealed under, recorded once the write is done (until
            // then the buckets stay pinned in the subtree: nobody opens their stored copies).
            let mut epochs = Vec::with_capacity(cells.len());
            let result = async {
                let mut sealed = Vec::with_capacity(cells.len());
                for (b, version, blocks) in cells {
                    let cell = self.seal_bucket(b, version, &blocks)?;
                    epochs.push((b, crate::versions::sealed_epoch(&cell)));
                    sealed.push((CellId(b), cell));
                }
                if sealed.is_empty() {
                    return Ok(());
                }
                write_sealed(&*self.store, self.retry, sealed).await
            }
            .await;
            {
                let mut guard = self.state.lock();
                let s = &mut *guard;
                match result {
                    Ok(()) => {
                        s.top_unsealed.extend(top.iter().map(|w| w.cell));
                        if let Some(written) = s.top_written.as_mut() {
                            written.extend(top.into_iter().map(|w| (w.cell, w)));
                        }
                        for (b, epoch) in epochs {
                            s.versions.set_epoch(b, epoch.unwrap_or(VersionTable::ANY_EPOCH));
                        }
                        s.scheme.written(&paths, &wb);
                        let stats = s.scheme.stats_mut();
                        stats.write_requests += 1;
                        stats.cells_written += count;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "TaoStore write-back failed; instance poisoned");
                        s.poisoned = true;
                    }
                }
            }
            self.changed.notify_waiters();
        }
    }

    async fn wait_until(&self, cond: impl Fn(&State) -> bool) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if cond(&self.state.lock()) {
                return;
            }
            notified.await;
        }
    }

    /// Bucket `b`'s blocks encoded and sealed under `version`, the plaintext built in the
    /// buffer it is sealed in.
    fn seal_bucket(&self, b: u64, version: u64, blocks: &[TaoBlock]) -> Result<Vec<u8>> {
        let plain_len =
            self.config.z() as usize * (SLOT_HEADER + self.config.block_size() as usize);
        seal_cell_with(&self.sealer, CellId(b), version, plain_len, |out| {
            self.scheme.encode_bucket_into(blocks.iter().map(|e| (e.id, e.leaf, &e.data[..])), out)
        })
    }
}

/// A bucket's plaintext: `Z` slots of `id + 1`, leaf and contents; empty slots are zeros.
/// At most `Z` blocks, each of the block size (the caller checks).
pub(crate) fn encode_bucket<'a>(
    config: &TaoConfig,
    blocks: impl Iterator<Item = (u64, u32, &'a [u8])>,
) -> Vec<u8> {
    blindfold_oram::tao::encode_bucket(config.z(), config.block_size(), blocks)
}

/// The reply to a request made with [`TaoOram::submit`]: resolves to the block's contents
/// before the access. Replies resolve in the order their requests were submitted.
#[derive(Debug)]
pub struct Reply(tokio::task::JoinHandle<Result<Vec<u8>>>);

impl std::future::Future for Reply {
    type Output = Result<Vec<u8>>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx).map(|joined| {
            joined.map_err(|e| ProxyError::State(format!("TaoStore request task failed: {e}")))?
        })
    }
}
