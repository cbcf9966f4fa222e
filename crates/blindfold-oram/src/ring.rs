//! Ring ORAM and XOR Ring ORAM (Ren et al., USENIX Security 2015; seed 002, Algorithms 2–7).
//!
//! Like Path ORAM, blocks live in a binary tree of buckets, each block on the path to its own
//! uniformly random leaf or in the stash. Unlike Path ORAM, a bucket holds `Z` real slots and
//! `S` extra dummy slots in a secret random order, and an access reads **one block per bucket**
//! of the path: the wanted block from the bucket that holds it, a not-yet-read dummy from every
//! other bucket. The block goes to the stash; nothing is written back but the buckets'
//! metadata. Three things keep the tree healthy:
//!
//! * **eviction** every `A` accesses, along paths taken in reverse-lexicographic order of their
//!   leaves (a public schedule): each bucket of the path gives up its `Z` still-unread slots (its
//!   valid real blocks padded with dummies) to the stash, and the path is rewritten from the leaf
//!   up, greedily, each bucket freshly permuted;
//! * **early reshuffle**: a bucket read `S` times since it was last written has no unread dummy
//!   left for sure, so it is read (`Z` slots) and rewritten right after the access — which
//!   buckets need it follows from read counts the store can keep itself;
//! * per-bucket **metadata** (which slot holds which block, its leaf, valid bits, the read
//!   counter, the version the slots were written with), sealed separately and read at the
//!   start of every access.
//!
//! In the **XOR** variant the store XORs the selected slot ciphertexts and returns one block;
//! the client removes every slot's pad (a keystream it can regenerate) and is left with the
//! wanted block, or zeros if the block was in the stash. Dummy slots are encryptions of zeros.
//! The metadata then also carries a digest of each real block, which is how the recovered block
//! is authenticated (see `SECURITY.md`).
//!
//! The state machine emits plans: [`RingOram::start`] returns the first read,
//! [`RingOram::feed`] consumes each answer and returns the next [`RingPlan`] until it is done.
//! Every plan's writes are independent of its read and may be issued together.
//!
//! # Parameters
//!
//! [`RingOramConfig::recommended`] gives `(A, S)` for a bucket size `Z` from the choices
//! published with Ring ORAM: `A` is the longest eviction period that keeps the stash as small
//! as Path ORAM's with the same `Z` (3, 8, 20, 46 for `Z` = 4, 8, 16, 32), and `S = A + X` with a
//! few extra dummies `X` (2, 4, 7, 13) so that early reshuffles stay rare: between two evictions
//! of a bucket at any level the number of its reads is about Poisson(A). Seed 002's experiment
//! uses `Z = 4, S = 2, A = 3` (so early reshuffles are frequent there); the benchmark uses that.
//!
//! # Plaintext formats (the driver seals them)
//!
//! Metadata of a bucket (one cell of the metadata array):
//!
//! ```text
//! 0    8   data version u64 LE (the version the bucket's slots were last written with;
//!          0 = never written, every slot a dummy)
//! 8    4   read counter u32 LE (reads since the bucket was last written)
//! 12   4   pad epoch u32 LE (XOR variant: the key epoch of the slots' pads)
//! 16   ... Z + S slot entries, in slot order:
//!          id + 1 u64 LE (0 = dummy) | leaf u32 LE | valid u8 (1 = not read since written)
//!          [XOR variant: | SHA-256 of the block, first 16 bytes (zeros for a dummy)]
//! ```
//!
//! A bucket's slots are `block_size` bytes each; a dummy slot holds zeros.
//!
//! # Security
//!
//! The store sees, per access: one read of the metadata of the accessed path (and of the
//! eviction path when an eviction is due), one metadata write of the accessed path together
//! with one slot read per bucket of it (or one XOR request over those slots), then, if an
//! eviction is due or buckets were read `S` times, one read of `Z` slots of each such bucket and
//! one write of each. The accessed leaf is uniformly random and used once; the slot read in
//! each bucket is a uniformly random not-yet-read slot of it whatever the block; evictions
//! follow the public schedule; early reshuffles follow the public read counters. The number of
//! accesses and their timing are public, as with Path ORAM.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use crate::{BlockId, BucketId, Leaf, Op, OramError, Result, TreeShape};

/// Bytes of the metadata header (data version, counter, pad epoch).
pub const META_HEADER: usize = 16;
/// Bytes of a slot entry in the metadata (without the XOR variant's digest).
pub const SLOT_ENTRY: usize = 13;
/// Bytes of a block digest in the XOR variant's metadata.
pub const DIGEST_LEN: usize = 16;

/// Which Ring ORAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RingVariant {
    /// Online reads fetch one slot per bucket of the path (ranged reads).
    Ring,
    /// Online reads ask the store for the XOR of one slot per bucket of the path.
    XorRing,
}

impl RingVariant {
    /// `"ring"` or `"xor-ring"`.
    pub fn name(&self) -> &'static str {
        match self {
            RingVariant::Ring => "ring",
            RingVariant::XorRing => "xor-ring",
        }
    }
}

