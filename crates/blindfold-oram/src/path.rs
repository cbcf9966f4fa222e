//! Path ORAM (Stefanov et al., CCS 2013; seed 002, Algorithm 1).
//!
//! Blocks live in a binary tree of buckets of `Z` slots. Each block is mapped to a uniformly
//! random leaf and lives somewhere on the path to that leaf, or in the stash. An access reads
//! the whole path to the block's leaf into the stash, remaps the block to a fresh random leaf,
//! and writes the path back, filling buckets greedily from the leaf up with every stash block
//! whose own path passes through them.
//!
//! The position map is either a plain array in trusted memory (4 bytes per block) or
//! *recursive*: it is itself stored, `block_size / 4` entries to a block, in smaller Path ORAM
//! trees in the same store, until what is left fits `max_in_memory_entries`. Every access then
//! walks all trees from the smallest position map down to the data, one path each.
//!
//! The top `cache_levels` levels of every tree can be kept in trusted memory; their buckets
//! are then never read from or written to the store.
//!
//! # Bulk loading
//!
//! A *fresh* ORAM can be filled with initial contents without one full access per block:
//! [`PathOram::bulk_load`] starts a [`BulkLoad`], and [`PathOram::bulk_load_step`] hands out the
//! plaintext of every bucket of every tree, a batch at a time, for the driver to write. Each
//! block gets a uniformly random leaf and is placed greedily as deep as possible on its path
//! (the buckets are filled in post-order, each taking up to `Z` of the blocks below it that did
//! not fit deeper; what does not fit in the root goes to the stash). With a recursive position
//! map, each position-map tree is then loaded the same way with the leaves of the tree below as
//! its contents, and the in-memory map receives the leaves of the last tree. Afterwards the ORAM
//! reads and behaves exactly as if every block had been written through it: each block lies on
//! the path to its own uniformly random leaf, or in the stash. Trusted memory during the load is
//! about 12 bytes per block (leaf and sorted id) plus one batch; buckets are built on demand.
//!
//! # Bucket format (plaintext; the driver seals it into one cell)
//!
//! `Z` slots of `12 + block_size` bytes: `id + 1` as u64 LE (0 marks an empty slot), the
//! block's leaf as u32 LE, then the block. An all-zero bucket is an empty bucket, so a cell that
//! was never written needs no initialisation.
//!
//! # Security
//!
//! Each access reads then writes exactly one path of each tree, trees in a fixed order, with
//! every path chosen by a leaf drawn uniformly at random when the block was last remapped and
//! never used since. The store learns the number and timing of accesses, nothing else. Blocks
//! that were never written are fetched along a fresh random path, exactly like others.
//!
//! A bulk load writes every stored bucket of every tree exactly once, in a fixed order (the data
//! tree, then each position-map tree; within a tree, buckets in post-order), and reads nothing.
//! That order and the batch sizes depend only on the public parameters, never on the contents
//! or the leaves, so the store learns only that a load of this size took place (and its timing).

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};

use blindfold_store::CellId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::{BlockId, BucketId, Leaf, Op, OramError, Progress, Result, TreeShape};

/// Bytes of per-slot header in a bucket: block id + 1 (u64) and leaf (u32).
pub const SLOT_HEADER: usize = 12;

/// Default stash bound (blocks held between accesses, per tree).
pub const DEFAULT_STASH_LIMIT: usize = 200;

/// Where the position map lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PosMapMode {
    /// A plain array in trusted memory, 4 bytes per block.
    InMemory,
    /// Stored in smaller Path ORAM trees until at most `max_in_memory_entries` entries remain
    /// in trusted memory.
    Recursive {
        /// Entries kept in trusted memory at the top of the recursion.
        max_in_memory_entries: u64,
    },
}

/// Validated Path ORAM parameters. Build with [`PathOramConfig::builder`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathOramConfig {
    blocks: u64,
    block_size: u32,
    z: u32,
    stash_limit: usize,
    posmap: PosMapMode,
    cache_levels: u32,
    trees: Vec<TreeLayout>,
}

/// Shape and place of one tree of a Path ORAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeLayout {
    /// Tree geometry.
    pub shape: TreeShape,
    /// Blocks this tree holds.
    pub blocks: u64,
    /// First cell of this tree in the store.
    pub base: u64,
}

/// Builder for [`PathOramConfig`].
#[derive(Clone, Debug)]
pub struct PathOramConfigBuilder {
    blocks: u64,
    block_size: u32,
    z: u32,
    stash_limit: usize,
    posmap: PosMapMode,
    cache_levels: u32,
    leaves: Option<u64>,
}

impl PathOramConfig {
    /// Starts a configuration for `blocks` logical blocks of `block_size` bytes.
    pub fn builder(blocks: u64, block_size: u32) -> PathOramConfigBuilder {
        PathOramConfigBuilder {
            blocks,
            block_size,
            z: 4,
            stash_limit: DEFAULT_STASH_LIMIT,
            posmap: PosMapMode::InMemory,
            cache_levels: 0,
            leaves: None,
        }
    }

    /// Logical capacity in blocks.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }
    /// Bytes per logical block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }
    /// Slots per bucket.
    pub fn z(&self) -> u32 {
        self.z
    }
    /// Stash bound per tree.
    pub fn stash_limit(&self) -> usize {
        self.stash_limit
    }
    /// Position map mode.
    pub fn posmap(&self) -> PosMapMode {
        self.posmap
    }
    /// Top levels of each tree kept in trusted memory.
    pub fn cache_levels(&self) -> u32 {
        self.cache_levels
    }
    /// The trees: index 0 holds the data, the others the position map, smallest last.
    pub fn trees(&self) -> &[TreeLayout] {
        &self.trees
    }
    /// Plaintext bytes of one bucket (one cell before sealing).
    pub fn bucket_bytes(&self) -> usize {
        self.z as usize * (SLOT_HEADER + self.block_size as usize)
    }
    /// Cells the store must hold: the buckets of all trees.
    pub fn total_cells(&self) -> u64 {
        self.trees.iter().map(|t| t.shape.buckets()).sum()
    }
    /// Entries of the position map kept in trusted memory.
    pub fn in_memory_entries(&self) -> u64 {
        self.trees.last().map(|t| t.blocks).unwrap_or(0)
    }
    /// Position-map entries per stored block.
    pub fn entries_per_block(&self) -> u64 {
        u64::from(self.block_size / 4)
    }
    /// Cells read (and written) by one logical access.
    pub fn cells_per_access(&self) -> u64 {
        self.trees
            .iter()
            .map(|t| u64::from(t.shape.levels().saturating_sub(self.cache_levels)))
            .sum()
    }
}

