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

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use blindfold_store::CellId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::{BlockId, BucketId, Leaf, OramError, Op, Progress, Result, TreeShape};

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
        self.trees.iter().map(|t| u64::from(t.shape.levels().saturating_sub(self.cache_levels))).sum()
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
    op: Option<Op>,
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
    pub stashes: Vec<Vec<(u64, u32, Vec<u8>)>>,
    /// Cached top-level buckets of each tree.
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
        Self { config, trees, top, rng, cur: None, stats: PathOramStats::default() }
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
            return Err(OramError::Protocol("cannot export state in the middle of an access".into()));
        }
        let mut stashes = Vec::new();
        for t in &self.trees {
            let mut s: Vec<_> = t.stash.iter().map(|(&id, e)| (id, e.leaf, e.data.clone())).collect();
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
        let cache: u64 = self.trees.iter().map(|t| (t.cache.len() * self.config.bucket_bytes()) as u64).sum();
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

    /// Abandons an access in progress. The trusted state may then disagree with the store;
    /// use only before discarding this instance.
    pub fn abort(&mut self) {
        self.cur = None;
    }

    fn random_leaf(&mut self, tree: usize) -> Leaf {
        Leaf(self.rng.gen_range(0..self.trees[tree].layout.shape.leaves()))
    }

    /// Begins an access and returns the cells to read first.
    pub fn start(&mut self, block: BlockId, op: Op) -> Result<Vec<CellId>> {
        if self.cur.is_some() {
            return Err(OramError::Protocol("an access is already in progress".into()));
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
        let read = self.trees[top_tree].path_cells(leaf);
        self.cur = Some(Cursor { op: Some(op), ids, tree: top_tree, leaf, new_leaf, expect: read.len() });
        Ok(read)
    }

    /// Feeds the plaintext of the cells last asked for, in order (`None` for a cell that was
    /// never written), and returns what to do next.
    pub fn feed(&mut self, fetched: Vec<Option<Vec<u8>>>) -> Result<Progress> {
        let mut cur = self
            .cur
            .take()
            .ok_or_else(|| OramError::Protocol("feed called with no access in progress".into()))?;
        if fetched.len() != cur.expect {
            let e = OramError::Protocol(format!("fed {} cells, expected {}", fetched.len(), cur.expect));
            self.cur = Some(cur);
            return Err(e);
        }
        let k = cur.tree;
        self.absorb(k, cur.leaf, fetched)?;

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
            } else {
                writes.push((CellId(tree.layout.base + b.0), bucket));
            }
        }
        writes.reverse();
        writes
    }
}
