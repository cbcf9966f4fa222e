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
//! cache (or on its way), the partition is the one it is bound for and every slot is a dummy (a
//! fake read); if it was never written or is already being accessed, a uniformly random one.
//! The block then goes to the cache, assigned to a fresh uniformly random partition. Which
//! partition an access hits is therefore the one its block's last access drew, uniform and
//! independent of everything the store saw since, whether an eviction has taken it there yet
//! or not.
//!
//! # Eviction and shuffling
//!
//! Every read of partition `p` is followed by one eviction into `p`, and on top of that the
//! driver evicts into uniformly random partitions at rate ν per access. An eviction into `p`
//! takes a cached block assigned to `p` (or a dummy if there is none, or `p` is full) and
//! increments `p`'s counter; the level `ℓ` of the counter's lowest clear bit is rebuilt from the
//! unread slots of levels `0..ℓ` plus the evicted block (when every small level is full, the top
//! level is rebuilt from everything, into its other area). From each level it merges, a shuffle
//! reads as many unread slots as that level can hold real blocks (`2^i`, or the capacity for the
//! top level): every live block's slot and uniformly random other unread slots, in slot order.
//! Since an access reads a block's own slot or a uniformly random unread dummy, the live slots
//! are uniformly placed among the unread ones in the store's eyes, so the slots read are a
//! uniformly random subset of a public size. How many slots a shuffle reads and which cells it
//! writes (the whole new level) follow from the counter alone. Because each read is paired
//! with an eviction into the same partition, a level is never read more often between two
//! rebuilds than it has dummies.
//!
//! # Reads while a partition shuffles
//!
//! A partition has at most one shuffle between its planning and its landing, but accesses keep
//! reading it meanwhile (the paper's asynchronous shuffling and early cache-ins). Such a read
//! skips the levels the shuffle merges (their unread cells are the shuffle's to read, and the
//! level it writes is empty until it lands): it reads one slot of every other filled level.
//! A block that lives in a merged level is taken from the shuffle's reads instead (every live
//! block is among them); the driver hands those over with
//! [`ObliviStoreOram::shuffle_fetched`], and an access planned before they arrived answers only
//! after they have ([`ReadPlan::after`]), whatever its block. Its eviction waits for the
//! shuffle to land. So reads may run ahead of their evictions; an access reads a partition
//! only while every level it would read has been read fewer times since it was built than it
//! has dummies at the least ([`ObliviStoreOram::readable`]), a rule on public counts alone.

use std::collections::{BTreeSet, HashMap};

use blindfold_store::CellId;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::OramError;

/// What a dummy slot holds.
pub const DUMMY: u64 = u64::MAX;

/// ObliviStore's background evictions per access (ν), on top of the one that follows every
/// read. Each access puts one block in the eviction cache and `1 + ν` evictions take one out
/// when the cache holds a block for their partition, so the smaller ν, the fuller the cache
/// must be for evictions to keep up (about `5P` blocks at 0.05 in the model test), while every
/// eviction, real or dummy, costs a shuffle. Measured at 2^16 × 4 KiB in the steady state
/// (`bench oblivistore`, 0 ms, 40 s): bandwidth 28.2× at ν = 0.5, 23.7× at 0.2, 22.0× at 0.1
/// and 21.2× at 0.05, the trusted state growing from 3.1 % to about 6 % of the data.
pub const DEFAULT_EVICT_RATE: f64 = 0.05;

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
    /// What each partition is.
    #[serde(default)]
    sub: SubOram,
}

/// The sub-ORAM each partition is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SubOram {
    /// ObliviStore's levelled hierarchical partition (the default).
    #[default]
    Levelled,
    /// A Path ORAM tree (CURIOUS's tree sub-ORAM): `2^height` leaves, buckets of `z` slots,
    /// every bucket in two copies (a write-back goes to the copy not in use).
    Path {
        /// Slots per bucket.
        z: u32,
        /// Height of the tree (the root is depth 0).
        height: u32,
    },
}

fn one() -> u32 {
    1
}

impl ObliviStoreConfig {
    /// `blocks` blocks of `block_size` bytes, with the defaults: `P = ⌈√N⌉` partitions, a top
    /// level for `n + 2√n + 4` real blocks (`n = ⌈N/P⌉`), `L` small levels with `2^L` the
    /// smallest power of two of at least half that, and ν = [`DEFAULT_EVICT_RATE`].
    pub fn new(blocks: u64, block_size: u32) -> Result<Self> {
        if blocks == 0 || block_size == 0 {
            return Err(OramError::InvalidConfig("an ObliviStore ORAM needs blocks".into()));
        }
        let partitions = ((blocks as f64).sqrt().ceil() as u64).clamp(1, 1 << 20) as u32;
        Self::with_partitions(blocks, block_size, partitions, DEFAULT_EVICT_RATE)
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

    /// CURIOUS over Path ORAM partitions: `P = ⌈√N⌉` partitions (up to twice as many, when
    /// that makes every tree a level lower), each a Path ORAM tree with buckets of `z` slots
    /// and about `capacity / z` leaves (so about twice as many slots as the partition may hold
    /// blocks). Every access reads one whole path of one partition and writes the same path
    /// back (to the buckets' other copies) with the blocks it read that still fit there and up
    /// to `b` more cached blocks bound for the partition.
    pub fn curious_path(blocks: u64, block_size: u32, b: u32, z: u32) -> Result<Self> {
        if !(1..=64).contains(&z) {
            return Err(OramError::InvalidConfig(format!("CURIOUS's z = {z} is outside 1..=64")));
        }
        let mut c = Self::curious(blocks, block_size, b)?;
        // A path costs a bucket per level, so a tree one level lower is worth more partitions:
        // with half the leaves, as many partitions as it takes for each one's capacity to fit
        // the leaves' slots, if that is at most twice as many.
        let half = (c.capacity as u64).div_ceil(z as u64).next_power_of_two() / 2;
        let fits = |n: u64| Self::capacity_for(n) <= half * z as u64;
        if let Some(n) = (1..=blocks).take_while(|&n| fits(n)).last() {
            let more = blocks.div_ceil(n);
            if more <= 2 * c.partitions as u64 {
                c.partitions = more as u32;
                c.capacity = Self::capacity_for(blocks.div_ceil(more)) as u32;
            }
        }
        c.levels = 0;
        let leaves = (c.capacity as u64).div_ceil(z as u64).next_power_of_two();
        c.sub = SubOram::Path { z, height: leaves.trailing_zeros() };
        c.total_cells().ok_or_else(|| OramError::InvalidConfig("too many cells".into()))?;
        Ok(c)
    }

    /// What each partition is.
    pub fn sub_oram(&self) -> SubOram {
        self.sub
    }

    /// `(z, height)` of a Path ORAM partition (`None`: levelled partitions).
    pub fn path_shape(&self) -> Option<(u32, u32)> {
        match self.sub {
            SubOram::Path { z, height } => Some((z, height)),
            SubOram::Levelled => None,
        }
    }

    /// Buckets of one Path ORAM partition.
    fn path_buckets(z_height: (u32, u32)) -> u64 {
        (2u64 << z_height.1) - 1
    }

    /// The cell of slot `i` of copy `copy` of `bucket` of Path ORAM partition `partition`.
    pub fn path_cell(&self, partition: u32, bucket: u64, copy: u8, i: u32) -> CellId {
        let (z, _) = self.path_shape().expect("a Path ORAM partition");
        CellId(
            partition as u64 * self.partition_cells()
                + (bucket * 2 + copy as u64) * z as u64
                + i as u64,
        )
    }

    /// Cells the largest shuffle reads or writes: a top level, or a whole Path ORAM tree.
    pub fn largest_shuffle(&self) -> u64 {
        match self.path_shape() {
            Some(zh) => Self::path_buckets(zh) * zh.0 as u64,
            None => {
                self.level_slots(self.levels).max(self.level_slots(self.levels.saturating_sub(1)))
            }
        }
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
        let capacity = Self::capacity_for(blocks.div_ceil(partitions as u64));
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
            sub: SubOram::Levelled,
        };
        config.total_cells().ok_or_else(|| OramError::InvalidConfig("too many cells".into()))?;
        Ok(config)
    }