/// Validated Ring ORAM parameters. Build with [`RingOramConfig::builder`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingOramConfig {
    blocks: u64,
    block_size: u32,
    z: u32,
    s: u32,
    a: u32,
    shape: TreeShape,
    stash_limit: usize,
    variant: RingVariant,
}

/// Builder for [`RingOramConfig`].
#[derive(Clone, Debug)]
pub struct RingOramConfigBuilder {
    blocks: u64,
    block_size: u32,
    z: u32,
    s: Option<u32>,
    a: Option<u32>,
    leaves: Option<u64>,
    stash_limit: usize,
    variant: RingVariant,
}

impl RingOramConfig {
    /// Starts a configuration for `blocks` logical blocks of `block_size` bytes: `Z = 4` and
    /// `A`, `S` from [`RingOramConfig::recommended`] unless set, plain Ring ORAM.
    pub fn builder(blocks: u64, block_size: u32) -> RingOramConfigBuilder {
        RingOramConfigBuilder {
            blocks,
            block_size,
            z: 4,
            s: None,
            a: None,
            leaves: None,
            stash_limit: crate::path::DEFAULT_STASH_LIMIT,
            variant: RingVariant::Ring,
        }
    }

    /// `(A, S)` for bucket size `z` by the Ring ORAM paper's rule (see the module docs): the
    /// published pairs for `Z` = 4, 8, 16, 32, interpolated in between (`A ≈ 1.5 Z`, `X ≈ 0.4 Z`)
    /// for other sizes.
    pub fn recommended(z: u32) -> (u32, u32) {
        let (a, x) = match z {
            4 => (3, 2),
            8 => (8, 4),
            16 => (20, 7),
            32 => (46, 13),
            z => ((z * 3 / 2).max(1), (z * 2 / 5).max(1)),
        };
        (a, a + x)
    }

    /// Logical capacity in blocks.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }
    /// Bytes per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }
    /// Real slots per bucket.
    pub fn z(&self) -> u32 {
        self.z
    }
    /// Extra dummy slots per bucket.
    pub fn s(&self) -> u32 {
        self.s
    }
    /// Accesses between evictions.
    pub fn a(&self) -> u32 {
        self.a
    }
    /// Slots per bucket, `Z + S`.
    pub fn slots(&self) -> u32 {
        self.z + self.s
    }
    /// The tree.
    pub fn shape(&self) -> TreeShape {
        self.shape
    }
    /// Buckets in the tree (one metadata cell and one data cell each).
    pub fn buckets(&self) -> u64 {
        self.shape.buckets()
    }
    /// Stash bound.
    pub fn stash_limit(&self) -> usize {
        self.stash_limit
    }
    /// Ring or XOR Ring.
    pub fn variant(&self) -> RingVariant {
        self.variant
    }
    /// Bytes of one slot entry of the metadata.
    pub fn slot_entry_bytes(&self) -> usize {
        SLOT_ENTRY + if self.variant == RingVariant::XorRing { DIGEST_LEN } else { 0 }
    }
    /// Plaintext bytes of one bucket's metadata.
    pub fn meta_bytes(&self) -> usize {
        META_HEADER + self.slots() as usize * self.slot_entry_bytes()
    }
}

impl RingOramConfigBuilder {
    /// Real slots per bucket (default 4).
    pub fn z(mut self, z: u32) -> Self {
        self.z = z;
        self
    }
    /// Extra dummy slots per bucket (default from [`RingOramConfig::recommended`]).
    pub fn s(mut self, s: u32) -> Self {
        self.s = Some(s);
        self
    }
    /// Accesses between evictions (default from [`RingOramConfig::recommended`]).
    pub fn a(mut self, a: u32) -> Self {
        self.a = Some(a);
        self
    }
    /// Leaves of the tree (rounded up to a power of two). Default: `blocks / Z`, so seed 002's
    /// 4096 blocks with `Z = 4` give 1024 leaves and 2047 buckets.
    pub fn leaves(mut self, leaves: u64) -> Self {
        self.leaves = Some(leaves);
        self
    }
    /// Stash bound in blocks held between accesses (default 200).
    pub fn stash_limit(mut self, limit: usize) -> Self {
        self.stash_limit = limit;
        self
    }
    /// Ring or XOR Ring (default Ring).
    pub fn variant(mut self, variant: RingVariant) -> Self {
        self.variant = variant;
        self
    }

    /// Checks the parameters.
    pub fn build(self) -> Result<RingOramConfig> {
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
        let (rec_a, rec_s) = RingOramConfig::recommended(self.z);
        let (a, s) = (self.a.unwrap_or(rec_a), self.s.unwrap_or(rec_s));
        if s == 0 || self.z + s > 255 {
            return bad(format!("S = {s} must be at least 1, with Z + S at most 255"));
        }
        if a == 0 {
            return bad("A must be at least 1".into());
        }
        if self.stash_limit == 0 {
            return bad("stash limit must be at least 1".into());
        }
        let leaves = self.leaves.unwrap_or_else(|| self.blocks.div_ceil(u64::from(self.z)));
        let shape = TreeShape::for_leaves(leaves).ok_or_else(|| {
            OramError::InvalidConfig(format!("{leaves} leaves exceed the largest tree"))
        })?;
        if shape.buckets() >= 1 << 40 {
            return bad("at most 2^40 buckets".into());
        }
        Ok(RingOramConfig {
            blocks: self.blocks,
            block_size: self.block_size,
            z: self.z,
            s,
            a,
            shape,
            stash_limit: self.stash_limit,
            variant: self.variant,
        })
    }
}

