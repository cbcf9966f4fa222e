//! ObliviStore (seed 001): a partition ORAM whose partitions are levelled hierarchical ORAMs,
//! as an I/O-free state machine. The driver (`blindfold_proxy::DurableObliviStore`) does the
//! store I/O, the sealing, the concurrency and the durability.
//!
//! # Organisation
//!
//! The `N` blocks are spread over `P ≈ √N` partitions. The trusted side keeps a position map
//! (block → partition and slot) and an eviction cache of blocks on their way back.
//!
//! A partition has `L` small levels and one top level. Small level `i` has `2^(i+1)` slots: at
//! most `2^i` real blocks, the rest dummies, in a uniformly random order. The top level holds up
//! to `capacity` real blocks plus `2^L` dummies, in one of two areas (the other one receives the
//! next rebuild, so a rebuild cut short by a crash never destroys the blocks it reads). Small
//! level `i` is filled exactly when bit `i` of the partition's eviction counter is set; the top
//! level is always filled. All of that is public.
//!
//! # Access
//!
//! An access to block `b` reads one slot of every filled level of one partition: `b`'s own slot
//! in the level holding it, a uniformly random unread dummy everywhere else. If `b` is in the
//! cache, on its way, never written, or already being accessed, the partition is uniformly
//! random and every slot is a dummy (a fake read). The block then goes to the cache, assigned to
//! a fresh uniformly random partition. Which partition a real read hits is therefore uniform and
//! independent of everything the store saw before.
//!
//! # Eviction and shuffling
//!
//! Every read of partition `p` is followed by one eviction into `p`, and on top of that the
//! driver evicts into uniformly random partitions at rate ν per access. An eviction into `p`
//! takes a cached block assigned to `p` (or a dummy if there is none, or `p` is full) and
//! increments `p`'s counter; the level `ℓ` of the counter's lowest clear bit is rebuilt from the
//! unread slots of levels `0..ℓ` plus the evicted block (when every small level is full, the top
//! level is rebuilt from everything, into its other area). Which slots a shuffle reads (every
//! unread slot of the levels it merges) and writes (the whole new level) follows from the
//! counter alone. Because each read is paired with an eviction into the same partition, a level
//! is never read more often between two rebuilds than it has dummies.

use std::collections::{BTreeSet, HashMap};

use blindfold_store::CellId;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::OramError;

/// What a dummy slot holds.
pub const DUMMY: u64 = u64::MAX;

type Result<T> = std::result::Result<T, OramError>;

/// The public parameters of an [`ObliviStoreOram`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObliviStoreConfig {
    blocks: u64,
    block_size: u32,
    partitions: u32,
    levels: u32,
    capacity: u32,
    evict_rate: f64,
    /// Blocks one eviction carries at most (1 for ObliviStore, `b` for CURIOUS).
    #[serde(default = "one")]
    batch: u32,
}

fn one() -> u32 {
    1
}

impl ObliviStoreConfig {
    /// `blocks` blocks of `block_size` bytes, with the defaults: `P = ⌈√N⌉` partitions, a top
    /// level for `n + 2√n + 4` real blocks (`n = ⌈N/P⌉`), `L` small levels with `2^L` the
    /// smallest power of two of at least half that, and ν = 0.5.
    pub fn new(blocks: u64, block_size: u32) -> Result<Self> {
        if blocks == 0 || block_size == 0 {
            return Err(OramError::InvalidConfig("an ObliviStore ORAM needs blocks".into()));
        }
        let partitions = ((blocks as f64).sqrt().ceil() as u64).clamp(1, 1 << 20) as u32;
        Self::with_partitions(blocks, block_size, partitions, 0.5)
    }

    /// CURIOUS over levelled partitions: `P = ⌈√N⌉` partitions; every access touches exactly
    /// one partition (its read, then one eviction into it carrying up to `b` cached blocks; no
    /// background evictions), `b` = 3 as in the thesis's runs.
    pub fn curious(blocks: u64, block_size: u32, b: u32) -> Result<Self> {
        if !(1..=64).contains(&b) {
            return Err(OramError::InvalidConfig(format!("CURIOUS's b = {b} is outside 1..=64")));
        }
        if blocks == 0 || block_size == 0 {
            return Err(OramError::InvalidConfig("a CURIOUS ORAM needs blocks".into()));
        }
        let partitions = ((blocks as f64).sqrt().ceil() as u64).clamp(1, 1 << 20) as u32;
        let mut c = Self::with_partitions(blocks, block_size, partitions, 0.0)?;
        c.batch = b;
        c.levels = (c.capacity as u64).div_ceil(2 * b as u64).next_power_of_two().trailing_zeros();
        c.total_cells().ok_or_else(|| OramError::InvalidConfig("too many cells".into()))?;
        Ok(c)
    }

    /// Blocks one eviction carries at most (1: ObliviStore; more: CURIOUS's `b`).
    pub fn batch(&self) -> u32 {
        self.batch
    }

    /// Whether this is CURIOUS's setting (batched evictions, none in the background).
    pub fn is_curious(&self) -> bool {
        self.batch > 1 || self.evict_rate == 0.0
    }