    /// The real blocks a partition of `n = ⌈N/P⌉` blocks may hold: `n + 2⌈√n⌉ + 4`, room for
    /// the uneven spread of uniformly random evictions.
    fn capacity_for(n: u64) -> u64 {
        n + 2 * (n as f64).sqrt().ceil() as u64 + 4
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

    /// Real blocks level `level` (`levels()`: the top level) can hold at most: `b·2^level`
    /// for a small level (`b` blocks per eviction), the partition's capacity for the top.
    /// A shuffle reads this many unread slots of each level it merges (the live ones and
    /// uniformly random others), never the rest.
    pub fn level_reals(&self, level: u32) -> u64 {
        if level < self.levels {
            (self.batch as u64) << level
        } else {
            self.capacity as u64
        }
    }

    /// Cells per partition: the small levels and both areas of the top level (or both
    /// copies of every bucket of a Path ORAM tree).
    pub fn partition_cells(&self) -> u64 {
        match self.path_shape() {
            Some(zh) => 2 * Self::path_buckets(zh) * zh.0 as u64,
            None => self.small_cells() + 2 * self.level_slots(self.levels),
        }
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
    /// The tree of a Path ORAM partition (`None`: levelled).
    #[serde(default)]
    tree: Option<PathTree>,
    /// A levelled partition's shuffle between its planning and its landing (never in a
    /// checkpoint: those are taken when nothing is in flight).
    #[serde(skip)]
    busy: Option<Busy>,
}

/// The shuffle of a levelled partition that is planned and has not landed.
#[derive(Clone, Debug)]
struct Busy {
    /// Its serial.
    serial: u64,
    /// The levels it merges (bit `l`; bit `levels` for the top): accesses do not read them.
    merged: u64,
    /// Once its reads have arrived, the data of the live blocks among them.
    arrived: Option<HashMap<u64, Vec<u8>>>,
    /// Blocks accesses took from the merged levels before the reads arrived.
    waiting: Vec<u64>,
}

/// A Path ORAM partition's buckets.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct PathTree {
    /// Which copy of each bucket is current.
    copy: Vec<u8>,
    /// The sealing serial of each bucket's current copy.
    serial: Vec<u64>,
    /// What each slot of the current copies holds (`bucket * z + i`).
    holders: Vec<u64>,
    /// The leaf of the partition's last read, whose write-back is due.
    due: Option<u32>,
}

impl PathTree {
    /// Slot `slot` (`bucket * z + i`) of partition `p` as it is now: its current cell, serial
    /// and holder.
    fn slot_read(&self, config: &ObliviStoreConfig, p: u32, slot: u64) -> SlotRead {
        let z = u64::from(config.path_shape().expect("a Path ORAM partition").0);
        let bucket = slot / z;
        SlotRead {
            cell: config.path_cell(p, bucket, self.copy[bucket as usize], (slot % z) as u32),
            serial: self.serial[bucket as usize],
            holder: self.holders[slot as usize],
        }
    }

    /// The cell in the other copy of `bucket` for its `i`-th slot: where a write-back or a
    /// rebuild writes it.
    fn next_cell(&self, config: &ObliviStoreConfig, p: u32, bucket: u64, i: u32) -> CellId {
        config.path_cell(p, bucket, 1 - self.copy[bucket as usize], i)
    }
}

/// The bucket at `depth` on the path to `leaf` of a tree of `height` (heap order).
fn bucket_on_path(leaf: u32, depth: u32, height: u32) -> u64 {
    ((leaf as u64 + (1u64 << height)) >> (height - depth)) - 1
}

/// The depth of a bucket (heap order).
fn depth_of(bucket: u64) -> u32 {
    63 - (bucket + 1).leading_zeros()
}

/// How deep the paths to two leaves share buckets.
fn common_depth(a: u32, b: u32, height: u32) -> u32 {
    height - (32 - (a ^ b).leading_zeros())
}

/// Where a block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Place {
    /// In a slot of a partition's level (`level == L` is the top level).
    Stored { partition: u32, level: u32, slot: u32 },
    /// In the eviction cache.
    Cached,
    /// In slot `slot` (`bucket * z + i`) of a Path ORAM partition, on the path to `leaf`.
    InTree { partition: u32, slot: u32, leaf: u32 },
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
    /// Its leaf in the target partition (Path ORAM partitions; drawn when it is targeted).
    #[serde(default)]
    leaf: u32,
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
    /// Other slots whose blocks go to the eviction cache (a Path ORAM partition's read takes
    /// every block of the path): the driver hands their data to [`ObliviStoreOram::fill`].
    pub keep: Vec<usize>,
    /// The serial of the partition's shuffle whose reads had not arrived when this read was
    /// planned: the access answers only after they have (a block the shuffle carries arrives
    /// with them; every other access waits alike, so the wait shows nothing).
    pub after: Option<u64>,
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
    /// The slots read from the levels merged, in order: from each,
    /// [`ObliviStoreConfig::level_reals`] of its unread slots (every live one, the others
    /// uniformly random), or every unread slot for a rebuild.
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
    /// Path ORAM partitions: the buckets rewritten (each to its other copy), `z` writes each.
    pub buckets: Vec<u64>,
    /// Path ORAM partitions: the leaf of each write's holder (0 for dummies).
    leaves: Vec<u32>,
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
    /// Path ORAM partitions: the buckets rewritten, and the leaf of every holder.
    #[serde(default)]
    buckets: Vec<u64>,
    #[serde(default)]
    leaves: Vec<u32>,
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
    /// Accesses planned while their partition's shuffle was in flight (they read around it).
    pub reads_during_shuffles: u64,
    /// Of which real reads whose block that shuffle carried.
    pub carried: u64,
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
    /// Recovery: stored blocks whose partition a read may have shown the store (a logged
    /// reveal no later record moved them out of), with that partition; the rebuild sends them
    /// to fresh partitions.
    revealed: HashMap<u64, u32>,
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
            .map(|_| match config.path_shape() {
                Some(zh) => {
                    let buckets = ObliviStoreConfig::path_buckets(zh) as usize;
                    Partition {
                        counter: 0,
                        small: Vec::new(),
                        top: Level::default(),
                        top_area: 0,
                        reals: 0,
                        tree: Some(PathTree {
                            copy: vec![0; buckets],
                            serial: vec![1; buckets],
                            holders: vec![DUMMY; buckets * zh.0 as usize],
                            due: None,
                        }),
                        busy: None,
                    }
                }
                None => Partition {
                    counter: 0,
                    small: vec![Level::default(); config.levels as usize],
                    top: Level::build(1, vec![DUMMY; top]),
                    top_area: 0,
                    reals: 0,
                    tree: None,
                    busy: None,
                },
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
            revealed: Default::default(),
            next_serial: 2,
            rng,
            stats: ObliviStoreStats::default(),
        }
    }