/// One slot of a bucket to read, with what the driver needs to open it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRead {
    /// The bucket (its cell in the data array).
    pub bucket: BucketId,
    /// Slot index within the bucket, `0..Z+S`.
    pub slot: u32,
    /// The data version the bucket's slots were written with (0: never written, ignore the
    /// contents and take zeros).
    pub version: u64,
    /// XOR variant: the pad epoch the slots were written with.
    pub epoch: u32,
}

/// A whole bucket to write: metadata and every slot, in plaintext.
#[derive(Clone, Debug)]
pub struct BucketWrite {
    /// The bucket.
    pub bucket: BucketId,
    /// The new data version of its slots (seal each slot with it).
    pub version: u64,
    /// XOR variant: the pad epoch of the slots.
    pub epoch: u32,
    /// The metadata plaintext.
    pub meta: Vec<u8>,
    /// `Z + S` slot plaintexts of `block_size` bytes.
    pub slots: Vec<Vec<u8>>,
}

/// What to read next.
#[derive(Clone, Debug)]
pub enum RingRead {
    /// Read these buckets' metadata cells; feed [`RingInput::Meta`].
    Meta(Vec<BucketId>),
    /// Read these slots (ranged reads of the data array); feed [`RingInput::Slots`].
    Slots(Vec<SlotRead>),
    /// Ask the store for the XOR of these slots; feed [`RingInput::Xor`] with the XOR of their
    /// plaintexts (the driver removes each slot's pad).
    Xor(Vec<SlotRead>),
    /// Nothing: the access is complete once the plan's writes are done.
    Done,
}

/// The answer to a [`RingRead`].
#[derive(Clone, Debug)]
pub enum RingInput {
    /// Metadata plaintexts, in order; `None` for a cell never written.
    Meta(Vec<Option<Vec<u8>>>),
    /// Slot plaintexts, in order; `None` for a slot of a never-written bucket.
    Slots(Vec<Option<Vec<u8>>>),
    /// The XOR of the slots' plaintexts.
    Xor(Vec<u8>),
}

/// One step of an access: write these (independent of the read), then read.
#[derive(Debug)]
pub struct RingPlan {
    /// Metadata-only writes: `(bucket, metadata plaintext)`.
    pub meta_writes: Vec<(BucketId, Vec<u8>)>,
    /// Whole-bucket writes (slots and metadata).
    pub bucket_writes: Vec<BucketWrite>,
    /// The block's contents before the access, as soon as they are known (the *response*; the
    /// rest of the access is background work the caller need not wait for).
    pub answer: Option<Vec<u8>>,
    /// What to read next.
    pub read: RingRead,
}

/// Running statistics of a [`RingOram`].
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RingOramStats {
    /// Accesses completed.
    pub accesses: u64,
    /// Evictions done.
    pub evictions: u64,
    /// Early reshuffles done (buckets).
    pub early_reshuffles: u64,
    /// Largest stash after an access.
    pub max_stash: usize,
    /// Sum of stash sizes after each access (for the mean).
    pub stash_sum: u64,
    /// Accesses whose block was found in the stash rather than in the tree.
    pub stash_hits: u64,
}