    /// As [`ObliviStoreConfig::new`] with `partitions` partitions and eviction rate `evict_rate`
    /// (background evictions per access, on top of the one that follows every read).
    pub fn with_partitions(
        blocks: u64,
        block_size: u32,
        partitions: u32,
        evict_rate: f64,
    ) -> Result<Self> {
        if blocks == 0 || block_size == 0 || partitions == 0 {
            return Err(OramError::InvalidConfig("an ObliviStore ORAM needs blocks".into()));
        }
        if !(0.0..=8.0).contains(&evict_rate) {
            return Err(OramError::InvalidConfig(format!(
                "eviction rate {evict_rate} is outside 0..=8"
            )));
        }
        let n = blocks.div_ceil(partitions as u64);
        let capacity = n + 2 * (n as f64).sqrt().ceil() as u64 + 4;
        if capacity > 1 << 24 {
            return Err(OramError::InvalidConfig(format!(
                "{capacity} blocks per partition is too many: use more partitions"
            )));
        }
        let levels = capacity.div_ceil(2).next_power_of_two().trailing_zeros();
        let config = Self {
            blocks,
            block_size,
            partitions,
            levels,
            capacity: capacity as u32,
            evict_rate,
            batch: 1,
        };
        config.total_cells().ok_or_else(|| OramError::InvalidConfig("too many cells".into()))?;
        Ok(config)
    }

    /// Logical blocks.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Bytes per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Partitions.
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// Small levels per partition (`L`).
    pub fn levels(&self) -> u32 {
        self.levels
    }

    /// Real blocks one partition holds at most.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Background evictions per access (ν).
    pub fn evict_rate(&self) -> f64 {
        self.evict_rate
    }

    /// Slots of level `level` (`levels()` is the top level).
    pub fn level_slots(&self, level: u32) -> u64 {
        if level < self.levels {
            (self.batch as u64 + 1) << level
        } else {
            self.capacity as u64 + (1u64 << self.levels)
        }
    }

    /// Cells per partition: the small levels and both areas of the top level.
    pub fn partition_cells(&self) -> u64 {
        self.small_cells() + 2 * self.level_slots(self.levels)
    }

    /// Cells of the small levels of one partition.
    fn small_cells(&self) -> u64 {
        (self.batch as u64 + 1) * ((1u64 << self.levels) - 1)
    }

    /// Cells in the store.
    pub fn total_cells(&self) -> Option<u64> {
        self.partition_cells().checked_mul(self.partitions as u64)
    }

    /// The cell of slot `slot` of `level` (area `area` for the top level) of `partition`.
    pub fn cell(&self, partition: u32, level: u32, area: u8, slot: u64) -> CellId {
        let base = partition as u64 * self.partition_cells();
        let within = if level < self.levels {
            (self.batch as u64 + 1) * ((1u64 << level) - 1) + slot
        } else {
            self.small_cells() + area as u64 * self.level_slots(self.levels) + slot
        };
        CellId(base + within)
    }
}

/// One level of a partition.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Level {
    /// The sealing serial of the level's cells (0: never built).
    serial: u64,
    /// What each slot holds ([`DUMMY`] or a block).
    holders: Vec<u64>,
    /// Slots read since the level was built.
    read: Vec<bool>,
    /// Unread dummy slots.
    dummies: Vec<u32>,
}

impl Level {
    fn build(serial: u64, holders: Vec<u64>) -> Self {
        let dummies = (0..holders.len() as u32).filter(|&i| holders[i as usize] == DUMMY).collect();
        Self { serial, read: vec![false; holders.len()], holders, dummies }
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Partition {
    /// Evictions into the partition, modulo `2^L`.
    counter: u64,
    small: Vec<Level>,
    top: Level,
    /// The area the top level is in.
    top_area: u8,
    /// Real blocks stored in the partition or on their way into it.
    reals: u32,
}

/// Where a block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Place {
    /// In a slot of a partition's level (`level == L` is the top level).
    Stored { partition: u32, level: u32, slot: u32 },
    /// In the eviction cache.
    Cached,
}

/// A block in the eviction cache.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Cached {
    /// Its contents; `None` while the read that brings it is in flight.
    data: Option<Vec<u8>>,
    /// The partition it goes back to.
    target: u32,
    /// Where its stored copy is, while that copy is still the one the log knows of.
    origin: Option<(u32, u32)>,
    /// Changed since the redo log last saw it.
    dirty: bool,
    /// Bumped whenever `data` changes.
    version: u64,
    /// Being written into its partition by a shuffle.
    evicting: bool,
}

/// One slot an access or a shuffle reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRead {
    /// The cell.
    pub cell: CellId,
    /// The serial its seal binds.
    pub serial: u64,
    /// What it holds ([`DUMMY`] or a block).
    pub holder: u64,
}

/// The read of one access: which partition, which slots.
#[derive(Clone, Debug)]
pub struct ReadPlan {
    /// The partition read.
    pub partition: u32,
    /// One slot per filled level.
    pub slots: Vec<SlotRead>,
    /// Which of `slots` holds the block (`None`: a fake read).
    pub real: Option<usize>,
}