    /// The cells a new store must hold: every top level's area 0 (or copy 0 of every
    /// bucket), all dummies, serial 1.
    pub fn initial_cells(&self) -> impl Iterator<Item = SlotRead> + '_ {
        let c = &self.config;
        let (per, tree) = match c.path_shape() {
            Some(zh) => (ObliviStoreConfig::path_buckets(zh) * zh.0 as u64, Some(zh.0 as u64)),
            None => (c.level_slots(c.levels), None),
        };
        (0..c.partitions).flat_map(move |p| {
            (0..per).map(move |s| SlotRead {
                cell: match tree {
                    Some(z) => c.path_cell(p, s / z, 0, (s % z) as u32),
                    None => c.cell(p, c.levels, 0, s),
                },
                serial: 1,
                holder: DUMMY,
            })
        })
    }

    /// A fresh ORAM of `config` that already holds `blocks` (a rebuild for `recover` or a
    /// growth): each block goes to a uniformly random partition, into its top level (levelled
    /// partitions, slots shuffled) or, under a uniformly random leaf, into the deepest bucket
    /// of its path with room (Path ORAM partitions). Every level or bucket is built under
    /// `serial`; later shuffles use serials above it.
    ///
    /// Returns the ORAM, every cell to write with what it holds — the cells of
    /// [`ObliviStoreOram::initial_cells`], in that order, whatever `blocks` is — and the blocks
    /// that found no room (rare: a partition over its capacity, a full path), which the caller
    /// hands to [`ObliviStoreOram::load_cached`] with their data.
    pub fn bulk_loaded(
        config: ObliviStoreConfig,
        blocks: impl IntoIterator<Item = u64>,
        serial: u64,
    ) -> Result<(Self, Vec<SlotRead>, Vec<u64>)> {
        Self::bulk_loaded_with(config, blocks, serial, ChaCha20Rng::from_entropy())
    }

    /// [`ObliviStoreOram::bulk_loaded`] with a seeded generator (tests).
    pub fn bulk_loaded_seeded(
        config: ObliviStoreConfig,
        blocks: impl IntoIterator<Item = u64>,
        serial: u64,
        seed: u64,
    ) -> Result<(Self, Vec<SlotRead>, Vec<u64>)> {
        Self::bulk_loaded_with(config, blocks, serial, ChaCha20Rng::seed_from_u64(seed))
    }

    fn bulk_loaded_with(
        config: ObliviStoreConfig,
        blocks: impl IntoIterator<Item = u64>,
        serial: u64,
        rng: ChaCha20Rng,
    ) -> Result<(Self, Vec<SlotRead>, Vec<u64>)> {
        if serial < 2 || serial == u64::MAX {
            return Err(OramError::InvalidConfig(format!("serial {serial} for a bulk load")));
        }
        let mut o = Self::with_rng(config, rng);
        let c = o.config.clone();
        let mut each: Vec<Vec<u64>> = vec![Vec::new(); c.partitions as usize];
        for b in blocks {
            o.check_block(b)?;
            if o.places.insert(b, Place::Cached).is_some() {
                return Err(OramError::Corrupt(format!("block {b} loaded twice")));
            }
            let p = o.random_partition();
            each[p as usize].push(b);
        }
        let mut left = Vec::new();
        let mut cells = Vec::new();
        for (p, mut mine) in each.into_iter().enumerate() {
            if mine.len() > c.capacity as usize {
                left.extend(mine.split_off(c.capacity as usize));
            }
            let pu = p as u32;
            match c.path_shape() {
                Some((z, height)) => {
                    let buckets = ObliviStoreConfig::path_buckets((z, height));
                    let mut holders = vec![DUMMY; (buckets * z as u64) as usize];
                    let mut used = vec![0u32; buckets as usize];
                    let mut placed = 0u32;
                    for b in mine {
                        let leaf = o.random_leaf();
                        let spot = (0..=height)
                            .rev()
                            .map(|d| bucket_on_path(leaf, d, height))
                            .find(|&bk| used[bk as usize] < z);
                        let Some(bk) = spot else {
                            left.push(b);
                            continue;
                        };
                        let slot = (bk * z as u64) as u32 + used[bk as usize];
                        used[bk as usize] += 1;
                        holders[slot as usize] = b;
                        o.places.insert(b, Place::InTree { partition: pu, slot, leaf });
                        placed += 1;
                    }
                    let part = &mut o.partitions[p];
                    part.reals = placed;
                    let tree = part.tree.as_mut().expect("a Path ORAM partition");
                    tree.serial = vec![serial; buckets as usize];
                    for (k, &h) in holders.iter().enumerate() {
                        let (bucket, i) = (k as u64 / z as u64, (k as u64 % z as u64) as u32);
                        cells.push(SlotRead {
                            cell: c.path_cell(pu, bucket, 0, i),
                            serial,
                            holder: h,
                        });
                    }
                    tree.holders = holders;
                }
                None => {
                    let mut holders = mine;
                    let reals = holders.len() as u32;
                    holders.resize(c.level_slots(c.levels) as usize, DUMMY);
                    holders.shuffle(&mut o.rng);
                    for (s, &h) in holders.iter().enumerate() {
                        cells.push(SlotRead {
                            cell: c.cell(pu, c.levels, 0, s as u64),
                            serial,
                            holder: h,
                        });
                        if h != DUMMY {
                            let at =
                                Place::Stored { partition: pu, level: c.levels, slot: s as u32 };
                            o.places.insert(h, at);
                        }
                    }
                    let part = &mut o.partitions[p];
                    part.reals = reals;
                    part.top = Level::build(serial, holders);
                }
            }
        }
        o.next_serial = serial + 1;
        Ok((o, cells, left))
    }

    /// Puts `block` (with `data`) in the eviction cache, bound for a uniformly random
    /// partition: a block [`ObliviStoreOram::bulk_loaded`] found no room for.
    pub fn load_cached(&mut self, block: u64, data: Vec<u8>) -> Result<()> {
        self.check_block(block)?;
        let target = self.random_partition();
        self.put_cached(block, target, data, false)
    }

    /// The blocks in the eviction cache with their data (those whose read is done).
    pub fn cached_blocks(&self) -> Vec<(u64, &[u8])> {
        let mut v: Vec<_> =
            self.cache.iter().filter_map(|(&b, c)| Some((b, c.data.as_deref()?))).collect();
        v.sort_unstable_by_key(|x| x.0);
        v
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

    /// Binds every cached block for a fresh uniformly random partition (and leaf). After an
    /// unclean stop: an access cut off by the crash may have made its fake read in the
    /// partition its block was bound for, and the block's next access must not go there again.
    pub fn retarget_cached(&mut self) {
        let blocks: Vec<u64> = self.cache.keys().copied().collect();
        for b in blocks {
            let target = self.random_partition();
            self.set_target(b, target);
        }
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
                    + p.tree.as_ref().map_or(0, |t| t.holders.len() as u64)
            })
            .sum();
        let cache: u64 =
            self.cache.values().map(|c| 64 + c.data.as_ref().map_or(0, |d| d.len() as u64)).sum();
        // Shuffles in flight whose reads arrived keep their live blocks' data.
        let carried: u64 = self
            .partitions
            .iter()
            .filter_map(|p| p.busy.as_ref()?.arrived.as_ref())
            .flat_map(|got| got.values())
            .map(|d| 48 + d.len() as u64)
            .sum();
        slots * 13 + self.places.len() as u64 * 40 + cache + carried
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

    /// A uniformly random leaf of a Path ORAM partition (0 for levelled ones).
    fn random_leaf(&mut self) -> u32 {
        match self.config.path_shape() {
            Some((_, h)) => self.rng.gen_range(0..1u32 << h),
            None => 0,
        }
    }

    fn set_target(&mut self, block: u64, target: u32) {
        let leaf = self.random_leaf();
        if let Some(c) = self.cache.get_mut(&block) {
            self.by_target[c.target as usize].remove(&block);
            c.target = target;
            c.leaf = leaf;
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
        let leaf = self.random_leaf();
        let entry = Cached { data, target, origin, dirty, version: 0, evicting: false, leaf };
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
            Some(Place::Stored { partition, .. } | Place::InTree { partition, .. }) if first => {
                Ok((*partition, true))
            }
            // A cached block is read (fakely) where it is bound, as if an eviction had taken it
            // there already: a read elsewhere would make a block accessed again soon more
            // likely to be read where a recent eviction went (it is there only if one took it).
            Some(Place::Cached) if first => {
                self.stats.fake_reads += 1;
                Ok((self.cache.get(&block).map_or(0, |c| c.target), false))
            }
            _ => {
                self.stats.fake_reads += 1;
                let p = self.random_partition();
                Ok((p, false))
            }
        }
    }

    /// Whether an access may read `partition` now. A Path ORAM partition: always (the caller
    /// holds it). A levelled one: while every filled level the read would take a slot of (all
    /// but those the partition's shuffle in flight merges) has been read fewer times since it
    /// was built than it has dummies at the least, `level_slots − level_reals`. Reads may run
    /// ahead of the evictions that refresh the levels (those wait for the shuffle in flight),
    /// and this keeps them within the dummies. Every count it looks at is public: which levels
    /// are filled or merged, and how many of a level's cells were read since it was written.
    pub fn readable(&self, partition: u32) -> bool {
        if self.config.path_shape().is_some() {
            return true;
        }
        let levels = self.config.levels;
        let part = &self.partitions[partition as usize];
        let merged = part.busy.as_ref().map_or(0, |b| b.merged);
        (0..=levels).all(|l| {
            if !part.filled(l, levels) || merged >> l & 1 == 1 {
                return true;
            }
            let (lvl, _) = part.level(l, levels);
            let read = lvl.read.iter().filter(|r| **r).count() as u64;
            read < self.config.level_slots(l) - self.config.level_reals(l)
        })
    }

    /// The slots an access reads in `partition`: one per filled level (a Path ORAM partition,
    /// which the caller holds: [`ObliviStoreOram::plan_read_path`]). A levelled partition may
    /// have a shuffle in flight (see [`ObliviStoreOram::readable`], which must hold): the
    /// levels it merges are skipped, and a block in one of them comes with the shuffle's reads.
    /// For a real read the block moves to the cache (its data pending until
    /// [`ObliviStoreOram::fill`] or [`ObliviStoreOram::shuffle_fetched`]) and gets a fresh
    /// partition.
    pub fn plan_read(&mut self, block: u64, partition: u32, real: bool) -> Result<ReadPlan> {
        if self.config.path_shape().is_some() {
            return self.plan_read_path(block, partition, real);
        }
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
        let (merged, after) = match &self.partitions[partition as usize].busy {
            Some(b) => {
                self.stats.reads_during_shuffles += 1;
                (b.merged, b.arrived.is_none().then_some(b.serial))
            }
            None => (0, None),
        };
        // The block is in a level the shuffle in flight merges: it comes with that shuffle.
        let carried = at.is_some_and(|(l, _)| merged >> l & 1 == 1);
        self.stats.carried += u64::from(carried);
        let mut slots = Vec::with_capacity(levels as usize + 1);
        let mut real_index = None;
        let area = self.partitions[partition as usize].top_area;
        for level in 0..=levels {
            let rng = &mut self.rng;
            let part = &mut self.partitions[partition as usize];
            if !part.filled(level, levels) || merged >> level & 1 == 1 {
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
            if real_index.is_none() && !carried {
                return Err(OramError::Corrupt(format!(
                    "block {block} is in level {level} of partition {partition}, which is empty"
                )));
            }
            self.partitions[partition as usize].reals -= 1;
            self.places.insert(block, Place::Cached);
            let target = self.random_partition();
            let mut data = None;
            if carried {
                let busy = self.partitions[partition as usize].busy.as_mut().expect("merging");
                match &busy.arrived {
                    Some(got) => data = got.get(&block).cloned(),
                    None => busy.waiting.push(block),
                }
            }
            self.cache_block(block, data, target, Some((partition, level)), false);
        }
        Ok(ReadPlan { partition, slots, real: real_index, keep: Vec::new(), after })
    }

    /// The reads of `partition`'s shuffle `serial` have arrived: `live` holds the data of the
    /// live blocks among them. Blocks accesses took from the merged levels meanwhile get
    /// their data, and later accesses take theirs from here until the shuffle lands.
    pub fn shuffle_fetched(&mut self, partition: u32, serial: u64, live: HashMap<u64, Vec<u8>>) {
        let Some(busy) = self.partitions[partition as usize].busy.as_mut() else { return };
        if busy.serial != serial {
            return;
        }
        let waiting = std::mem::take(&mut busy.waiting);
        for b in waiting {
            if let (Some(c), Some(d)) = (self.cache.get_mut(&b), live.get(&b)) {
                if c.data.is_none() {
                    c.data = Some(d.clone());
                }
            }
        }
        if let Some(busy) = self.partitions[partition as usize].busy.as_mut() {
            busy.arrived = Some(live);
        }
    }

    /// Whether the reads of `partition`'s shuffle `serial` have arrived (or it has landed).
    pub fn shuffle_arrived(&self, partition: u32, serial: u64) -> bool {
        match &self.partitions[partition as usize].busy {
            Some(b) if b.serial == serial => b.arrived.is_some(),
            _ => true,
        }
    }

    /// [`ObliviStoreOram::plan_read`] of a Path ORAM partition: the whole path to the block's
    /// leaf (for a fake read, the leaf a cached block is bound for here, else a uniformly
    /// random one). Every live block on it goes to the
    /// cache: the accessed one bound for a fresh partition, the others still bound for this
    /// one with their leaves, to be written back by the eviction that follows.
    fn plan_read_path(&mut self, block: u64, partition: u32, real: bool) -> Result<ReadPlan> {
        let (z, height) = self.config.path_shape().expect("a Path ORAM partition");
        let p = partition;
        let mut leaf = None;
        if real {
            match self.places.get(&block) {
                Some(&Place::InTree { partition: q, leaf: l, .. }) if q == p => leaf = Some(l),
                // A read of this partition took it out after this access began: it waits in
                // the cache, and this read is a fake one of the same partition.
                Some(Place::Cached) => {}
                other => {
                    return Err(OramError::Corrupt(format!(
                        "block {block} was planned as stored in partition {p}, but is {other:?}"
                    )))
                }
            }
        }
        // A fake read of a block bound for this partition reads the path to the leaf it is
        // bound for (where a real read would go once an eviction takes it there).
        let bound = self.cache.get(&block).filter(|c| c.target == p).map(|c| c.leaf);
        let leaf = match leaf.or(bound) {
            Some(l) => l,
            None => self.random_leaf(),
        };
        let tree = self.partitions[p as usize].tree.as_mut().expect("a Path ORAM partition");
        if tree.due.is_some() {
            return Err(OramError::Corrupt(format!(
                "partition {p} was read again before its write-back"
            )));
        }
        tree.due = Some(leaf);
        let mut slots = Vec::with_capacity(((height + 1) * z) as usize);
        let mut real_index = None;
        let mut keep = Vec::new();
        let mut taken = Vec::new();
        for depth in 0..=height {
            let bucket = bucket_on_path(leaf, depth, height);
            for i in 0..z {
                let s = (bucket * z as u64 + i as u64) as u32;
                let holder = tree.holders[s as usize];
                let live = match self.places.get(&holder) {
                    Some(&Place::InTree { partition: q, slot, leaf: l }) if q == p && slot == s => {
                        Some(l)
                    }
                    _ => None,
                };
                if let Some(l) = live {
                    if holder == block && real {
                        real_index = Some(slots.len());
                    } else {
                        keep.push(slots.len());
                    }
                    taken.push((holder, l, bucket));
                }
                slots.push(tree.slot_read(&self.config, p, u64::from(s)));
            }
        }
        if real && real_index.is_none() && self.places.get(&block) != Some(&Place::Cached) {
            return Err(OramError::Corrupt(format!(
                "block {block} is not on the path to its leaf in partition {p}"
            )));
        }
        self.stats.slots_read += slots.len() as u64;
        if real_index.is_none() {
            self.stats.fake_reads += u64::from(real);
        }
        for (b, l, bucket) in taken {
            self.partitions[p as usize].reals -= 1;
            self.places.insert(b, Place::Cached);
            let origin = Some((p, bucket as u32));
            if b == block && real {
                let target = self.random_partition();
                self.cache_block(b, None, target, origin, false);
            } else {
                self.cache_block(b, None, p, origin, false);
                self.cache.get_mut(&b).expect("cached above").leaf = l;
            }
        }
        Ok(ReadPlan { partition, slots, real: real_index, keep, after: None })
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
            Some(Place::Stored { .. } | Place::InTree { .. }) => false,
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
                // A fresh partition, also for a block an eviction is carrying: that eviction
                // then leaves it in the cache (a new version), else the block's next read would
                // go where this one went.
                if let Some(c) = self.cache.get_mut(&block).filter(|c| c.evicting) {
                    c.version += 1;
                }
                self.set_target(block, target);
                self.cache
                    .get(&block)
                    .and_then(|c| c.data.clone())
                    .ok_or_else(|| OramError::Corrupt(format!("block {block} finished unread")))?
            }
            Some(Place::Stored { .. } | Place::InTree { .. }) => {
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
        if self.config.path_shape().is_some() {
            return self.plan_write_back(partition);
        }
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
        if self.config.path_shape().is_some() {
            return self.plan_tree_rebuild(partition);
        }
        self.plan_shuffle(partition, Vec::new(), true)
    }

    /// The eviction of a Path ORAM partition: the path its last read took, written to the
    /// buckets' other copies, each block as deep as its leaf allows. Candidates are the
    /// blocks that read took (bound for this partition again) and up to `b` other cached
    /// blocks bound for it; whatever does not fit stays in the cache. With no read due (a
    /// background eviction, which this setting never plans) it writes nothing.
    fn plan_write_back(&mut self, partition: u32) -> Shuffle {
        let (z, height) = self.config.path_shape().expect("a Path ORAM partition");
        let p = partition;
        let serial = self.fresh_serial();
        let due = self.partitions[p as usize].tree.as_mut().and_then(|t| t.due.take());
        let Some(leaf) = due else {
            return self.empty_shuffle(p, serial);
        };
        let path: Vec<u64> = (0..=height).map(|d| bucket_on_path(leaf, d, height)).collect();
        let room = self.config.capacity.saturating_sub(self.partitions[p as usize].reals) as usize;
        let mut own = Vec::new();
        let mut others = Vec::new();
        for &b in &self.by_target[p as usize] {
            let Some(c) = self.cache.get(&b) else { continue };
            if self.pins.contains_key(&b) || c.data.is_none() || c.evicting {
                continue;
            }
            let from_path = c.origin.is_some_and(|(q, bk)| q == p && path.contains(&(bk as u64)));
            if from_path {
                own.push((b, c.leaf));
            } else if others.len() < self.config.batch as usize {
                others.push((b, c.leaf));
            }
        }
        own.extend(others);
        own.truncate(room);
        // Deepest first: a block goes to the deepest bucket of the path its leaf shares.
        let mut holders = vec![DUMMY; path.len() * z as usize];
        let mut leaves = vec![0u32; holders.len()];
        let mut placed = Vec::new();
        for depth in (0..=height).rev() {
            let mut used = 0;
            own.retain(|&(b, l)| {
                if used < z && common_depth(l, leaf, height) >= depth {
                    let k = depth as usize * z as usize + used as usize;
                    holders[k] = b;
                    leaves[k] = l;
                    used += 1;
                    placed.push(b);
                    false
                } else {
                    true
                }
            });
        }
        let evicted: Vec<(u64, Vec<u8>, u64)> = placed
            .iter()
            .map(|b| {
                let c = self.cache.get_mut(b).expect("a candidate");
                c.evicting = true;
                (*b, c.data.clone().expect("ready"), c.version)
            })
            .collect();
        self.partitions[p as usize].reals += evicted.len() as u32;
        let tree = self.partitions[p as usize].tree.as_ref().expect("a Path ORAM partition");
        let writes: Vec<(CellId, u64)> = holders
            .iter()
            .enumerate()
            .map(|(k, &h)| {
                let i = (k % z as usize) as u32;
                (tree.next_cell(&self.config, p, path[k / z as usize], i), h)
            })
            .collect();
        self.stats.shuffle_cells += writes.len() as u64;
        Shuffle {
            writes,
            evicted_versions: evicted.iter().map(|e| e.2).collect(),
            evicted: evicted.into_iter().map(|(b, d, _)| (b, d)).collect(),
            buckets: path,
            leaves,
            ..self.empty_shuffle(p, serial)
        }
    }

    /// A shuffle of a Path ORAM partition that reads and writes nothing.
    fn empty_shuffle(&self, partition: u32, serial: u64) -> Shuffle {
        Shuffle {
            partition,
            level: 0,
            area: 0,
            serial,
            reads: Vec::new(),
            spill: Vec::new(),
            live: Vec::new(),
            writes: Vec::new(),
            evicted: Vec::new(),
            evicted_versions: Vec::new(),
            counter: 0,
            buckets: Vec::new(),
            leaves: Vec::new(),
        }
    }

    /// A rebuild of a whole Path ORAM partition (after a restart): every current cell read,
    /// every live block under a fresh leaf, every bucket written to its other copy. Blocks
    /// over the capacity, or that find no room on their path, go to the cache.
    fn plan_tree_rebuild(&mut self, partition: u32) -> Shuffle {
        let (z, height) = self.config.path_shape().expect("a Path ORAM partition");
        let p = partition;
        let serial = self.fresh_serial();
        let buckets = ObliviStoreConfig::path_buckets((z, height));
        let tree = self.partitions[p as usize].tree.as_mut().expect("a Path ORAM partition");
        tree.due = None;
        let mut reads = Vec::new();
        let mut live_flags = Vec::new();
        let mut live = Vec::new();
        for bucket in 0..buckets {
            for i in 0..z {
                let s = (bucket * z as u64 + i as u64) as u32;
                let read = tree.slot_read(&self.config, p, u64::from(s));
                let h = read.holder;
                reads.push(read);
                let is_live = h != DUMMY
                    && matches!(self.places.get(&h),
                        Some(&Place::InTree { partition: q, slot, .. }) if q == p && slot == s);
                live_flags.push(is_live);
                if is_live {
                    live.push(h);
                }
            }
        }
        // Blocks whose place a read cut off by a crash showed go to fresh partitions.
        let (mut spill, kept): (Vec<u64>, Vec<u64>) =
            live.into_iter().partition(|b| self.revealed.contains_key(b));
        live = kept;
        if live.len() > self.config.capacity as usize {
            spill.extend(live.split_off(self.config.capacity as usize));
        }
        let mut holders = vec![DUMMY; (buckets * z as u64) as usize];
        let mut leaves = vec![0u32; holders.len()];
        let mut used = vec![0u32; buckets as usize];
        for b in live {
            let l = self.random_leaf();
            let spot = (0..=height)
                .rev()
                .map(|d| bucket_on_path(l, d, height))
                .find(|&bk| used[bk as usize] < z);
            match spot {
                Some(bk) => {
                    let k = (bk * z as u64) as usize + used[bk as usize] as usize;
                    used[bk as usize] += 1;
                    holders[k] = b;
                    leaves[k] = l;
                }
                None => spill.push(b),
            }
        }
        let tree = self.partitions[p as usize].tree.as_ref().expect("a Path ORAM partition");
        let writes = holders
            .iter()
            .enumerate()
            .map(|(k, &h)| {
                let (bucket, i) = (k as u64 / z as u64, (k as u64 % z as u64) as u32);
                (tree.next_cell(&self.config, p, bucket, i), h)
            })
            .collect::<Vec<_>>();
        self.stats.shuffle_cells += (reads.len() + writes.len()) as u64;
        Shuffle {
            reads,
            spill,
            live: live_flags,
            writes,
            buckets: (0..buckets).collect(),
            leaves,
            ..self.empty_shuffle(p, serial)
        }
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
        debug_assert!(part.busy.is_none(), "two shuffles of partition {partition} at once");
        let level = if rebuild { levels } else { (part.counter.trailing_ones()).min(levels) };
        let counter = if level == levels { 0 } else { part.counter + 1 };
        let area = if level == levels { 1 - part.top_area } else { 0 };
        // From each merged level, as many unread slots as the level can hold real blocks
        // (every unread slot for a rebuild): the live ones and uniformly random others.
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
            let unread: Vec<(u32, u64, bool)> = (0..lvl.holders.len() as u32)
                .filter(|&s| !lvl.read[s as usize])
                .map(|s| {
                    let h = lvl.holders[s as usize];
                    let is_live = h != DUMMY
                        && self.places.get(&h)
                            == Some(&Place::Stored { partition, level: l, slot: s });
                    (s, h, is_live)
                })
                .collect();
            let bound = self.config.level_reals(l) as usize;
            let live_here = unread.iter().filter(|u| u.2).count();
            let chosen: Vec<(u32, u64, bool)> =
                if rebuild || unread.len() <= bound || live_here > bound {
                    // A level over its bound can only come from a damaged state: every
                    // unread slot is read (a public set), so no block is left behind.
                    unread
                } else {
                    let (mut pick, others): (Vec<_>, Vec<_>) =
                        unread.into_iter().partition(|u| u.2);
                    pick.extend(others.choose_multiple(&mut self.rng, bound - live_here));
                    pick.sort_unstable_by_key(|u| u.0);
                    pick
                };
            for (s, h, is_live) in chosen {
                reads.push(SlotRead {
                    cell: self.config.cell(partition, l, a, s as u64),
                    serial: lvl.serial,
                    holder: h,
                });
                live_flags.push(is_live);
                if is_live {
                    live.push(h);
                }
            }
        }
        let cap = self.config.capacity as usize;
        let mut spill = Vec::new();
        if rebuild {
            // Blocks whose place a read cut off by a crash showed go to fresh partitions.
            let (out, kept): (Vec<u64>, Vec<u64>) =
                live.into_iter().partition(|b| self.revealed.contains_key(b));
            spill = out;
            live = kept;
            if live.len() > cap {
                spill.extend(live.split_off(cap));
            }
        }
        let mut holders = live;
        for (b, _, _) in &evicted {
            holders.push(*b);
            self.partitions[partition as usize].reals += 1;
        }
        let slots = self.config.level_slots(level) as usize;
        // Everything fits, even from a damaged state whose levels are over their bounds: a
        // small level has (b+1)·2^l slots, one more batch than all the levels below it
        // together, and an eviction brings at most a batch; into the top level, every live
        // and evicted block is counted in `reals`, which eviction keeps within the capacity
        // (and a rebuild spills above it), less than the top level's slots. So `resize` only
        // adds dummies.
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
        // Until it lands, accesses read around the levels it merges.
        let merged = merged.iter().fold(0u64, |m, &l| m | 1 << l);
        self.partitions[partition as usize].busy =
            Some(Busy { serial, merged, arrived: None, waiting: Vec::new() });
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
            buckets: Vec::new(),
            leaves: Vec::new(),
        }
    }

    /// The shuffle's cells are in the store: the new level replaces the merged ones. Returns
    /// what the redo log must keep (the caller appends it before the partition is used again).
    pub fn finish_shuffle(
        &mut self,
        shuffle: Shuffle,
        spilled: Vec<(u64, Vec<u8>)>,
    ) -> Result<ShuffleRecord> {
        let levels = self.config.levels;
        let p = shuffle.partition;
        // Whether a levelled partition's level `l` is one the shuffle merged (and retires).
        let merged = |l: u32| shuffle.level == levels || l < shuffle.level;
        if self.partitions[p as usize].busy.as_ref().is_some_and(|b| b.serial == shuffle.serial) {
            self.partitions[p as usize].busy = None;
        }
        let tree = self.config.path_shape().map(|zh| {
            (shuffle.buckets.len() as u64 == ObliviStoreConfig::path_buckets(zh), &shuffle.buckets)
        });
        let retires = |origin: Option<(u32, u32)>| {
            origin.is_some_and(|(op, ol)| {
                op == p
                    && match tree {
                        // A Path ORAM partition: the rewritten buckets' old copies.
                        Some((whole, buckets)) => whole || buckets.contains(&(ol as u64)),
                        None => merged(ol),
                    }
            })
        };
        // A cached block whose read has not landed yet, from a slot the shuffle retires: the
        // record could not carry its data, and the log would keep no copy of it. The driver
        // hands a read's data over before the shuffle may write; refused before any change.
        if let Some((&b, _)) =
            self.cache.iter().find(|(_, c)| c.data.is_none() && retires(c.origin))
        {
            return Err(OramError::Protocol(format!(
                "a shuffle of partition {p} (serial {}) retires the slot of block {b}, whose read \
                 has not landed",
                shuffle.serial
            )));
        }
        // Spilled blocks go to the cache (and into the record, which carries their data),
        // unless an access took them from the shuffle meanwhile.
        for (b, data) in spilled {
            let here = matches!(self.places.get(&b),
                Some(Place::Stored { partition, .. } | Place::InTree { partition, .. })
                    if *partition == p);
            if shuffle.spill.contains(&b) && here {
                self.revealed.remove(&b);
                let target = self.random_partition();
                self.places.insert(b, Place::Cached);
                self.partitions[p as usize].reals -= 1;
                self.cache_block(b, Some(data), target, Some((p, levels)), false);
            }
        }
        // Blocks a tree write-back carries back unchanged: the new cells hold them, the
        // record needs no copy.
        let carried: std::collections::HashSet<u64> = if tree.is_some() {
            shuffle
                .evicted
                .iter()
                .zip(&shuffle.evicted_versions)
                .filter(|((b, _), &v)| {
                    !self.pins.contains_key(b) && self.cache.get(b).is_some_and(|c| c.version == v)
                })
                .map(|((b, _), _)| *b)
                .collect()
        } else {
            Default::default()
        };
        // Cached blocks whose stored copy goes away, and with it the only copy the log knows
        // of: the record carries their data (written or not).
        let mut rescued = Vec::new();
        for (&b, c) in self.cache.iter_mut() {
            if retires(c.origin) {
                c.origin = None;
                if carried.contains(&b) {
                    continue;
                }
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
        if tree.is_none() {
            // Blocks an access took from the merged levels while the shuffle was in flight:
            // their new cells are stale (the block is cached now, or was even evicted to
            // another partition since).
            for (s, &h) in holders.iter().enumerate() {
                if h == DUMMY || shuffle.evicted.iter().any(|(b, _)| *b == h) {
                    continue;
                }
                let stays = matches!(self.places.get(&h),
                    Some(&Place::Stored { partition, level, .. }) if partition == p && merged(level));
                if !stays {
                    stale.push(s as u32);
                }
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
            buckets: shuffle.buckets,
            leaves: shuffle.leaves,
        };
        self.install(&record);
        Ok(record)
    }

    /// Applies a finished shuffle to the levels and the position map.
    fn install(&mut self, r: &ShuffleRecord) {
        if let Some((z, _)) = self.config.path_shape() {
            return self.install_path(r, z);
        }
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
            self.place(h, placed, r);
        }
        self.next_serial = self.next_serial.max(r.serial + 1);
    }

    /// Places `h`, a holder of a finished shuffle's new cells, unless it is a block that left
    /// for the cache meanwhile (not one the shuffle evicted).
    fn place(&mut self, h: u64, placed: Place, r: &ShuffleRecord) {
        match self.places.get(&h) {
            // A block moved in (the evicted one), or one that stayed in the partition.
            Some(Place::Cached) if !r.evicted.contains(&h) => {}
            _ => {
                self.places.insert(h, placed);
                // Moved within the partition a read showed: still marked.
                if self.revealed.get(&h) != Some(&r.partition) {
                    self.revealed.remove(&h);
                }
            }
        }
    }

    /// [`ObliviStoreOram::install`] for a Path ORAM partition: each rewritten bucket switches
    /// to its other copy.
    fn install_path(&mut self, r: &ShuffleRecord, z: u32) {
        let z = z as usize;
        let tree = self.partitions[r.partition as usize].tree.as_mut().expect("a tree");
        for (k, &bucket) in r.buckets.iter().enumerate() {
            let b = bucket as usize;
            tree.copy[b] = 1 - tree.copy[b];
            tree.serial[b] = r.serial;
            tree.holders[b * z..(b + 1) * z].copy_from_slice(&r.holders[k * z..(k + 1) * z]);
        }
        for (k, &h) in r.holders.iter().enumerate() {
            if h == DUMMY || r.stale.contains(&(k as u32)) {
                continue;
            }
            let slot = (r.buckets[k / z] as usize * z + k % z) as u32;
            let placed = Place::InTree { partition: r.partition, slot, leaf: r.leaves[k] };
            self.place(h, placed, r);
        }
        self.next_serial = self.next_serial.max(r.serial + 1);
    }

    /// Replays a logged shuffle (recovery): the levels, the positions, the blocks it rescued.
    pub fn replay_shuffle(&mut self, r: &ShuffleRecord) -> Result<()> {
        let fits = match self.config.path_shape() {
            Some((z, h)) => {
                let buckets = ObliviStoreConfig::path_buckets((z, h));
                r.holders.len() == r.buckets.len() * z as usize
                    && r.leaves.len() == r.holders.len()
                    && r.buckets.iter().all(|&b| b < buckets)
                    && r.leaves.iter().all(|&l| (l as u64) < 1u64 << h)
                    && r.buckets.iter().collect::<std::collections::HashSet<_>>().len()
                        == r.buckets.len()
            }
            None => {
                r.level <= self.config.levels
                    && r.holders.len() as u64 == self.config.level_slots(r.level)
            }
        };
        if r.partition >= self.config.partitions || !fits {
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
            if let Some(Place::Stored { partition, .. } | Place::InTree { partition, .. }) =
                self.places.remove(&b)
            {
                moved_from.push(partition);
            }
        }
        self.install(r);
        // Blocks the log still placed in a retired level (or in a slot of a tree that now
        // holds something else): their copy was rescued or moved on.
        let tree = self.partitions[p as usize].tree.as_ref();
        let stale: Vec<u64> = self
            .places
            .iter()
            .filter(|(&b, pl)| match **pl {
                Place::InTree { partition, slot, .. } if partition == p => {
                    tree.and_then(|t| t.holders.get(slot as usize)) != Some(&b)
                }
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
                "the redo log loses block {b} ({} blocks in all): a logged shuffle of \
                 partition {p} into level {} (serial {}) retired its slot ({:?}) but neither \
                 holds, evicts nor rescues it",
                stale.len(),
                r.level,
                r.serial,
                self.places.get(b)
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
            .filter(|pl| {
                matches!(pl, Place::Stored { partition, .. } | Place::InTree { partition, .. }
                    if *partition == p)
            })
            .count();
        self.partitions[p as usize].reals = n as u32;
    }

    /// Replays a logged reveal (recovery): a read of `block`'s partition may have gone out to
    /// the store. If the log still places the block in that partition at the end of the
    /// replay (a later record may move it within the partition, but not out of it), the
    /// rebuild sends it to a fresh partition.
    pub fn replay_reveal(&mut self, block: u64) -> Result<()> {
        self.check_block(block)?;
        if let Some(Place::Stored { partition, .. } | Place::InTree { partition, .. }) =
            self.places.get(&block).copied()
        {
            self.revealed.insert(block, partition);
        }
        Ok(())
    }

    fn put_cached(&mut self, block: u64, target: u32, data: Vec<u8>, dirty: bool) -> Result<()> {
        self.revealed.remove(&block);
        if target >= self.config.partitions || data.len() != self.config.block_size as usize {
            return Err(OramError::Corrupt("a logged block does not fit the ORAM".into()));
        }
        if let Some(Place::Stored { partition, .. } | Place::InTree { partition, .. }) =
            self.places.get(&block).copied()
        {
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
                Place::InTree { partition, slot, .. } => {
                    let t = self.partitions[partition as usize].tree.as_ref()?;
                    Some((b, t.slot_read(&self.config, partition, u64::from(slot)).cell))
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
            if let Some(t) = &part.tree {
                let slots = t.holders.len() as u64;
                out.extend((0..slots).map(|s| t.slot_read(&self.config, p as u32, s)));
                continue;
            }
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
                Place::InTree { partition, slot, leaf } => {
                    let (z, height) = self.config.path_shape().ok_or("a tree place, no trees")?;
                    let t = self.partitions[partition as usize].tree.as_ref().ok_or("no tree")?;
                    if t.holders.get(slot as usize) != Some(&b) {
                        return Err(format!("block {b} is not in its slot"));
                    }
                    let bucket = (slot / z) as u64;
                    if leaf >= 1 << height
                        || bucket_on_path(leaf, depth_of(bucket), height) != bucket
                    {
                        return Err(format!("block {b} is off the path to its leaf {leaf}"));
                    }
                }
            }
        }
        for (p, part) in self.partitions.iter().enumerate() {
            let stored = self
                .places
                .values()
                .filter(|pl| {
                    matches!(pl, Place::Stored { partition, .. } | Place::InTree { partition, .. }
                        if *partition as usize == p)
                })
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
            if part.tree.is_some() {
                continue;
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
        let due = self.partitions.iter().any(|p| p.tree.as_ref().is_some_and(|t| t.due.is_some()));
        if due
            || self.partitions.iter().any(|p| p.busy.is_some())
            || !self.pins.is_empty()
            || self.cache.values().any(|c| c.evicting || c.data.is_none())
        {
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
        let tree_fits = |t: &Option<PathTree>| match (t, c.path_shape()) {
            (None, None) => true,
            (Some(t), Some(zh)) => {
                let buckets = ObliviStoreConfig::path_buckets(zh) as usize;
                t.copy.len() == buckets
                    && t.serial.len() == buckets
                    && t.holders.len() == buckets * zh.0 as usize
                    && t.copy.iter().all(|&x| x < 2)
            }
            _ => false,
        };
        let ok = s.partitions.len() == c.partitions as usize
            && s.partitions.iter().all(|p| tree_fits(&p.tree))
            && s.partitions.iter().all(|p| {
                p.tree.is_some()
                    || (p.small.len() == c.levels as usize
                        && p.top.holders.len() as u64 == c.level_slots(c.levels)
                        && p.top.read.len() == p.top.holders.len()
                        && p.top_area < 2
                        && p.small.iter().enumerate().all(|(i, l)| {
                            l.read.len() == l.holders.len()
                                && (l.holders.is_empty()
                                    || l.holders.len() as u64 == c.level_slots(i as u32))
                        }))
            });
        if !ok {
            return Err(OramError::Corrupt("the checkpoint does not fit its configuration".into()));
        }
        o.partitions = s.partitions;
        o.places = s.places.into_iter().collect();
        for (b, cached) in s.cache {
            let leaves = c.path_shape().map_or(1, |(_, h)| 1u64 << h);
            if cached.target >= c.partitions || cached.leaf as u64 >= leaves {
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