impl PathOramConfigBuilder {
    /// Slots per bucket (default 4).
    pub fn z(mut self, z: u32) -> Self {
        self.z = z;
        self
    }
    /// Stash bound per tree, in blocks held between accesses (default 200).
    pub fn stash_limit(mut self, limit: usize) -> Self {
        self.stash_limit = limit;
        self
    }
    /// Where the position map lives (default in memory).
    pub fn posmap(mut self, mode: PosMapMode) -> Self {
        self.posmap = mode;
        self
    }
    /// Keep the top `levels` levels of every tree in trusted memory (default 0).
    pub fn cache_levels(mut self, levels: u32) -> Self {
        self.cache_levels = levels;
        self
    }
    /// Leaves of the data tree (rounded up to a power of two). Default: `blocks / Z`, so the
    /// tree has about twice as many slots as blocks, as in seed 002's experiment.
    pub fn leaves(mut self, leaves: u64) -> Self {
        self.leaves = Some(leaves);
        self
    }

    /// Checks the parameters.
    pub fn build(self) -> Result<PathOramConfig> {
        let bad = |m: String| Err(OramError::InvalidConfig(m));
        if self.blocks == 0 {
            return bad("capacity must be at least one block".into());
        }
        if self.block_size == 0 || self.block_size > 16 << 20 {
            return bad(format!("block size {} must be 1..=16 MiB", self.block_size));
        }
        if self.z == 0 || self.z > 64 {
            return bad(format!("Z = {} must be 1..=64", self.z));
        }
        if self.stash_limit == 0 {
            return bad("stash limit must be at least 1".into());
        }
        let leaves_for = |blocks: u64| blocks.div_ceil(u64::from(self.z));
        let shape = |leaves: u64| {
            TreeShape::for_leaves(leaves).ok_or_else(|| {
                OramError::InvalidConfig(format!(
                    "{leaves} leaves exceed the largest tree (2^{} leaves)",
                    TreeShape::MAX_HEIGHT
                ))
            })
        };
        let data_leaves = self.leaves.unwrap_or_else(|| leaves_for(self.blocks));
        let mut trees =
            vec![TreeLayout { shape: shape(data_leaves)?, blocks: self.blocks, base: 0 }];
        if let PosMapMode::Recursive { max_in_memory_entries } = self.posmap {
            let per_block = u64::from(self.block_size / 4);
            if per_block < 2 {
                return bad(format!(
                    "a recursive position map needs blocks of at least 8 bytes, not {}",
                    self.block_size
                ));
            }
            if max_in_memory_entries == 0 {
                return bad("a recursive position map must keep at least one entry".into());
            }
            let mut entries = self.blocks;
            while entries > max_in_memory_entries {
                let blocks = entries.div_ceil(per_block);
                trees.push(TreeLayout { shape: shape(leaves_for(blocks))?, blocks, base: 0 });
                entries = blocks;
            }
        }
        let mut base = 0u64;
        for t in &mut trees {
            t.base = base;
            base = base.checked_add(t.shape.buckets()).ok_or_else(|| {
                OramError::InvalidConfig("the trees need more than 2^64 cells".into())
            })?;
        }
        Ok(PathOramConfig {
            blocks: self.blocks,
            block_size: self.block_size,
            z: self.z,
            stash_limit: self.stash_limit,
            posmap: self.posmap,
            cache_levels: self.cache_levels,
            trees,
        })
    }
}

type Hasher = BuildHasherDefault<DefaultHasher>;

#[derive(Clone, Debug)]
struct Entry {
    leaf: u32,
    data: Vec<u8>,
}

#[derive(Debug)]
struct Tree {
    layout: TreeLayout,
    cache_levels: u32,
    /// Plaintext buckets of the cached top levels, heap-indexed.
    cache: Vec<Vec<u8>>,
    /// Cached buckets changed since the last [`PathOram::take_delta`] (may repeat).
    cache_dirty: Vec<u32>,
    /// Deterministic hasher so that seeded runs reproduce exactly.
    stash: HashMap<u64, Entry, Hasher>,
    max_stash: usize,
}

impl Tree {
    fn new(layout: TreeLayout, cache_levels: u32, bucket_bytes: usize) -> Self {
        let cache_levels = cache_levels.min(layout.shape.levels());
        let cached = (1usize << cache_levels) - 1;
        Self {
            layout,
            cache_levels,
            cache: vec![vec![0u8; bucket_bytes]; cached],
            cache_dirty: Vec::new(),
            stash: HashMap::default(),
            max_stash: 0,
        }
    }

    fn path_cells(&self, leaf: Leaf) -> Vec<CellId> {
        let shape = self.layout.shape;
        (self.cache_levels..shape.levels())
            .map(|l| CellId(self.layout.base + shape.bucket_on_path(leaf, l).0))
            .collect()
    }
}

/// Running statistics of one [`PathOram`].
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PathOramStats {
    /// Logical accesses completed.
    pub accesses: u64,
    /// Largest stash (blocks held between accesses) seen in the data tree.
    pub max_stash: usize,
    /// Sum of the data tree's stash sizes after each access (for the mean).
    pub stash_sum: u64,
    /// Stash size of the data tree after each access: `histogram[s]` accesses left `s` blocks.
    pub stash_histogram: Vec<u64>,
}

impl PathOramStats {
    /// Mean stash size after an access.
    pub fn mean_stash(&self) -> f64 {
        if self.accesses == 0 {
            0.0
        } else {
            self.stash_sum as f64 / self.accesses as f64
        }
    }
}