/// A shuffle: an eviction into a partition, rebuilding one level.
#[derive(Clone, Debug)]
pub struct Shuffle {
    /// The partition.
    pub partition: u32,
    /// The level rebuilt (`L`: the top level).
    pub level: u32,
    /// The top level's area written (0 for small levels).
    pub area: u8,
    /// The serial the new cells are sealed under.
    pub serial: u64,
    /// Every unread slot of the levels merged, in order.
    pub reads: Vec<SlotRead>,
    /// Live blocks of the merged levels that do not go into the new level but to the
    /// eviction cache (a rebuild after a crash can find a partition over its capacity: the log
    /// does not know of reads that took blocks out of it). The driver hands their data to
    /// [`ObliviStoreOram::finish_shuffle`].
    pub spill: Vec<u64>,
    /// Which of `reads` hold a live block (the others are dummies, or stale copies of blocks
    /// that moved on while a shuffle carried them).
    pub live: Vec<bool>,
    /// The new level's cells and what each holds.
    pub writes: Vec<(CellId, u64)>,
    /// The blocks evicted and their data (none: a dummy eviction).
    pub evicted: Vec<(u64, Vec<u8>)>,
    evicted_versions: Vec<u64>,
    /// The counter after.
    counter: u64,
}

impl Partition {
    /// Whether level `l` holds cells now: small level `l` iff bit `l` of the counter is set,
    /// the top level (`l == levels`) always.
    fn filled(&self, l: u32, levels: u32) -> bool {
        l == levels || self.counter >> l & 1 == 1
    }

    /// Level `l` (`levels`: the top) and the area its cells are in.
    fn level(&self, l: u32, levels: u32) -> (&Level, u8) {
        if l < levels {
            (&self.small[l as usize], 0)
        } else {
            (&self.top, self.top_area)
        }
    }

    /// Level `l` (`levels`: the top), to change.
    fn level_mut(&mut self, l: u32, levels: u32) -> &mut Level {
        if l < levels {
            &mut self.small[l as usize]
        } else {
            &mut self.top
        }
    }
}

impl Shuffle {
    /// Whether a real block goes in (for counters; the store cannot tell).
    pub fn is_real(&self) -> bool {
        !self.evicted.is_empty()
    }
}

/// What the redo log keeps of a finished shuffle.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShuffleRecord {
    partition: u32,
    level: u32,
    area: u8,
    serial: u64,
    counter: u64,
    holders: Vec<u64>,
    /// The evicted blocks that left the cache.
    evicted: Vec<u64>,
    /// The slots of evicted blocks that changed on their way (their cached copies stay
    /// current).
    stale: Vec<u32>,
    /// Cached blocks whose stored copy this shuffle retired, with their data.
    rescued: Vec<(u64, u32, serde_bytes::ByteBuf)>,
}

impl ShuffleRecord {
    /// The partition.
    pub fn partition(&self) -> u32 {
        self.partition
    }
}

/// Counters of an [`ObliviStoreOram`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObliviStoreStats {
    /// Accesses planned.
    pub accesses: u64,
    /// Of which fake reads.
    pub fake_reads: u64,
    /// Shuffles finished.
    pub shuffles: u64,
    /// Of which carried a real block.
    pub real_evictions: u64,
    /// Slots read by accesses.
    pub slots_read: u64,
    /// Slots read and written by shuffles.
    pub shuffle_cells: u64,
}

/// The trusted state, for checkpoints.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ObliviStoreState {
    config: ObliviStoreConfig,
    partitions: Vec<Partition>,
    places: Vec<(u64, Place)>,
    cache: Vec<(u64, Cached)>,
    next_serial: u64,
}

/// The ObliviStore state machine; see the [module docs](self).
#[derive(Debug)]
pub struct ObliviStoreOram {
    config: ObliviStoreConfig,
    partitions: Vec<Partition>,
    places: HashMap<u64, Place>,
    cache: HashMap<u64, Cached>,
    /// Cached blocks by target partition.
    by_target: Vec<BTreeSet<u64>>,
    /// Accesses in progress per block.
    pins: HashMap<u64, u32>,
    next_serial: u64,
    rng: ChaCha20Rng,
    stats: ObliviStoreStats,
}

impl ObliviStoreOram {
    /// A new ORAM: every block reads as zeros, every partition's top level is all dummies
    /// (sealed under serial 1: see [`ObliviStoreOram::initial_cells`]).
    pub fn new(config: ObliviStoreConfig) -> Self {
        Self::with_rng(config, ChaCha20Rng::from_entropy())
    }

    /// As [`ObliviStoreOram::new`], with a seeded generator (tests).
    pub fn seeded(config: ObliviStoreConfig, seed: u64) -> Self {
        Self::with_rng(config, ChaCha20Rng::seed_from_u64(seed))
    }