impl RingOramStats {
    /// Mean stash size after an access.
    pub fn mean_stash(&self) -> f64 {
        if self.accesses == 0 {
            0.0
        } else {
            self.stash_sum as f64 / self.accesses as f64
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct SlotMeta {
    /// id + 1; 0 for a dummy.
    tag: u64,
    leaf: u32,
    valid: bool,
    digest: [u8; DIGEST_LEN],
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Meta {
    version: u64,
    count: u32,
    epoch: u32,
    slots: Vec<SlotMeta>,
}

impl Meta {
    fn empty(slots: u32) -> Self {
        let dummy = SlotMeta { valid: true, ..SlotMeta::default() };
        Self { version: 0, count: 0, epoch: 0, slots: vec![dummy; slots as usize] }
    }

    fn encode(&self, config: &RingOramConfig) -> Vec<u8> {
        let mut out = Vec::with_capacity(config.meta_bytes());
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        for s in &self.slots {
            out.extend_from_slice(&s.tag.to_le_bytes());
            out.extend_from_slice(&s.leaf.to_le_bytes());
            out.push(u8::from(s.valid));
            if config.variant == RingVariant::XorRing {
                out.extend_from_slice(&s.digest);
            }
        }
        debug_assert_eq!(out.len(), config.meta_bytes());
        out
    }

    fn decode(config: &RingOramConfig, raw: &[u8]) -> Result<Self> {
        let corrupt = |m: &str| OramError::Corrupt(format!("bucket metadata: {m}"));
        if raw.len() != config.meta_bytes() {
            return Err(corrupt("wrong length"));
        }
        let u64_at = |i: usize| u64::from_le_bytes(raw[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_le_bytes(raw[i..i + 4].try_into().unwrap());
        let entry = config.slot_entry_bytes();
        let mut slots = Vec::with_capacity(config.slots() as usize);
        let mut reals = 0;
        for k in 0..config.slots() as usize {
            let at = META_HEADER + k * entry;
            let mut digest = [0u8; DIGEST_LEN];
            if config.variant == RingVariant::XorRing {
                digest.copy_from_slice(&raw[at + SLOT_ENTRY..at + SLOT_ENTRY + DIGEST_LEN]);
            }
            let s = SlotMeta {
                tag: u64_at(at),
                leaf: u32_at(at + 8),
                valid: match raw[at + 12] {
                    0 => false,
                    1 => true,
                    _ => return Err(corrupt("bad valid flag")),
                },
                digest,
            };
            if s.tag > config.blocks || u64::from(s.leaf) >= config.shape.leaves() {
                return Err(corrupt("block or leaf out of range"));
            }
            reals += usize::from(s.tag != 0);
            slots.push(s);
        }
        if reals > config.z as usize {
            return Err(corrupt("more than Z real blocks"));
        }
        Ok(Self { version: u64_at(0), count: u32_at(8), epoch: u32_at(12), slots })
    }
}

type Hasher = BuildHasherDefault<DefaultHasher>;

#[derive(Clone, Debug, Serialize, Deserialize)]
struct StashEntry {
    leaf: u32,
    data: Vec<u8>,
}

/// Where an access in progress is.
#[derive(Debug)]
enum Phase {
    /// Waiting for the metadata of the access path (and of the eviction path, if due).
    Meta,
    /// Waiting for the online slot reads (or their XOR).
    Online,
    /// Waiting for the slots read for eviction and early reshuffles.
    Background,
}

#[derive(Debug)]
struct Cursor {
    phase: Phase,
    block: u64,
    op: Option<Op>,
    leaf: Leaf,
    new_leaf: Leaf,
    /// Leaf of the eviction path, if this access evicts.
    evict: Option<Leaf>,
    /// Metadata of every bucket this access touched, as currently in the store plus changes.
    metas: BTreeMap<u64, Meta>,
    /// The online reads, per level: (bucket, slot, whether it held the block).
    online: Vec<(BucketId, u32, bool)>,
    /// Buckets to rewrite in the background: the eviction path (leaf first), then the buckets
    /// reshuffled early (deepest first).
    rewrite: Vec<BucketId>,
    /// Slots read in the background, in order.
    background: Vec<SlotRead>,
    expect: usize,
}

/// The trusted state of a [`RingOram`] between accesses.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RingOramState {
    /// Parameters.
    pub config: RingOramConfig,
    /// Position map: leaf + 1 per block, 0 = never assigned.
    pub posmap: Vec<u32>,
    /// Stash: (block id, leaf, contents).
    pub stash: Vec<(u64, u32, Vec<u8>)>,
    /// Accesses made (drives the eviction schedule).
    pub round: u64,
    /// Evictions made (the next eviction path is its bit-reversal).
    pub evictions: u64,
    /// Statistics.
    pub stats: RingOramStats,
}

/// A Ring ORAM (or XOR Ring ORAM) client as a state machine: [`RingOram::start`] an access,
/// then [`RingOram::feed`] it what each [`RingPlan`] asked to read until the plan's read is
/// [`RingRead::Done`].
pub struct RingOram {
    config: RingOramConfig,
    posmap: Vec<u32>,
    stash: HashMap<u64, StashEntry, Hasher>,
    rng: ChaCha20Rng,
    round: u64,
    evictions: u64,
    write_epoch: u32,
    cur: Option<Cursor>,
    stats: RingOramStats,
}

impl std::fmt::Debug for RingOram {
    // Leaves and block ids are secrets: print only public parameters.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingOram").field("config", &self.config).finish_non_exhaustive()
    }
}

/// The first 16 bytes of SHA-256 of a block (the XOR variant's authenticator).
pub fn block_digest(data: &[u8]) -> [u8; DIGEST_LEN] {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    d.as_ref()[..DIGEST_LEN].try_into().unwrap()
}

impl RingOram {
    /// A new, empty ORAM drawing its randomness from the operating system.
    pub fn new(config: RingOramConfig) -> Self {
        Self::with_rng(config, ChaCha20Rng::from_entropy())
    }

    /// A new, empty ORAM with a seeded generator (tests, benchmarks).
    pub fn with_seed(config: RingOramConfig, seed: u64) -> Self {
        Self::with_rng(config, ChaCha20Rng::seed_from_u64(seed))
    }

    /// A new, empty ORAM drawing randomness from `rng`.
    pub fn with_rng(config: RingOramConfig, rng: ChaCha20Rng) -> Self {
        let posmap = vec![0u32; config.blocks as usize];
        Self {
            config,
            posmap,
            stash: HashMap::default(),
            rng,
            round: 0,
            evictions: 0,
            write_epoch: 0,
            cur: None,
            stats: RingOramStats::default(),
        }
    }

    /// Continues from exported trusted state with a fresh generator.
    pub fn from_state(state: RingOramState, rng: ChaCha20Rng) -> Result<Self> {
        let mut oram = Self::with_rng(state.config, rng);
        if state.posmap.len() != oram.posmap.len() {
            return Err(OramError::Corrupt("imported state: position map size".into()));
        }
        oram.posmap = state.posmap;
        for (id, leaf, data) in state.stash {
            oram.stash.insert(id, StashEntry { leaf, data });
        }
        oram.round = state.round;
        oram.evictions = state.evictions;
        oram.stats = state.stats;
        Ok(oram)
    }

    /// Exports the trusted state (between accesses).
    pub fn export_state(&self) -> Result<RingOramState> {
        if self.cur.is_some() {
            return Err(OramError::Protocol("cannot export state during an access".into()));
        }
        let mut stash: Vec<_> =
            self.stash.iter().map(|(&id, e)| (id, e.leaf, e.data.clone())).collect();
        stash.sort_unstable_by_key(|e| e.0);
        Ok(RingOramState {
            config: self.config.clone(),
            posmap: self.posmap.clone(),
            stash,
            round: self.round,
            evictions: self.evictions,
            stats: self.stats.clone(),
        })
    }

    /// The parameters.
    pub fn config(&self) -> &RingOramConfig {
        &self.config
    }

    /// Statistics so far.
    pub fn stats(&self) -> &RingOramStats {
        &self.stats
    }

    /// Blocks in the stash now.
    pub fn stash_len(&self) -> usize {
        self.stash.len()
    }

    /// Whether `block` is in the stash now (for measuring how long blocks wait there).
    pub fn in_stash(&self, block: BlockId) -> bool {
        self.stash.contains_key(&block.0)
    }

    /// Sets the pad epoch recorded with every bucket written from now on (XOR variant: the
    /// driver's current pad key).
    pub fn set_write_epoch(&mut self, epoch: u32) {
        self.write_epoch = epoch;
    }

    /// Bytes of trusted memory held now: position map and stash.
    pub fn trusted_bytes(&self) -> u64 {
        self.posmap.len() as u64 * 4
            + self.stash.len() as u64 * (u64::from(self.config.block_size) + 16)
    }

    /// Whether an access is in progress.
    pub fn in_progress(&self) -> bool {
        self.cur.is_some()
    }

    /// Abandons an access in progress (the trusted state may then disagree with the store).
    pub fn abort(&mut self) {
        self.cur = None;
    }

    /// The stash bound, as an error if it is exceeded.
    pub fn check_stash(&self) -> Result<()> {
        if self.stash.len() > self.config.stash_limit {
            return Err(OramError::StashOverflow {
                tree: 0,
                size: self.stash.len(),
                limit: self.config.stash_limit,
            });
        }
        Ok(())
    }

    fn random_leaf(&mut self) -> Leaf {
        Leaf(self.rng.gen_range(0..self.config.shape.leaves()))
    }

    fn path(&self, leaf: Leaf) -> Vec<BucketId> {
        let shape = self.config.shape;
        (0..shape.levels()).map(|l| shape.bucket_on_path(leaf, l)).collect()
    }

    /// The `k`-th eviction path: leaves in reverse-lexicographic order (bit-reversed counter).
    pub fn eviction_leaf(config: &RingOramConfig, k: u64) -> Leaf {
        let h = config.shape.height();
        if h == 0 {
            return Leaf(0);
        }
        let g = k % config.shape.leaves();
        Leaf(g.reverse_bits() >> (64 - h))
    }

    /// Begins an access. Returns the first plan: read the metadata of the block's path (and
    /// of the eviction path if this access evicts).
    pub fn start(&mut self, block: BlockId, op: Op) -> Result<RingPlan> {
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
        let leaf = match self.posmap[block.0 as usize] {
            0 => self.random_leaf(),
            v => Leaf(u64::from(v - 1)),
        };
        let new_leaf = self.random_leaf();
        self.posmap[block.0 as usize] = new_leaf.0 as u32 + 1;
        self.round += 1;
        let evict = self
            .round
            .is_multiple_of(u64::from(self.config.a))
            .then(|| Self::eviction_leaf(&self.config, self.evictions));
        let mut read = self.path(leaf);
        if let Some(g) = evict {
            read.extend(self.path(g));
        }
        self.cur = Some(Cursor {
            phase: Phase::Meta,
            block: block.0,
            op: Some(op),
            leaf,
            new_leaf,
            evict,
            metas: BTreeMap::new(),
            online: Vec::new(),
            rewrite: Vec::new(),
            background: Vec::new(),
            expect: read.len(),
        });
        Ok(RingPlan {
            meta_writes: Vec::new(),
            bucket_writes: Vec::new(),
            answer: None,
            read: RingRead::Meta(read),
        })
    }

    /// Feeds the answer to the last plan's read and returns the next plan.
    pub fn feed(&mut self, input: RingInput) -> Result<RingPlan> {
        let mut cur = self
            .cur
            .take()
            .ok_or_else(|| OramError::Protocol("feed called with no access in progress".into()))?;
        let got = match &input {
            RingInput::Meta(v) | RingInput::Slots(v) => v.len(),
            RingInput::Xor(_) => 1,
        };
        if got != cur.expect {
            let e = OramError::Protocol(format!("fed {got} items, expected {}", cur.expect));
            self.cur = Some(cur);
            return Err(e);
        }
        let plan = match (&cur.phase, input) {
            (Phase::Meta, RingInput::Meta(metas)) => self.after_meta(&mut cur, metas),
            (Phase::Online, RingInput::Slots(slots)) => self.after_online(&mut cur, Ok(slots)),
            (Phase::Online, RingInput::Xor(x)) => self.after_online(&mut cur, Err(x)),
            (Phase::Background, RingInput::Slots(slots)) => self.after_background(&mut cur, slots),
            (phase, _) => Err(OramError::Protocol(format!("wrong input for phase {phase:?}"))),
        };
        match plan {
            Ok(plan) => {
                if !matches!(plan.read, RingRead::Done) {
                    self.cur = Some(cur);
                }
                Ok(plan)
            }
            // Errors from here on mean the store misbehaved: the access cannot continue.
            Err(e) => Err(e),
        }
    }

    fn after_meta(&mut self, cur: &mut Cursor, metas: Vec<Option<Vec<u8>>>) -> Result<RingPlan> {
        let path = self.path(cur.leaf);
        let mut order = path.clone();
        if let Some(g) = cur.evict {
            order.extend(self.path(g));
        }
        for (b, raw) in order.iter().zip(metas) {
            if cur.metas.contains_key(&b.0) {
                continue; // a bucket on both paths: the first copy is as good
            }
            let meta = match raw {
                Some(raw) => Meta::decode(&self.config, &raw)?,
                None => Meta::empty(self.config.slots()),
            };
            cur.metas.insert(b.0, meta);
        }
        // Pick one slot per bucket: the block if this bucket holds it, else an unread dummy.
        let tag = cur.block + 1;
        let mut reads = Vec::with_capacity(path.len());
        let mut meta_writes = Vec::with_capacity(path.len());
        for &b in &path {
            let meta = cur.metas.get_mut(&b.0).expect("loaded above");
            let found = meta.slots.iter().position(|s| s.valid && s.tag == tag);
            let slot = match found {
                Some(k) => k,
                None => {
                    let dummies: Vec<usize> = (0..meta.slots.len())
                        .filter(|&k| meta.slots[k].valid && meta.slots[k].tag == 0)
                        .collect();
                    *dummies.choose(&mut self.rng).ok_or_else(|| {
                        OramError::Corrupt(format!("bucket {} has no unread dummy left", b.0))
                    })?
                }
            };
            meta.slots[slot].valid = false;
            meta.count += 1;
            reads.push(SlotRead {
                bucket: b,
                slot: slot as u32,
                version: meta.version,
                epoch: meta.epoch,
            });
            cur.online.push((b, slot as u32, found.is_some()));
            meta_writes.push((b, meta.encode(&self.config)));
        }
        cur.phase = Phase::Online;
        cur.expect = if self.config.variant == RingVariant::XorRing { 1 } else { reads.len() };
        let read = match self.config.variant {
            RingVariant::Ring => RingRead::Slots(reads),
            RingVariant::XorRing => RingRead::Xor(reads),
        };
        Ok(RingPlan { meta_writes, bucket_writes: Vec::new(), answer: None, read })
    }

    fn after_online(
        &mut self,
        cur: &mut Cursor,
        fetched: std::result::Result<Vec<Option<Vec<u8>>>, Vec<u8>>,
    ) -> Result<RingPlan> {
        let block_size = self.config.block_size as usize;
        let holder = cur.online.iter().position(|&(_, _, found)| found);
        // The block from the tree, if it was there.
        let from_tree = match fetched {
            Ok(slots) => match holder {
                Some(i) => Some(slots[i].clone().ok_or_else(|| {
                    OramError::Corrupt("a real block in a never-written bucket".into())
                })?),
                None => None,
            },
            Err(xor) => {
                if xor.len() != block_size {
                    return Err(OramError::Protocol("XOR answer of the wrong length".into()));
                }
                match holder {
                    Some(i) => {
                        let (b, slot, _) = cur.online[i];
                        let want = cur.metas[&b.0].slots[slot as usize].digest;
                        if !bool::from(block_digest(&xor).ct_eq(&want)) {
                            return Err(OramError::Integrity(format!(
                                "the XOR of the path (bucket {}) does not match the block's digest",
                                b.0
                            )));
                        }
                        Some(xor)
                    }
                    None => {
                        if !bool::from(xor.ct_eq(&vec![0u8; block_size])) {
                            return Err(OramError::Integrity(
                                "the XOR of dummy slots is not zero".into(),
                            ));
                        }
                        None
                    }
                }
            }
        };
        let new_leaf = cur.new_leaf.0 as u32;
        let old = match from_tree {
            Some(data) => data,
            None => match self.stash.remove(&cur.block) {
                Some(e) => {
                    self.stats.stash_hits += 1;
                    e.data
                }
                None => vec![0u8; block_size],
            },
        };
        let data = match cur.op.take().expect("op present until the online phase ends") {
            Op::Read => old.clone(),
            Op::Write(d) => d,
        };
        self.stash.insert(cur.block, StashEntry { leaf: new_leaf, data });

        // Background work: eviction on schedule, early reshuffles of buckets read S times.
        let path = self.path(cur.leaf);
        let mut rewrite = Vec::new();
        if let Some(g) = cur.evict {
            rewrite.extend(self.path(g).into_iter().rev());
            self.evictions += 1;
            self.stats.evictions += 1;
        }
        for &b in path.iter().rev() {
            if !rewrite.contains(&b) && cur.metas[&b.0].count >= self.config.s {
                rewrite.push(b);
                self.stats.early_reshuffles += 1;
            }
        }
        if rewrite.is_empty() {
            self.finish();
            return Ok(RingPlan {
                meta_writes: Vec::new(),
                bucket_writes: Vec::new(),
                answer: Some(old),
                read: RingRead::Done,
            });
        }
        // From each: its Z unread slots — every valid real block, padded with random dummies.
        let z = self.config.z as usize;
        let mut background = Vec::with_capacity(rewrite.len() * z);
        for &b in &rewrite {
            let meta = &cur.metas[&b.0];
            let mut pick: Vec<usize> = (0..meta.slots.len())
                .filter(|&k| meta.slots[k].valid && meta.slots[k].tag != 0)
                .collect();
            let mut dummies: Vec<usize> = (0..meta.slots.len())
                .filter(|&k| meta.slots[k].valid && meta.slots[k].tag == 0)
                .collect();
            dummies.shuffle(&mut self.rng);
            let need =
                z.checked_sub(pick.len()).filter(|&n| n <= dummies.len()).ok_or_else(|| {
                    OramError::Corrupt(format!("bucket {} has too few unread slots", b.0))
                })?;
            pick.extend_from_slice(&dummies[..need]);
            pick.sort_unstable();
            for k in pick {
                background.push(SlotRead {
                    bucket: b,
                    slot: k as u32,
                    version: meta.version,
                    epoch: meta.epoch,
                });
            }
        }
        cur.rewrite = rewrite;
        cur.expect = background.len();
        cur.background = background.clone();
        cur.phase = Phase::Background;
        Ok(RingPlan {
            meta_writes: Vec::new(),
            bucket_writes: Vec::new(),
            answer: Some(old),
            read: RingRead::Slots(background),
        })
    }

    fn after_background(
        &mut self,
        cur: &mut Cursor,
        slots: Vec<Option<Vec<u8>>>,
    ) -> Result<RingPlan> {
        let xor = self.config.variant == RingVariant::XorRing;
        let zeros = vec![0u8; self.config.block_size as usize];
        for (r, data) in cur.background.iter().zip(slots) {
            let s = cur.metas[&r.bucket.0].slots[r.slot as usize];
            match (s.tag, data) {
                (0, Some(d)) if xor && !bool::from(d.ct_eq(&zeros)) => {
                    return Err(OramError::Integrity(format!(
                        "dummy slot {} of bucket {} is not zero",
                        r.slot, r.bucket.0
                    )));
                }
                (0, _) => {}
                (_, None) => {
                    return Err(OramError::Corrupt("a real block in a never-written bucket".into()))
                }
                (tag, Some(d)) => {
                    if xor && !bool::from(block_digest(&d).ct_eq(&s.digest)) {
                        return Err(OramError::Integrity(format!(
                            "slot {} of bucket {} does not match its digest",
                            r.slot, r.bucket.0
                        )));
                    }
                    self.stash.insert(tag - 1, StashEntry { leaf: s.leaf, data: d });
                }
            }
        }
        let mut writes = Vec::with_capacity(cur.rewrite.len());
        for &b in &cur.rewrite.clone() {
            let version = cur.metas[&b.0].version + 1;
            writes.push(self.fill_bucket(b, version));
        }
        self.finish();
        Ok(RingPlan {
            meta_writes: Vec::new(),
            bucket_writes: writes,
            answer: None,
            read: RingRead::Done,
        })
    }

    /// Takes up to `Z` stash blocks that may live in `b` (deepest-fitting first) and lays them
    /// out with dummies in a fresh random order.
    fn fill_bucket(&mut self, b: BucketId, version: u64) -> BucketWrite {
        let shape = self.config.shape;
        let level = shape.level_of(b);
        // Any leaf below b names its path; blocks whose paths meet it at b's level fit.
        let below = Leaf(((b.0 + 1) << (shape.height() - level)) - shape.leaves());
        let mut fit: Vec<(u32, u64)> = self
            .stash
            .iter()
            .filter_map(|(&id, e)| {
                let d = shape.common_depth(below, Leaf(u64::from(e.leaf)));
                (d >= level).then_some((d, id))
            })
            .collect();
        // Deepest first would only matter across levels; within one bucket any fitting block
        // may go. Sort for reproducible runs.
        fit.sort_unstable();
        fit.truncate(self.config.z as usize);
        let n = self.config.slots() as usize;
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut self.rng);
        let xor = self.config.variant == RingVariant::XorRing;
        let mut meta = Meta::empty(self.config.slots());
        meta.version = version;
        meta.epoch = self.write_epoch;
        let mut slots = vec![vec![0u8; self.config.block_size as usize]; n];
        for (i, &(_, id)) in fit.iter().enumerate() {
            let e = self.stash.remove(&id).expect("chosen from the stash");
            let k = order[i];
            meta.slots[k] = SlotMeta {
                tag: id + 1,
                leaf: e.leaf,
                valid: true,
                digest: if xor { block_digest(&e.data) } else { [0; DIGEST_LEN] },
            };
            slots[k] = e.data;
        }
        BucketWrite {
            bucket: b,
            version,
            epoch: self.write_epoch,
            meta: meta.encode(&self.config),
            slots,
        }
    }

    fn finish(&mut self) {
        self.stats.accesses += 1;
        self.stats.max_stash = self.stats.max_stash.max(self.stash.len());
        self.stats.stash_sum += self.stash.len() as u64;
    }

    /// Fills a fresh ORAM so that block `i` holds `data(BlockId(i))`: each block gets a random
    /// leaf and is placed as deep as it fits on its path (what fits nowhere stays in the stash).
    /// Returns every bucket, in bucket order, for the driver to write.
    ///
    /// Holds the whole tree's plaintext at once: meant for experiments and modest sizes.
    ///
    /// # Security
    ///
    /// Every bucket is written exactly once, in bucket order, whatever the contents; nothing
    /// is read.
    pub fn bulk_load(
        &mut self,
        mut data: impl FnMut(BlockId) -> Vec<u8>,
    ) -> Result<Vec<BucketWrite>> {
        if self.round != 0 || !self.stash.is_empty() || self.cur.is_some() {
            return Err(OramError::Protocol("only a fresh ORAM can be bulk loaded".into()));
        }
        let shape = self.config.shape;
        let z = self.config.z as usize;
        let mut by_bucket: Vec<Vec<u64>> = vec![Vec::new(); shape.buckets() as usize];
        let mut leaves = Vec::with_capacity(self.config.blocks as usize);
        for id in 0..self.config.blocks {
            let leaf = self.random_leaf();
            self.posmap[id as usize] = leaf.0 as u32 + 1;
            leaves.push(leaf.0 as u32);
            by_bucket[shape.bucket_on_path(leaf, shape.height()).0 as usize].push(id);
        }
        // Bottom-up: each bucket keeps Z of the blocks that reached it; the rest move up.
        for b in (0..shape.buckets()).rev() {
            let mut here = std::mem::take(&mut by_bucket[b as usize]);
            if here.len() > z {
                let rest = here.split_off(z);
                if b == 0 {
                    for id in rest {
                        let d = data(BlockId(id));
                        self.check_len(&d)?;
                        self.stash.insert(id, StashEntry { leaf: leaves[id as usize], data: d });
                    }
                } else {
                    by_bucket[((b - 1) / 2) as usize].extend(rest);
                }
            }
            by_bucket[b as usize] = here;
        }
        let mut writes = Vec::with_capacity(by_bucket.len());
        for (b, ids) in by_bucket.into_iter().enumerate() {
            for id in ids {
                let d = data(BlockId(id));
                self.check_len(&d)?;
                self.stash.insert(id, StashEntry { leaf: leaves[id as usize], data: d });
            }
            writes.push(self.fill_bucket(BucketId(b as u64), 1));
        }
        self.stats.max_stash = self.stash.len();
        Ok(writes)
    }

    fn check_len(&self, d: &[u8]) -> Result<()> {
        if d.len() != self.config.block_size as usize {
            return Err(OramError::WrongBlockSize {
                got: d.len(),
                expected: self.config.block_size,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_order_is_reverse_lexicographic() {
        let config = RingOramConfig::builder(32, 8).leaves(8).build().unwrap();
        let order: Vec<u64> = (0..8).map(|k| RingOram::eviction_leaf(&config, k).0).collect();
        assert_eq!(order, vec![0, 4, 2, 6, 1, 5, 3, 7]);
        assert_eq!(RingOram::eviction_leaf(&config, 8).0, 0);
    }

    #[test]
    fn metadata_round_trips() {
        for variant in [RingVariant::Ring, RingVariant::XorRing] {
            let config = RingOramConfig::builder(100, 16).variant(variant).build().unwrap();
            let mut m = Meta::empty(config.slots());
            m.version = 9;
            m.count = 2;
            m.epoch = 3;
            m.slots[1] = SlotMeta { tag: 5, leaf: 3, valid: false, digest: [7; DIGEST_LEN] };
            if variant == RingVariant::Ring {
                m.slots[1].digest = [0; DIGEST_LEN];
            }
            let raw = m.encode(&config);
            assert_eq!(raw.len(), config.meta_bytes());
            assert_eq!(Meta::decode(&config, &raw).unwrap(), m);
        }
    }

    #[test]
    fn recommended_parameters() {
        assert_eq!(RingOramConfig::recommended(4), (3, 5));
        assert_eq!(RingOramConfig::recommended(32), (46, 59));
        let c = RingOramConfig::builder(4096, 4096).s(2).a(3).build().unwrap();
        assert_eq!((c.z(), c.s(), c.a(), c.buckets()), (4, 2, 3, 2047));
    }
}