#[derive(Debug)]
struct Cursor {
    /// `None` for a sweep ([`PathOram::start_sweep`]) and once the data tree has taken it.
    op: Option<Op>,
    /// A sweep: read and write back one public path, remapping no block.
    sweep: bool,
    /// Block id in each tree on the way from the data down to the top of the recursion.
    ids: Vec<u64>,
    tree: usize,
    leaf: Leaf,
    new_leaf: Leaf,
    expect: usize,
}

/// The trusted state of a [`PathOram`] between accesses: enough to continue after a restart.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PathOramState {
    /// Parameters.
    pub config: PathOramConfig,
    /// In-memory position map entries (leaf + 1; 0 means never assigned).
    pub top: Vec<u32>,
    /// Stash of each tree: (block id, leaf, contents).
    #[serde(with = "crate::bytes::stashes")]
    pub stashes: Vec<Vec<(u64, u32, Vec<u8>)>>,
    /// Cached top-level buckets of each tree.
    #[serde(with = "crate::bytes::caches")]
    pub caches: Vec<Vec<Vec<u8>>>,
    /// Statistics so far.
    pub stats: PathOramStats,
}

/// A Path ORAM client as a state machine: [`PathOram::start`] an access, then
/// [`PathOram::feed`] it the plaintext of the cells it asks for until it is
/// [`Progress::Done`]. See the crate docs for a complete driver.
pub struct PathOram {
    config: PathOramConfig,
    trees: Vec<Tree>,
    top: Vec<u32>,
    rng: ChaCha20Rng,
    cur: Option<Cursor>,
    stats: PathOramStats,
    /// Identifier of the bulk load in progress, if any.
    loading: Option<u64>,
    /// In-memory position-map entries changed since the last [`PathOram::take_delta`].
    dirty_top: Vec<u32>,
    /// The whole in-memory map changed (bulk load) since the last delta.
    top_all_dirty: bool,
}

/// What changed in a [`PathOram`]'s trusted state since the previous [`PathOram::take_delta`]:
/// enough, together with the cells written, to redo the changes after a crash. Small compared
/// with the whole state: a few position-map entries and the stash.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct OramDelta {
    /// Changed in-memory position-map entries: (index, leaf + 1).
    pub top: Vec<(u32, u32)>,
    /// The stash of every tree, whole.
    #[serde(with = "crate::bytes::stashes")]
    pub stashes: Vec<Vec<(u64, u32, Vec<u8>)>>,
    /// The cached top-level buckets of every tree that changed: (heap index, contents).
    /// Empty when nothing is cached.
    #[serde(with = "crate::bytes::cache_changes")]
    pub caches: Vec<Vec<(u32, Vec<u8>)>>,
    /// Logical accesses completed, for the statistics.
    pub accesses: u64,
}

impl std::fmt::Debug for PathOram {
    // Leaves and block ids are secrets: print only public parameters.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PathOram").field("config", &self.config).finish_non_exhaustive()
    }
}

impl PathOram {
    /// A new, empty ORAM drawing its leaves from the operating system's entropy.
    pub fn new(config: PathOramConfig) -> Self {
        Self::with_rng(config, ChaCha20Rng::from_entropy())
    }

    /// A new, empty ORAM with a seeded generator, for reproducible tests and benchmarks.
    pub fn with_seed(config: PathOramConfig, seed: u64) -> Self {
        Self::with_rng(config, ChaCha20Rng::seed_from_u64(seed))
    }

    /// A new, empty ORAM drawing leaves from `rng`.
    pub fn with_rng(config: PathOramConfig, rng: ChaCha20Rng) -> Self {
        let bucket = config.bucket_bytes();
        let trees =
            config.trees.iter().map(|&l| Tree::new(l, config.cache_levels, bucket)).collect();
        let top = vec![0u32; config.in_memory_entries() as usize];
        Self {
            config,
            trees,
            top,
            rng,
            cur: None,
            stats: PathOramStats::default(),
            loading: None,
            dirty_top: Vec::new(),
            top_all_dirty: false,
        }
    }

    /// Continues from exported trusted state, with a fresh generator.
    pub fn from_state(state: PathOramState, rng: ChaCha20Rng) -> Result<Self> {
        let mut oram = Self::with_rng(state.config, rng);
        let corrupt = |m: &str| Err(OramError::Corrupt(format!("imported state: {m}")));
        if state.top.len() != oram.top.len()
            || state.stashes.len() != oram.trees.len()
            || state.caches.len() != oram.trees.len()
        {
            return corrupt("sizes do not match the configuration");
        }
        oram.top = state.top;
        for ((tree, stash), cache) in oram.trees.iter_mut().zip(state.stashes).zip(state.caches) {
            if cache.len() != tree.cache.len() {
                return corrupt("cache size does not match the configuration");
            }
            tree.cache = cache;
            for (id, leaf, data) in stash {
                tree.stash.insert(id, Entry { leaf, data });
            }
        }
        oram.stats = state.stats;
        Ok(oram)
    }

    /// Exports the trusted state. Only between accesses.
    pub fn export_state(&self) -> Result<PathOramState> {
        if self.cur.is_some() {
            return Err(OramError::Protocol(
                "cannot export state in the middle of an access".into(),
            ));
        }
        if self.loading.is_some() {
            return Err(OramError::Protocol("cannot export state during a bulk load".into()));
        }
        let mut stashes = Vec::new();
        for t in &self.trees {
            let mut s: Vec<_> =
                t.stash.iter().map(|(&id, e)| (id, e.leaf, e.data.clone())).collect();
            s.sort_unstable_by_key(|e| e.0);
            stashes.push(s);
        }
        Ok(PathOramState {
            config: self.config.clone(),
            top: self.top.clone(),
            stashes,
            caches: self.trees.iter().map(|t| t.cache.clone()).collect(),
            stats: self.stats.clone(),
        })
    }