    fn with_rng(config: ObliviStoreConfig, rng: ChaCha20Rng) -> Self {
        let top = config.level_slots(config.levels) as usize;
        let partitions = (0..config.partitions)
            .map(|_| Partition {
                counter: 0,
                small: vec![Level::default(); config.levels as usize],
                top: Level::build(1, vec![DUMMY; top]),
                top_area: 0,
                reals: 0,
            })
            .collect();
        let by_target = vec![BTreeSet::new(); config.partitions as usize];
        Self {
            config,
            partitions,
            places: HashMap::new(),
            cache: HashMap::new(),
            by_target,
            pins: HashMap::new(),
            next_serial: 2,
            rng,
            stats: ObliviStoreStats::default(),
        }
    }

    /// The cells a new store must hold: every top level's area 0, all dummies, serial 1.
    pub fn initial_cells(&self) -> impl Iterator<Item = SlotRead> + '_ {
        let top = self.config.level_slots(self.config.levels);
        (0..self.config.partitions).flat_map(move |p| {
            (0..top).map(move |s| SlotRead {
                cell: self.config.cell(p, self.config.levels, 0, s),
                serial: 1,
                holder: DUMMY,
            })
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ObliviStoreConfig {
        &self.config
    }

    /// Counters.
    pub fn stats(&self) -> ObliviStoreStats {
        self.stats
    }

    /// Blocks in the eviction cache.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// The next serial a shuffle will use.
    pub fn next_serial(&self) -> u64 {
        self.next_serial
    }

    /// Makes every later serial at least `floor` (after a restart: serials the last run may
    /// have used unlogged are never used again).
    pub fn skip_serials_to(&mut self, floor: u64) {
        self.next_serial = self.next_serial.max(floor);
    }

    /// Bytes of trusted state, roughly.
    pub fn trusted_bytes(&self) -> u64 {
        let slots: u64 = self
            .partitions
            .iter()
            .map(|p| {
                p.small.iter().map(|l| l.holders.len() as u64).sum::<u64>()
                    + p.top.holders.len() as u64
            })
            .sum();
        let cache: u64 =
            self.cache.values().map(|c| 64 + c.data.as_ref().map_or(0, |d| d.len() as u64)).sum();
        slots * 13 + self.places.len() as u64 * 40 + cache
    }

    fn check_block(&self, block: u64) -> Result<()> {
        if block >= self.config.blocks {
            return Err(OramError::BlockOutOfRange { block, blocks: self.config.blocks });
        }
        Ok(())
    }

    fn fresh_serial(&mut self) -> u64 {
        let s = self.next_serial;
        self.next_serial += 1;
        s
    }

    fn random_partition(&mut self) -> u32 {
        self.rng.gen_range(0..self.config.partitions)
    }

    fn set_target(&mut self, block: u64, target: u32) {
        if let Some(c) = self.cache.get_mut(&block) {
            self.by_target[c.target as usize].remove(&block);
            c.target = target;
            self.by_target[target as usize].insert(block);
        }
    }

    /// Puts `block` in the cache, bound for `target`.
    fn cache_block(
        &mut self,
        block: u64,
        data: Option<Vec<u8>>,
        target: u32,
        origin: Option<(u32, u32)>,
        dirty: bool,
    ) {
        let entry = Cached { data, target, origin, dirty, version: 0, evicting: false };
        if let Some(old) = self.cache.insert(block, entry) {
            self.by_target[old.target as usize].remove(&block);
        }
        self.by_target[target as usize].insert(block);
    }

    /// Starts an access to `block`: the partition to read (the caller locks it, then calls
    /// [`ObliviStoreOram::plan_read`]) and whether the read is real.
    pub fn begin(&mut self, block: u64) -> Result<(u32, bool)> {
        self.check_block(block)?;
        let pins = self.pins.entry(block).or_insert(0);
        *pins += 1;
        self.stats.accesses += 1;
        let first = *pins == 1;
        match self.places.get(&block) {
            Some(Place::Stored { partition, .. }) if first => Ok((*partition, true)),
            _ => {
                self.stats.fake_reads += 1;
                let p = self.random_partition();
                Ok((p, false))
            }
        }
    }

    /// The slots an access reads in `partition` (which the caller holds): one per filled
    /// level. For a real read the block moves to the cache (its data pending until
    /// [`ObliviStoreOram::fill`]) and gets a fresh partition.
    pub fn plan_read(&mut self, block: u64, partition: u32, real: bool) -> Result<ReadPlan> {
        let levels = self.config.levels;
        let mut at = None;
        if real {
            match self.places.get(&block) {
                Some(&Place::Stored { partition: p, level, slot }) if p == partition => {
                    at = Some((level, slot))
                }
                other => {
                    return Err(OramError::Corrupt(format!(
                        "block {block} was planned as stored in partition {partition}, but is \
                         {other:?}"
                    )))
                }
            }
        }
        let mut slots = Vec::with_capacity(levels as usize + 1);
        let mut real_index = None;
        let area = self.partitions[partition as usize].top_area;
        for level in 0..=levels {
            let rng = &mut self.rng;
            let part = &mut self.partitions[partition as usize];
            if !part.filled(level, levels) {
                continue;
            }
            let lvl = part.level_mut(level, levels);
            let slot = match at {
                Some((l, s)) if l == level => {
                    real_index = Some(slots.len());
                    s
                }
                _ => {
                    if lvl.dummies.is_empty() {
                        return Err(OramError::Corrupt(format!(
                            "level {level} of partition {partition} has no unread dummy left"
                        )));
                    }
                    let i = rng.gen_range(0..lvl.dummies.len());
                    lvl.dummies.swap_remove(i)
                }
            };
            if lvl.read[slot as usize] {
                return Err(OramError::Corrupt(format!(
                    "slot {slot} of level {level} of partition {partition} read twice"
                )));
            }
            lvl.read[slot as usize] = true;
            slots.push(SlotRead {
                cell: self.config.cell(
                    partition,
                    level,
                    if level == levels { area } else { 0 },
                    slot as u64,
                ),
                serial: lvl.serial,
                holder: lvl.holders[slot as usize],
            });
        }
        self.stats.slots_read += slots.len() as u64;
        if real {
            let (level, _) = at.expect("set for real reads");
            if real_index.is_none() {
                return Err(OramError::Corrupt(format!(
                    "block {block} is in level {level} of partition {partition}, which is empty"
                )));
            }
            self.partitions[partition as usize].reals -= 1;
            self.places.insert(block, Place::Cached);
            let target = self.random_partition();
            self.cache_block(block, None, target, Some((partition, level)), false);
        }
        Ok(ReadPlan { partition, slots, real: real_index })
    }

    /// The data of a real read arrived.
    pub fn fill(&mut self, block: u64, data: Vec<u8>) {
        if let Some(c) = self.cache.get_mut(&block) {
            c.data = Some(data);
        }
    }

    /// Whether `block`'s current data is known (cached and arrived, or never written).
    pub fn ready(&self, block: u64) -> bool {
        match self.places.get(&block) {
            None => true,
            Some(Place::Cached) => self.cache.get(&block).is_some_and(|c| c.data.is_some()),
            Some(Place::Stored { .. }) => false,
        }
    }

    /// Finishes an access once [`ObliviStoreOram::ready`]: applies `op` to the cached block and
    /// returns its contents before the operation. The block gets a fresh partition.
    pub fn finish(&mut self, block: u64, op: crate::Op) -> Result<Vec<u8>> {
        let bs = self.config.block_size as usize;
        if let crate::Op::Write(d) = &op {
            if d.len() != bs {
                return Err(OramError::WrongBlockSize { got: d.len(), expected: bs as u32 });
            }
        }
        let target = self.random_partition();
        let old = match self.places.get(&block) {
            None => {
                if let crate::Op::Write(_) = &op {
                    self.places.insert(block, Place::Cached);
                    self.cache_block(block, Some(vec![0; bs]), target, None, false);
                }
                vec![0; bs]
            }
            Some(Place::Cached) => {
                if !self.cache.get(&block).is_some_and(|c| c.evicting) {
                    self.set_target(block, target);
                }
                self.cache
                    .get(&block)
                    .and_then(|c| c.data.clone())
                    .ok_or_else(|| OramError::Corrupt(format!("block {block} finished unread")))?
            }
            Some(Place::Stored { .. }) => {
                return Err(OramError::Corrupt(format!("block {block} finished unread")))
            }
        };
        if let crate::Op::Write(d) = op {
            let c = self.cache.get_mut(&block).expect("inserted above");
            c.data = Some(d);
            c.dirty = true;
            c.version += 1;
        }
        self.unpin(block);
        Ok(old)
    }

    /// Ends an access that failed: the block is no longer pinned by it.
    pub fn unpin(&mut self, block: u64) {
        if let Some(n) = self.pins.get_mut(&block) {
            *n -= 1;
            if *n == 0 {
                self.pins.remove(&block);
            }
        }
    }

    /// Plans an eviction into `partition` (which the caller holds): a cached block assigned
    /// to it, if one is ready and the partition has room, else a dummy; and the shuffle that
    /// takes it in.
    pub fn plan_evict(&mut self, partition: u32) -> Shuffle {
        let room = self.config.capacity.saturating_sub(self.partitions[partition as usize].reals);
        let take = room.min(self.config.batch) as usize;
        let picks: Vec<u64> = self.by_target[partition as usize]
            .iter()
            .copied()
            .filter(|b| {
                !self.pins.contains_key(b)
                    && self.cache.get(b).is_some_and(|c| c.data.is_some() && !c.evicting)
            })
            .take(take)
            .collect();
        let evicted = picks
            .into_iter()
            .map(|b| {
                let c = self.cache.get_mut(&b).expect("indexed");
                c.evicting = true;
                (b, c.data.clone().expect("ready"), c.version)
            })
            .collect();
        self.plan_shuffle(partition, evicted, false)
    }

    /// Plans a rebuild of `partition`'s top level from everything it holds (after a restart:
    /// every slot the last run may have read is retired, unread by the new level).
    pub fn plan_rebuild(&mut self, partition: u32) -> Shuffle {
        self.plan_shuffle(partition, Vec::new(), true)
    }

    fn plan_shuffle(
        &mut self,
        partition: u32,
        evicted: Vec<(u64, Vec<u8>, u64)>,
        rebuild: bool,
    ) -> Shuffle {
        let levels = self.config.levels;
        let serial = self.fresh_serial();
        let part = &self.partitions[partition as usize];
        let level = if rebuild { levels } else { (part.counter.trailing_ones()).min(levels) };
        let counter = if level == levels { 0 } else { part.counter + 1 };
        let area = if level == levels { 1 - part.top_area } else { 0 };
        // Every unread slot of the merged levels; the live real blocks among them.
        let mut reads = Vec::new();
        let mut live_flags = Vec::new();
        let mut live = Vec::new();
        let merged: Vec<u32> =
            if level == levels { (0..=levels).collect() } else { (0..level).collect() };
        for &l in &merged {
            if !part.filled(l, levels) {
                continue;
            }
            let (lvl, a) = part.level(l, levels);
            for (s, &h) in lvl.holders.iter().enumerate() {
                if lvl.read[s] {
                    continue;
                }
                reads.push(SlotRead {
                    cell: self.config.cell(partition, l, a, s as u64),
                    serial: lvl.serial,
                    holder: h,
                });
                let is_live = h != DUMMY
                    && self.places.get(&h)
                        == Some(&Place::Stored { partition, level: l, slot: s as u32 });
                live_flags.push(is_live);
                if is_live {
                    live.push(h);
                }
            }
        }
        let cap = self.config.capacity as usize;
        let spill = if rebuild && live.len() > cap { live.split_off(cap) } else { Vec::new() };
        let mut holders = live;
        for (b, _, _) in &evicted {
            holders.push(*b);
            self.partitions[partition as usize].reals += 1;
        }
        let slots = self.config.level_slots(level) as usize;
        debug_assert!(holders.len() <= slots);
        holders.resize(slots, DUMMY);
        holders.shuffle(&mut self.rng);
        let writes = holders
            .iter()
            .enumerate()
            .map(|(s, &h)| (self.config.cell(partition, level, area, s as u64), h))
            .collect();
        self.stats.shuffle_cells += (reads.len() + slots) as u64;
        let evicted_versions = evicted.iter().map(|e| e.2).collect();
        let evicted = evicted.into_iter().map(|(b, d, _)| (b, d)).collect();
        Shuffle {
            partition,
            level,
            area,
            serial,
            reads,
            spill,
            live: live_flags,
            writes,
            evicted,
            evicted_versions,
            counter,
        }
    }

    /// The shuffle's cells are in the store: the new level replaces the merged ones. Returns
    /// what the redo log must keep (the caller appends it before the partition is used again).
    pub fn finish_shuffle(
        &mut self,
        shuffle: Shuffle,
        spilled: Vec<(u64, Vec<u8>)>,
    ) -> ShuffleRecord {
        let levels = self.config.levels;
        let p = shuffle.partition;
        // Spilled blocks go to the cache (and into the record, which carries their data).
        for (b, data) in spilled {
            if shuffle.spill.contains(&b) {
                let target = self.random_partition();
                self.places.insert(b, Place::Cached);
                self.partitions[p as usize].reals -= 1;
                self.cache_block(b, Some(data), target, Some((p, levels)), false);
            }
        }
        let retires = |origin: Option<(u32, u32)>| {
            origin.is_some_and(|(op, ol)| {
                op == p && (if shuffle.level == levels { true } else { ol < shuffle.level })
            })
        };
        // Cached blocks whose stored copy goes away, and with it the only copy the log knows
        // of: the record carries their data (written or not).
        let mut rescued = Vec::new();
        for (&b, c) in self.cache.iter_mut() {
            if retires(c.origin) {
                c.origin = None;
                if let Some(d) = &c.data {
                    c.dirty = false;
                    rescued.push((b, c.target, serde_bytes::ByteBuf::from(d.clone())));
                }
            }
        }
        rescued.sort_unstable_by_key(|r| r.0);
        let holders: Vec<u64> = shuffle.writes.iter().map(|&(_, h)| h).collect();
        let mut evicted = Vec::new();
        let mut stale = Vec::new();
        for ((b, _), &version) in shuffle.evicted.iter().zip(&shuffle.evicted_versions) {
            let unchanged = self.cache.get(b).is_some_and(|c| c.version == version);
            if unchanged && !self.pins.contains_key(b) {
                let c = self.cache.remove(b).expect("checked");
                self.by_target[c.target as usize].remove(b);
                evicted.push(*b);
            } else if let Some(c) = self.cache.get_mut(b) {
                // Accessed while on its way: the cached copy stays current, the slot is stale.
                c.evicting = false;
                stale.extend(holders.iter().position(|h| h == b).map(|s| s as u32));
                self.partitions[p as usize].reals -= 1;
            }
        }
        self.stats.shuffles += 1;
        self.stats.real_evictions += evicted.len() as u64;
        let record = ShuffleRecord {
            partition: p,
            level: shuffle.level,
            area: shuffle.area,
            serial: shuffle.serial,
            counter: shuffle.counter,
            holders,
            evicted,
            stale,
            rescued,
        };
        self.install(&record);
        record
    }

    /// Applies a finished shuffle to the levels and the position map.
    fn install(&mut self, r: &ShuffleRecord) {
        let levels = self.config.levels;
        let part = &mut self.partitions[r.partition as usize];
        if r.level == levels {
            for l in &mut part.small {
                l.clear();
            }
            part.top = Level::build(r.serial, r.holders.clone());
            part.top_area = r.area;
        } else {
            for l in &mut part.small[..r.level as usize] {
                l.clear();
            }
            part.small[r.level as usize] = Level::build(r.serial, r.holders.clone());
        }
        part.counter = r.counter;
        for (s, &h) in r.holders.iter().enumerate() {
            if h == DUMMY || r.stale.contains(&(s as u32)) {
                continue;
            }
            let placed = Place::Stored { partition: r.partition, level: r.level, slot: s as u32 };
            match self.places.get(&h) {
                // A block moved in (the evicted one), or one that stayed in the partition.
                Some(Place::Cached) if !r.evicted.contains(&h) => {}
                _ => {
                    self.places.insert(h, placed);
                }
            }
        }
        self.next_serial = self.next_serial.max(r.serial + 1);
    }

    /// Replays a logged shuffle (recovery): the levels, the positions, the blocks it rescued.
    pub fn replay_shuffle(&mut self, r: &ShuffleRecord) -> Result<()> {
        if r.partition >= self.config.partitions
            || r.level > self.config.levels
            || r.holders.len() as u64 != self.config.level_slots(r.level)
        {
            return Err(OramError::Corrupt("a logged shuffle does not fit the ORAM".into()));
        }
        let levels = self.config.levels;
        let p = r.partition;
        // Blocks the shuffle rescued are in the cache from now on.
        for (b, target, data) in &r.rescued {
            self.check_block(*b)?;
            self.put_cached(*b, *target, data.to_vec(), false)?;
        }
        let mut moved_from = Vec::new();
        for &b in &r.evicted {
            self.check_block(b)?;
            if let Some(c) = self.cache.remove(&b) {
                self.by_target[c.target as usize].remove(&b);
            }
            // The log may still place it where it was read from (reads are not logged).
            if let Some(Place::Stored { partition, .. }) = self.places.remove(&b) {
                moved_from.push(partition);
            }
        }
        self.install(r);
        // Blocks the log still placed in a retired level: their copy was rescued or moved on.
        let stale: Vec<u64> = self
            .places
            .iter()
            .filter(|(_, pl)| match **pl {
                Place::Stored { partition, level, .. } if partition == p => {
                    if r.level == levels {
                        level < levels
                    } else {
                        level < r.level
                    }
                }
                _ => false,
            })
            .map(|(&b, _)| b)
            .collect();
        if let Some(b) = stale.first() {
            return Err(OramError::Corrupt(format!(
                "the redo log loses block {b}: a logged shuffle retired its slot"
            )));
        }
        self.recount(p);
        for q in moved_from {
            self.recount(q);
        }
        Ok(())
    }

    fn recount(&mut self, p: u32) {
        let n = self
            .places
            .values()
            .filter(|pl| matches!(pl, Place::Stored { partition, .. } if *partition == p))
            .count();
        self.partitions[p as usize].reals = n as u32;
    }

    fn put_cached(&mut self, block: u64, target: u32, data: Vec<u8>, dirty: bool) -> Result<()> {
        if target >= self.config.partitions || data.len() != self.config.block_size as usize {
            return Err(OramError::Corrupt("a logged block does not fit the ORAM".into()));
        }
        if let Some(Place::Stored { partition, .. }) = self.places.get(&block).copied() {
            self.places.insert(block, Place::Cached);
            self.recount(partition);
        }
        self.places.insert(block, Place::Cached);
        self.cache_block(block, Some(data), target, None, dirty);
        Ok(())
    }

    /// Blocks written since the log last saw them: `(block, target, data)`; they count as
    /// logged from now on.
    pub fn take_dirty(&mut self) -> Vec<(u64, u32, Vec<u8>)> {
        let mut out = Vec::new();
        for (&b, c) in self.cache.iter_mut() {
            if c.dirty {
                if let Some(d) = &c.data {
                    c.dirty = false;
                    // Once logged, the block no longer depends on a stored copy.
                    c.origin = None;
                    out.push((b, c.target, d.clone()));
                }
            }
        }
        out.sort_unstable_by_key(|r| r.0);
        out
    }

    /// Replays logged writes (recovery).
    pub fn replay_writes(&mut self, blocks: &[(u64, u32, Vec<u8>)]) -> Result<()> {
        for (b, t, d) in blocks {
            self.check_block(*b)?;
            self.put_cached(*b, *t, d.clone(), false)?;
        }
        Ok(())
    }

    /// Where every stored block lives: `(block, cell)`. Trusted information, for
    /// diagnostics and tests.
    pub fn blocks_stored(&self) -> Vec<(u64, CellId)> {
        let levels = self.config.levels;
        let mut v: Vec<_> = self
            .places
            .iter()
            .filter_map(|(&b, pl)| match *pl {
                Place::Stored { partition, level, slot } => {
                    let (_, area) = self.partitions[partition as usize].level(level, levels);
                    Some((b, self.config.cell(partition, level, area, slot as u64)))
                }
                Place::Cached => None,
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// Blocks in the cache not yet evicted, for tests: `(block, target)`.
    pub fn cache_targets(&self) -> Vec<(u64, u32)> {
        let mut v: Vec<_> = self.cache.iter().map(|(&b, c)| (b, c.target)).collect();
        v.sort_unstable();
        v
    }

    /// The cells of every filled level, with what each holds (verification).
    pub fn filled_cells(&self) -> Vec<SlotRead> {
        let levels = self.config.levels;
        let mut out = Vec::new();
        for (p, part) in self.partitions.iter().enumerate() {
            for l in 0..=levels {
                if !part.filled(l, levels) {
                    continue;
                }
                let (lvl, a) = part.level(l, levels);
                for (s, &h) in lvl.holders.iter().enumerate() {
                    out.push(SlotRead {
                        cell: self.config.cell(p as u32, l, a, s as u64),
                        serial: lvl.serial,
                        holder: h,
                    });
                }
            }
        }
        out
    }

    /// Checks the internal invariants (tests): positions match slots, counts match, every
    /// filled level has enough dummies left for the reads it may still see.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let levels = self.config.levels;
        for (&b, pl) in &self.places {
            match *pl {
                Place::Cached => {
                    if !self.cache.contains_key(&b) {
                        return Err(format!("block {b} placed in the cache but not there"));
                    }
                }
                Place::Stored { partition, level, slot } => {
                    let part = &self.partitions[partition as usize];
                    let (lvl, _) = part.level(level, levels);
                    if lvl.holders.get(slot as usize) != Some(&b) || lvl.read[slot as usize] {
                        return Err(format!("block {b} is not in its slot"));
                    }
                    if !part.filled(level, levels) {
                        return Err(format!("block {b} is in an empty level"));
                    }
                }
            }
        }
        for (p, part) in self.partitions.iter().enumerate() {
            let stored = self
                .places
                .values()
                .filter(
                    |pl| matches!(pl, Place::Stored { partition, .. } if *partition as usize == p),
                )
                .count();
            let evicting =
                self.cache.values().filter(|c| c.evicting && c.target as usize == p).count();
            if part.reals as usize != stored + evicting {
                return Err(format!(
                    "partition {p} counts {} reals, holds {}",
                    part.reals,
                    stored + evicting
                ));
            }
            if part.reals > self.config.capacity {
                return Err(format!("partition {p} is over capacity"));
            }
            let left = (1u64 << levels) - part.counter;
            if (part.top.dummies.len() as u64) < left {
                return Err(format!("the top level of partition {p} is short of dummies"));
            }
            for l in 0..levels {
                if part.filled(l, levels) {
                    let lvl = &part.small[l as usize];
                    // The level lives until the counter carries past it: at most this many
                    // more reads.
                    let left = (1u64 << l) - (part.counter & ((1 << l) - 1));
                    if (lvl.dummies.len() as u64) < left {
                        return Err(format!(
                            "level {l} of partition {p} has {} dummies for {left} reads",
                            lvl.dummies.len()
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The state for a checkpoint. Only when no access or shuffle is in flight.
    pub fn state(&self) -> Result<ObliviStoreState> {
        if !self.pins.is_empty() || self.cache.values().any(|c| c.evicting || c.data.is_none()) {
            return Err(OramError::Corrupt("a checkpoint needs a quiet ORAM".into()));
        }
        let mut places: Vec<_> = self.places.iter().map(|(&b, &p)| (b, p)).collect();
        places.sort_unstable_by_key(|x| x.0);
        let mut cache: Vec<_> = self
            .cache
            .iter()
            .map(|(&b, c)| (b, Cached { dirty: false, origin: None, ..c.clone() }))
            .collect();
        cache.sort_unstable_by_key(|x| x.0);
        Ok(ObliviStoreState {
            config: self.config.clone(),
            partitions: self.partitions.clone(),
            places,
            cache,
            next_serial: self.next_serial,
        })
    }

    /// Restores a checkpoint, checking it fits together.
    pub fn from_state(s: ObliviStoreState) -> Result<Self> {
        let mut o = Self::new(s.config.clone());
        let c = &s.config;
        let ok = s.partitions.len() == c.partitions as usize
            && s.partitions.iter().all(|p| {
                p.small.len() == c.levels as usize
                    && p.top.holders.len() as u64 == c.level_slots(c.levels)
                    && p.top.read.len() == p.top.holders.len()
                    && p.top_area < 2
                    && p.small.iter().enumerate().all(|(i, l)| {
                        l.read.len() == l.holders.len()
                            && (l.holders.is_empty()
                                || l.holders.len() as u64 == c.level_slots(i as u32))
                    })
            });
        if !ok {
            return Err(OramError::Corrupt("the checkpoint does not fit its configuration".into()));
        }
        o.partitions = s.partitions;
        o.places = s.places.into_iter().collect();
        for (b, cached) in s.cache {
            if cached.target >= c.partitions {
                return Err(OramError::Corrupt("a cached block has no partition".into()));
            }
            o.by_target[cached.target as usize].insert(b);
            o.cache.insert(b, cached);
        }
        o.next_serial = s.next_serial;
        o.check_invariants().map_err(OramError::Corrupt)?;
        Ok(o)
    }
}