    /// Takes what changed in the trusted state since the previous call (between accesses).
    ///
    /// A durable driver logs this with the cells it writes, so that replaying the log over an
    /// older [`PathOramState`] with [`PathOram::apply_delta`] rebuilds the current state.
    pub fn take_delta(&mut self) -> Result<OramDelta> {
        if self.cur.is_some() || self.loading.is_some() {
            return Err(OramError::Protocol(
                "cannot take a delta in the middle of an access".into(),
            ));
        }
        let mut top: Vec<(u32, u32)> = if self.top_all_dirty {
            self.top.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect()
        } else {
            let mut idx = std::mem::take(&mut self.dirty_top);
            idx.sort_unstable();
            idx.dedup();
            idx.into_iter().map(|i| (i, self.top[i as usize])).collect()
        };
        top.shrink_to_fit();
        self.dirty_top.clear();
        self.top_all_dirty = false;
        let stashes = self
            .trees
            .iter()
            .map(|t| {
                let mut s: Vec<_> =
                    t.stash.iter().map(|(&id, e)| (id, e.leaf, e.data.clone())).collect();
                s.sort_unstable_by_key(|e| e.0);
                s
            })
            .collect();
        let caches = if self.config.cache_levels > 0 {
            self.trees
                .iter_mut()
                .map(|t| {
                    let mut idx = std::mem::take(&mut t.cache_dirty);
                    idx.sort_unstable();
                    idx.dedup();
                    idx.into_iter().map(|i| (i, t.cache[i as usize].clone())).collect()
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(OramDelta { top, stashes, caches, accesses: self.stats.accesses })
    }

    /// Applies a delta taken by [`PathOram::take_delta`] on an instance whose state was the
    /// same as the one the delta was taken from (replaying a redo log after a restart).
    pub fn apply_delta(&mut self, delta: OramDelta) -> Result<()> {
        let corrupt = |m: &str| Err(OramError::Corrupt(format!("redo record: {m}")));
        if delta.stashes.len() != self.trees.len()
            || (!delta.caches.is_empty() && delta.caches.len() != self.trees.len())
        {
            return corrupt("tree count does not match the configuration");
        }
        for &(i, v) in &delta.top {
            let Some(slot) = self.top.get_mut(i as usize) else {
                return corrupt("position-map index out of range");
            };
            *slot = v;
        }
        for (tree, stash) in self.trees.iter_mut().zip(delta.stashes) {
            tree.stash.clear();
            for (id, leaf, data) in stash {
                tree.stash.insert(id, Entry { leaf, data });
            }
        }
        for (tree, changes) in self.trees.iter_mut().zip(delta.caches) {
            for (i, bucket) in changes {
                match tree.cache.get_mut(i as usize) {
                    Some(slot) if slot.len() == bucket.len() => *slot = bucket,
                    _ => return corrupt("cached bucket does not match the configuration"),
                }
            }
        }
        self.stats.accesses = delta.accesses;
        Ok(())
    }

    /// The parameters.
    pub fn config(&self) -> &PathOramConfig {
        &self.config
    }

    /// Statistics so far.
    pub fn stats(&self) -> &PathOramStats {
        &self.stats
    }

    /// Blocks in each tree's stash right now.
    pub fn stash_sizes(&self) -> Vec<usize> {
        self.trees.iter().map(|t| t.stash.len()).collect()
    }

    /// Bytes of trusted memory held now: position map, stashes and cached buckets.
    pub fn trusted_bytes(&self) -> u64 {
        let entry = (self.config.block_size as usize + 48) as u64; // data + map overhead
        let stash: u64 = self.trees.iter().map(|t| t.stash.len() as u64 * entry).sum();
        let cache: u64 =
            self.trees.iter().map(|t| (t.cache.len() * self.config.bucket_bytes()) as u64).sum();
        self.top.len() as u64 * 4 + stash + cache
    }

    /// The first tree whose stash exceeds the bound, as an error.
    pub fn check_stash(&self) -> Result<()> {
        for (i, t) in self.trees.iter().enumerate() {
            if t.stash.len() > self.config.stash_limit {
                return Err(OramError::StashOverflow {
                    tree: i,
                    size: t.stash.len(),
                    limit: self.config.stash_limit,
                });
            }
        }
        Ok(())
    }

    /// Whether an access is in progress.
    pub fn in_progress(&self) -> bool {
        self.cur.is_some()
    }

    /// Abandons an access or a bulk load in progress. The trusted state may then disagree with
    /// the store; use only before discarding this instance.
    pub fn abort(&mut self) {
        self.cur = None;
        self.loading = None;
    }

    /// Draws the leaves of the following accesses from a generator seeded with `seed`. The
    /// scheme is deterministic given its state, the seed and the accesses (eviction breaks
    /// ties by block id), so repeating the same accesses after the same seed from the same
    /// state repeats the same reads: a driver can log a seed before revealing any leaf drawn
    /// from it and replay the accesses after a crash.
    pub fn reseed(&mut self, seed: [u8; 32]) {
        self.rng = ChaCha20Rng::from_seed(seed);
    }

    fn random_leaf(&mut self, tree: usize) -> Leaf {
        Leaf(self.rng.gen_range(0..self.trees[tree].layout.shape.leaves()))
    }

    /// The cells that the next access of `block` will ask for first, when the position map is
    /// held wholly in memory (a single tree); `None` with a recursive map, whose path depends
    /// on reads not made yet. A block that never had a leaf gets its (uniformly random) leaf
    /// now rather than at its access, which changes nothing in distribution.
    ///
    /// A driver may fetch the upcoming paths of several *distinct* blocks in one request and
    /// then run their accesses one after another: an access remaps only its own block, so the
    /// later blocks' paths stay as announced. (For the same block twice the second path would
    /// not be the announced one.)
    pub fn upcoming_path(&mut self, block: BlockId) -> Result<Option<Vec<CellId>>> {
        if self.cur.is_some() || self.loading.is_some() {
            return Err(OramError::Protocol("cannot look ahead in the middle of an access".into()));
        }
        if block.0 >= self.config.blocks {
            return Err(OramError::BlockOutOfRange { block: block.0, blocks: self.config.blocks });
        }
        if self.trees.len() != 1 {
            return Ok(None);
        }
        let slot = block.0 as usize;
        let leaf = match self.top[slot] {
            0 => {
                let leaf = self.random_leaf(0);
                self.top[slot] = leaf.0 as u32 + 1;
                self.dirty_top.push(slot as u32);
                leaf
            }
            v => Leaf(u64::from(v - 1)),
        };
        Ok(Some(self.trees[0].path_cells(leaf)))
    }

    /// Begins an access and returns the cells to read first.
    pub fn start(&mut self, block: BlockId, op: Op) -> Result<Vec<CellId>> {
        if self.cur.is_some() {
            return Err(OramError::Protocol("an access is already in progress".into()));
        }
        if self.loading.is_some() {
            return Err(OramError::Protocol("a bulk load is in progress".into()));
        }
        if block.0 >= self.config.blocks {
            return Err(OramError::BlockOutOfRange { block: block.0, blocks: self.config.blocks });
        }
        if let Op::Write(d) = &op {
            if d.len() != self.config.block_size as usize {
                return Err(OramError::WrongBlockSize {
                    got: d.len(),
                    expected: self.config.block_size,
                });
            }
        }
        let per_block = self.config.entries_per_block();
        let mut ids = Vec::with_capacity(self.trees.len());
        ids.push(block.0);
        for i in 1..self.trees.len() {
            ids.push(ids[i - 1] / per_block);
        }
        let top_tree = self.trees.len() - 1;
        let slot = ids[top_tree] as usize;
        let leaf = match self.top[slot] {
            0 => self.random_leaf(top_tree),
            v => Leaf(u64::from(v - 1)),
        };
        let new_leaf = self.random_leaf(top_tree);
        self.top[slot] = new_leaf.0 as u32 + 1;
        self.dirty_top.push(slot as u32);
        let read = self.trees[top_tree].path_cells(leaf);
        self.cur = Some(Cursor {
            op: Some(op),
            sweep: false,
            ids,
            tree: top_tree,
            leaf,
            new_leaf,
            expect: read.len(),
        });
        Ok(read)
    }

    /// Paths a sweep covers: every leaf of every tree (data tree first, then the position-map
    /// trees). Every stored cell lies on at least one of them.
    pub fn sweep_paths(&self) -> u64 {
        self.trees.iter().map(|t| t.layout.shape.leaves()).sum()
    }

    /// Begins the `index`-th path of a sweep (`index < sweep_paths()`): the path to leaf
    /// `index` of the data tree, then those of the position-map trees in order. It is read into
    /// the stash and written back (evicting what fits, as any access does), with no block
    /// remapped; [`PathOram::feed`] then returns [`Progress::Done`] with empty data.
    ///
    /// A sweep rewrites every stored cell once, in an order fixed in advance, e.g. to re-seal
    /// them all under a new key. Which path it reads depends only on `index`, so the store
    /// learns nothing from it but that a sweep is running; the leaves of ordinary accesses
    /// stay fresh and uniform, as no block's leaf is read or changed.
    pub fn start_sweep(&mut self, index: u64) -> Result<Vec<CellId>> {
        if self.cur.is_some() {
            return Err(OramError::Protocol("an access is already in progress".into()));
        }
        if self.loading.is_some() {
            return Err(OramError::Protocol("a bulk load is in progress".into()));
        }
        let mut rest = index;
        for (k, t) in self.trees.iter().enumerate() {
            let leaves = t.layout.shape.leaves();
            if rest < leaves {
                let leaf = Leaf(rest);
                let read = t.path_cells(leaf);
                self.cur = Some(Cursor {
                    op: None,
                    sweep: true,
                    ids: Vec::new(),
                    tree: k,
                    leaf,
                    new_leaf: leaf,
                    expect: read.len(),
                });
                return Ok(read);
            }
            rest -= leaves;
        }
        Err(OramError::Protocol(format!(
            "sweep path {index} out of range (a sweep has {} paths)",
            self.sweep_paths()
        )))
    }

    /// Feeds the plaintext of the cells last asked for, in order (`None` for a cell that was
    /// never written), and returns what to do next.
    pub fn feed(&mut self, fetched: Vec<Option<Vec<u8>>>) -> Result<Progress> {
        let mut cur = self
            .cur
            .take()
            .ok_or_else(|| OramError::Protocol("feed called with no access in progress".into()))?;
        if fetched.len() != cur.expect {
            let e = OramError::Protocol(format!(
                "fed {} cells, expected {}",
                fetched.len(),
                cur.expect
            ));
            self.cur = Some(cur);
            return Err(e);
        }
        let k = cur.tree;
        self.absorb(k, cur.leaf, fetched)?;
        if cur.sweep {
            let writes = self.evict(k, cur.leaf);
            let t = &mut self.trees[k];
            t.max_stash = t.max_stash.max(t.stash.len());
            return Ok(Progress::Done { writes, data: Vec::new() });
        }

        let id = cur.ids[k];
        let new_leaf = cur.new_leaf.0 as u32;
        let block_size = self.config.block_size as usize;
        let mut next = None;
        let mut result = None;
        if k > 0 {
            // A position-map block: read and replace the entry of the block one tree down.
            let off = (cur.ids[k - 1] % self.config.entries_per_block()) as usize * 4;
            let old = {
                let e = self.trees[k]
                    .stash
                    .entry(id)
                    .or_insert_with(|| Entry { leaf: new_leaf, data: vec![0u8; block_size] });
                e.leaf = new_leaf;
                u32::from_le_bytes(e.data[off..off + 4].try_into().expect("4 bytes"))
            };
            let leaf = match old {
                0 => self.random_leaf(k - 1),
                v => Leaf(u64::from(v - 1)),
            };
            let fresh = self.random_leaf(k - 1);
            let e = self.trees[k].stash.get_mut(&id).expect("just inserted");
            e.data[off..off + 4].copy_from_slice(&(fresh.0 as u32 + 1).to_le_bytes());
            next = Some((leaf, fresh));
        } else {
            let stash = &mut self.trees[0].stash;
            match cur.op.take().expect("op present until the data tree") {
                Op::Read => {
                    result = Some(match stash.get_mut(&id) {
                        Some(e) => {
                            e.leaf = new_leaf;
                            e.data.clone()
                        }
                        None => vec![0u8; block_size],
                    });
                }
                Op::Write(data) => {
                    let old = stash.insert(id, Entry { leaf: new_leaf, data });
                    result = Some(old.map(|e| e.data).unwrap_or_else(|| vec![0u8; block_size]));
                }
            }
        }

        let writes = self.evict(k, cur.leaf);
        let stash_now = self.trees[k].stash.len();
        let t = &mut self.trees[k];
        t.max_stash = t.max_stash.max(stash_now);

        match next {
            Some((leaf, fresh)) => {
                cur.tree = k - 1;
                cur.leaf = leaf;
                cur.new_leaf = fresh;
                let read = self.trees[k - 1].path_cells(leaf);
                cur.expect = read.len();
                self.cur = Some(cur);
                Ok(Progress::Continue { writes, read })
            }
            None => {
                self.stats.accesses += 1;
                self.stats.max_stash = self.stats.max_stash.max(stash_now);
                self.stats.stash_sum += stash_now as u64;
                if self.stats.stash_histogram.len() <= stash_now {
                    self.stats.stash_histogram.resize(stash_now + 1, 0);
                }
                self.stats.stash_histogram[stash_now] += 1;
                Ok(Progress::Done { writes, data: result.expect("data tree sets the result") })
            }
        }
    }

    /// Moves every block of the path to `leaf` into the stash.
    fn absorb(&mut self, k: usize, leaf: Leaf, fetched: Vec<Option<Vec<u8>>>) -> Result<()> {
        let slot = SLOT_HEADER + self.config.block_size as usize;
        let z = self.config.z as usize;
        let bucket_bytes = self.config.bucket_bytes();
        let tree = &mut self.trees[k];
        let shape = tree.layout.shape;
        let mut buckets: Vec<Vec<u8>> = Vec::with_capacity(shape.levels() as usize);
        for l in 0..tree.cache_levels {
            let b = shape.bucket_on_path(leaf, l).0 as usize;
            buckets.push(std::mem::take(&mut tree.cache[b]));
        }
        buckets.extend(fetched.into_iter().flatten());
        for bucket in buckets {
            if bucket.len() != bucket_bytes {
                return Err(OramError::Corrupt(format!(
                    "bucket of {} bytes, expected {bucket_bytes}",
                    bucket.len()
                )));
            }
            for s in 0..z {
                let raw = &bucket[s * slot..(s + 1) * slot];
                let id1 = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
                if id1 == 0 {
                    continue;
                }
                let id = id1 - 1;
                let bl = u32::from_le_bytes(raw[8..12].try_into().expect("4 bytes"));
                if id >= tree.layout.blocks || u64::from(bl) >= shape.leaves() {
                    return Err(OramError::Corrupt(format!("slot names block {id} at leaf {bl}")));
                }
                let entry = Entry { leaf: bl, data: raw[SLOT_HEADER..].to_vec() };
                if tree.stash.insert(id, entry).is_some() {
                    return Err(OramError::Corrupt(format!("block {id} found twice in tree {k}")));
                }
            }
        }
        Ok(())
    }

    /// Writes the path to `leaf` back, greedily from the leaf up. Returns the cells to store
    /// (root first); cached levels go to trusted memory instead.
    fn evict(&mut self, k: usize, leaf: Leaf) -> Vec<(CellId, Vec<u8>)> {
        let z = self.config.z as usize;
        let slot = SLOT_HEADER + self.config.block_size as usize;
        let bucket_bytes = self.config.bucket_bytes();
        let tree = &mut self.trees[k];
        let shape = tree.layout.shape;
        let levels = shape.levels() as usize;

        let mut by_depth: Vec<Vec<u64>> = vec![Vec::new(); levels];
        for (&id, e) in &tree.stash {
            let d = shape.common_depth(leaf, Leaf(u64::from(e.leaf)));
            by_depth[d as usize].push(id);
        }
        // Sort each level so that placement does not depend on hash order.
        for v in &mut by_depth {
            v.sort_unstable();
        }
        let mut pool: Vec<u64> = Vec::new();
        let mut writes = Vec::with_capacity(levels);
        for level in (0..levels).rev() {
            pool.append(&mut by_depth[level]);
            let mut bucket = vec![0u8; bucket_bytes];
            for s in 0..z {
                let Some(id) = pool.pop() else { break };
                let e = tree.stash.remove(&id).expect("pooled blocks are in the stash");
                let raw = &mut bucket[s * slot..(s + 1) * slot];
                raw[..8].copy_from_slice(&(id + 1).to_le_bytes());
                raw[8..12].copy_from_slice(&e.leaf.to_le_bytes());
                raw[SLOT_HEADER..].copy_from_slice(&e.data);
            }
            let b: BucketId = shape.bucket_on_path(leaf, level as u32);
            if (level as u32) < tree.cache_levels {
                tree.cache[b.0 as usize] = bucket;
                tree.cache_dirty.push(b.0 as u32);
            } else {
                writes.push((CellId(tree.layout.base + b.0), bucket));
            }
        }
        writes.reverse();
        writes
    }
}

/// Source of unique identifiers tying a [`BulkLoad`] to the [`PathOram`] that started it.
static NEXT_LOAD: AtomicU64 = AtomicU64::new(1);

/// A bulk load of a fresh [`PathOram`] in progress: start it with [`PathOram::bulk_load`] and
/// drive it with [`PathOram::bulk_load_step`] until that returns `None`.
///
/// It owns everything the load needs between steps — the leaf of every block of the tree being
/// loaded (and of the tree below it), the blocks sorted by leaf, and the blocks carried up the
/// tree that did not fit deeper — about 12 bytes per block. It can be kept for as long as the
/// driver likes between steps, but belongs to the ORAM that started it.
pub struct BulkLoad {
    /// Identifier shared with the ORAM that started the load.
    id: u64,
    /// Tree being loaded: 0 is the data tree, then the position-map trees; equal to the number
    /// of trees once everything is loaded.
    tree: usize,
    /// Leaf of every block of the tree being loaded.
    leaves: Vec<u32>,
    /// Leaf of every block of the tree below; a position-map tree's blocks hold these entries.
    below: Vec<u32>,
    /// Block ids of the tree being loaded, sorted by leaf (then id).
    order: Vec<u64>,
    /// Blocks in `order` before this index are placed already (or carried up the tree).
    cursor: usize,
    /// Next bucket of the tree to fill, in post-order; `None` once the tree is complete.
    next: Option<u64>,
    /// Blocks left over by a completed left child at each level, waiting for its sibling.
    pending: Vec<Vec<u64>>,
    /// Blocks left over by the bucket filled last.
    carry: Vec<u64>,
    /// Cells handed to the driver so far.
    cells_done: u64,
    /// Cells the whole load hands to the driver.
    total_cells: u64,
    /// An error interrupted the load; it cannot continue.
    failed: bool,
}

impl std::fmt::Debug for BulkLoad {
    // Leaves are secrets: print only the progress, which is public.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BulkLoad")
            .field("tree", &self.tree)
            .field("cells_done", &self.cells_done)
            .field("total_cells", &self.total_cells)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl BulkLoad {
    /// The leaf the load gave data block `id`, while the data tree is being loaded (from
    /// [`PathOram::bulk_load`] until its last bucket is handed out); `None` after that or for
    /// an id beyond the tree. [`PathOram::bulk_load_step`] asks for the blocks' contents in the
    /// order of these leaves (a block carried up the tree a little later), so a driver that
    /// cannot hold every block in memory can have them ready in that order.
    pub fn data_leaf(&self, id: u64) -> Option<u32> {
        if self.tree != 0 {
            return None;
        }
        self.leaves.get(usize::try_from(id).ok()?).copied()
    }

    /// Cells handed out so far.
    pub fn cells_done(&self) -> u64 {
        self.cells_done
    }

    /// Cells the whole load hands out: every bucket of every tree except the cached ones.
    pub fn total_cells(&self) -> u64 {
        self.total_cells
    }

    /// Whether every cell has been handed out and the trusted state is complete.
    pub fn is_finished(&self) -> bool {
        self.next.is_none() && !self.failed
    }
}

/// The bucket after `b` in a post-order walk of `shape` (left subtree, right subtree, node).
fn post_order_next(shape: TreeShape, b: u64) -> Option<u64> {
    if b == 0 {
        return None;
    }
    if b & 1 == 0 {
        // A right child: its parent comes next.
        return Some((b - 1) / 2);
    }
    // A left child: next is the leftmost leaf below its right sibling.
    let mut s = b + 1;
    for _ in shape.level_of(BucketId(s))..shape.height() {
        s = 2 * s + 1;
    }
    Some(s)
}

impl PathOram {
    /// Starts a bulk load of this ORAM; see the module docs and [`PathOram::bulk_load_step`].
    ///
    /// Only a fresh ORAM can be bulk loaded: one that has never completed or begun an access,
    /// whose stashes and cached buckets are empty and whose position map is unassigned.
    /// Anything else is refused with [`OramError::Protocol`]. Until the load finishes, accesses
    /// and [`PathOram::export_state`] are refused.
    ///
    /// # Security
    ///
    /// The leaves are drawn here from this ORAM's generator, as the accesses would draw them.
    /// What the store sees is the list of cells [`PathOram::bulk_load_step`] returns, which
    /// depends on the public parameters only.
    pub fn bulk_load(&mut self) -> Result<BulkLoad> {
        if self.cur.is_some() {
            return Err(OramError::Protocol("cannot bulk load during an access".into()));
        }
        if self.loading.is_some() {
            return Err(OramError::Protocol("a bulk load is already in progress".into()));
        }
        let fresh = self.stats.accesses == 0
            && self.top.iter().all(|&e| e == 0)
            && self
                .trees
                .iter()
                .all(|t| t.stash.is_empty() && t.cache.iter().all(|b| b.iter().all(|&x| x == 0)));
        if !fresh {
            return Err(OramError::Protocol(
                "only a fresh ORAM (no access ever made) can be bulk loaded".into(),
            ));
        }
        let total_cells =
            self.trees.iter().map(|t| t.layout.shape.buckets() - t.cache.len() as u64).sum();
        let id = NEXT_LOAD.fetch_add(1, Ordering::Relaxed);
        let mut load = BulkLoad {
            id,
            tree: 0,
            leaves: Vec::new(),
            below: Vec::new(),
            order: Vec::new(),
            cursor: 0,
            next: None,
            pending: Vec::new(),
            carry: Vec::new(),
            cells_done: 0,
            total_cells,
            failed: false,
        };
        self.bulk_start_tree(&mut load);
        self.loading = Some(id);
        self.top_all_dirty = true;
        Ok(load)
    }

    /// Continues a bulk load: returns the next batch of at most `max_cells` (at least one)
    /// plaintext cells for the driver to write, or `None` once the load is complete and this
    /// ORAM is ready for accesses. Batches may be written in any order, but all of them must be
    /// written before the first access.
    ///
    /// `data` gives the initial contents of each data block and is called once per block, in
    /// an order that depends on the leaves; every result must be exactly `block_size` bytes,
    /// or the load fails with [`OramError::WrongBlockSize`]. Any error ends the load for good:
    /// the instance must then be discarded (see [`PathOram::abort`]).
    ///
    /// Blocks that do not fit in the tree end up in the stash; as after an access,
    /// [`PathOram::check_stash`] reports whether that exceeds the bound.
    ///
    /// # Security
    ///
    /// Every stored bucket of every tree is returned exactly once, trees in order (data tree
    /// first), the buckets of each tree in post-order, cached levels left out (they go to trusted
    /// memory), cut into batches of exactly `max_cells` cells except the last. The sequence is a
    /// function of the configuration and of `max_cells` alone.
    // The plain type says exactly what a driver gets; an alias would only hide it.
    #[allow(clippy::type_complexity)]
    pub fn bulk_load_step(
        &mut self,
        load: &mut BulkLoad,
        data: &mut dyn FnMut(BlockId) -> Vec<u8>,
        max_cells: usize,
    ) -> Result<Option<Vec<(CellId, Vec<u8>)>>> {
        if load.failed {
            return Err(OramError::Protocol("this bulk load failed earlier".into()));
        }
        if load.tree == self.trees.len() {
            return Ok(None);
        }
        if self.loading != Some(load.id) {
            return Err(OramError::Protocol("this bulk load belongs to another ORAM".into()));
        }
        let max_cells = max_cells.max(1);
        let left = usize::try_from(load.total_cells - load.cells_done).unwrap_or(usize::MAX);
        let mut batch = Vec::with_capacity(max_cells.min(left));
        while batch.len() < max_cells && load.tree < self.trees.len() {
            match self.bulk_fill(load, data) {
                Ok(Some(cell)) => batch.push(cell),
                Ok(None) => {}
                Err(e) => {
                    load.failed = true;
                    return Err(e);
                }
            }
        }
        if load.tree == self.trees.len() {
            self.loading = None;
            if batch.is_empty() {
                return Ok(None);
            }
        }
        Ok(Some(batch))
    }

    /// Draws the leaves of tree `load.tree` and prepares the walk over its buckets.
    fn bulk_start_tree(&mut self, load: &mut BulkLoad) {
        let k = load.tree;
        let layout = self.trees[k].layout;
        let leaves: Vec<u32> = (0..layout.blocks).map(|_| self.random_leaf(k).0 as u32).collect();
        let mut order = std::mem::take(&mut load.order);
        order.clear();
        order.extend(0..layout.blocks);
        order.sort_unstable_by_key(|&id| (leaves[id as usize], id));
        load.leaves = leaves;
        load.order = order;
        load.cursor = 0;
        load.pending = vec![Vec::new(); layout.shape.levels() as usize];
        load.carry = Vec::new();
        // The walk starts at the leftmost leaf.
        load.next = Some(layout.shape.leaves() - 1);
    }

    /// Fills the next bucket of the walk. Returns it as a cell to write, or `None` if it is
    /// cached in trusted memory.
    fn bulk_fill(
        &mut self,
        load: &mut BulkLoad,
        data: &mut dyn FnMut(BlockId) -> Vec<u8>,
    ) -> Result<Option<(CellId, Vec<u8>)>> {
        let k = load.tree;
        let z = self.config.z as usize;
        let block_size = self.config.block_size as usize;
        let slot = SLOT_HEADER + block_size;
        let per_block = self.config.entries_per_block() as usize;
        let shape = self.trees[k].layout.shape;
        let b = load.next.expect("a tree being loaded has a next bucket");
        let level = shape.level_of(BucketId(b)) as usize;

        // The blocks that may go here: those of this leaf, or those left over by both children.
        let mut here = match shape.leaf_of(BucketId(b)) {
            Some(leaf) => {
                let start = load.cursor;
                while load.cursor < load.order.len()
                    && u64::from(load.leaves[load.order[load.cursor] as usize]) == leaf.0
                {
                    load.cursor += 1;
                }
                load.order[start..load.cursor].to_vec()
            }
            None => {
                let mut v = std::mem::take(&mut load.pending[level + 1]);
                v.append(&mut load.carry);
                v
            }
        };
        let rest = here.split_off(here.len().min(z));

        let contents = |load: &BulkLoad, data: &mut dyn FnMut(BlockId) -> Vec<u8>, id: u64| {
            if k == 0 {
                let d = data(BlockId(id));
                if d.len() != block_size {
                    return Err(OramError::WrongBlockSize {
                        got: d.len(),
                        expected: block_size as u32,
                    });
                }
                Ok(d)
            } else {
                // A position-map block: the entries (leaf + 1) of its blocks in the tree below.
                let mut d = vec![0u8; block_size];
                let first = id as usize * per_block;
                let last = (first + per_block).min(load.below.len());
                for (i, &leaf) in load.below[first..last].iter().enumerate() {
                    d[i * 4..i * 4 + 4].copy_from_slice(&(leaf + 1).to_le_bytes());
                }
                Ok(d)
            }
        };

        let bucket_bytes = self.config.bucket_bytes();
        let mut bucket = vec![0u8; bucket_bytes];
        for (s, &id) in here.iter().enumerate() {
            let d = contents(load, data, id)?;
            let raw = &mut bucket[s * slot..(s + 1) * slot];
            raw[..8].copy_from_slice(&(id + 1).to_le_bytes());
            raw[8..12].copy_from_slice(&load.leaves[id as usize].to_le_bytes());
            raw[SLOT_HEADER..].copy_from_slice(&d);
        }
        if b == 0 {
            // What does not fit in the root stays in the stash.
            for id in rest {
                let d = contents(load, data, id)?;
                let leaf = load.leaves[id as usize];
                self.trees[k].stash.insert(id, Entry { leaf, data: d });
            }
        } else if b & 1 == 1 {
            load.pending[level] = rest;
        } else {
            load.carry = rest;
        }

        load.next = post_order_next(shape, b);
        let tree = &mut self.trees[k];
        let out = if (level as u32) < tree.cache_levels {
            tree.cache[b as usize] = bucket;
            tree.cache_dirty.push(b as u32);
            None
        } else {
            load.cells_done += 1;
            Some((CellId(tree.layout.base + b), bucket))
        };
        if load.next.is_none() {
            self.bulk_finish_tree(load);
        }
        Ok(out)
    }

    /// Completes tree `load.tree` and moves on to the next one, or finishes the load.
    fn bulk_finish_tree(&mut self, load: &mut BulkLoad) {
        let k = load.tree;
        let stash = self.trees[k].stash.len();
        self.trees[k].max_stash = self.trees[k].max_stash.max(stash);
        if k == 0 {
            self.stats.max_stash = self.stats.max_stash.max(stash);
        }
        load.below = std::mem::take(&mut load.leaves);
        load.tree += 1;
        if load.tree < self.trees.len() {
            self.bulk_start_tree(load);
        } else {
            // The in-memory map receives the leaves of the last tree.
            for (entry, &leaf) in self.top.iter_mut().zip(&load.below) {
                *entry = leaf + 1;
            }
            load.below = Vec::new();
            load.order = Vec::new();
            load.pending = Vec::new();
            load.carry = Vec::new();
        }
    }
}
