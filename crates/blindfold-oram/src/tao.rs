//! TaoStore's processor (Sahin et al., seed 000) as a state machine without I/O: the planning
//! half of the concurrent engine `blindfold_proxy::TaoOram`, which adds the locks, tasks,
//! sealing, retries and the sequencer that releases replies in arrival order.
//!
//! A request goes through three steps, each a call that answers with what the driver must do:
//!
//! 1. [`TaoScheme::start`] on arrival: looks the block's leaf up and at once replaces it with a
//!    fresh random one. If a *real* read of the block is already in flight, the request reads
//!    the path to a uniformly random leaf instead (a *fake read*) and is answered, by its
//!    [`Ticket`], when the real one arrives. The returned [`TaoRequest`] names the path to read
//!    ([`TaoRequest::leaf`]) and pins it in the subtree until its write-back completes.
//! 2. The driver reads the path ([`TaoScheme::to_fetch`] names the buckets the store must send,
//!    [`TaoScheme::to_open`] those of them it must open, the others being in the subtree
//!    already and fresher), then [`TaoScheme::arrive`] merges them into the subtree, answers
//!    the request and every request that waited for it, and evicts the stash and the path
//!    greedily into the path's buckets, deepest first.
//! 3. Every `k` arrived paths close a batch ([`Arrived::closed`]). The driver writes batches
//!    back in order: [`TaoScheme::snapshot`] hands out the current contents of the union of
//!    their buckets, and [`TaoScheme::written`] lets go of the buckets nobody needs any more
//!    once the write completed.
//!
//! Sweeps ([`TaoScheme::start_sweep`]) and the replay of logged reveals after a crash
//! ([`TaoScheme::replay_read`]) go through the same subtree.
//!
//! # Subtree invariants
//!
//! A bucket in the subtree is always fresher than its stored copy. A bucket leaves the subtree
//! only when a write-back of it has completed, it has not changed since, and no path that has
//! been requested but not yet written back covers it. So a fetched copy of a bucket that is not
//! in the subtree on arrival is the one the store held when the path was requested.
//!
//! # Security
//!
//! The plans are all the store sees. Each request reads one whole path to a leaf drawn
//! uniformly at random and never used before, fixed at [`TaoScheme::start`] before any reply
//! of the store; which block it touches, whether it reads or writes and whether another request
//! touches the same block change neither the leaf nor anything else in the plans. Batches close
//! after every `k` arrived paths, a function of the number of arrivals alone, and a write-back
//! covers exactly the buckets of its batches' paths (which the store already saw), except for a
//! resident tree top ([`TaoScheme::keep_top_resident`]) that the store below keeps in trusted
//! memory. A sweep reads the public path it is given and remaps nothing. What leaks is the
//! number of requests and their timing, and when the driver chooses to write back.

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use rand::Rng;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::path::SLOT_HEADER;
use crate::{
    BlockId, BucketId, Leaf, Op, OramError, PathOramConfig, PosMapMode, Result, TreeShape,
};

/// Validated parameters of a [`TaoScheme`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaoSchemeConfig {
    blocks: u64,
    block_size: u32,
    z: u32,
    shape: TreeShape,
    write_back_every: usize,
    stash_limit: usize,
    subtree_limit: usize,
}

impl TaoSchemeConfig {
    /// The scheme over `tree` (one tree, position map in memory, no cached levels), writing
    /// back every `write_back_every` paths, with bounds on the stash (blocks) and the subtree
    /// (buckets).
    pub fn new(
        tree: &PathOramConfig,
        write_back_every: usize,
        stash_limit: usize,
        subtree_limit: usize,
    ) -> Result<Self> {
        let bad = |m: &str| Err(OramError::InvalidConfig(m.into()));
        if write_back_every == 0 {
            return bad("write-back interval k must be at least 1");
        }
        if stash_limit == 0 || subtree_limit == 0 {
            return bad("stash and subtree limits must be at least 1");
        }
        if tree.trees().len() != 1
            || tree.posmap() != PosMapMode::InMemory
            || tree.cache_levels() != 0
        {
            return bad("TaoStore runs over one tree with its position map in memory");
        }
        Ok(Self {
            blocks: tree.blocks(),
            block_size: tree.block_size(),
            z: tree.z(),
            shape: tree.trees()[0].shape,
            write_back_every,
            stash_limit,
            subtree_limit,
        })
    }

    /// Logical capacity in blocks.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }
    /// Bytes per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }
    /// Slots per bucket.
    pub fn z(&self) -> u32 {
        self.z
    }
    /// Shape of the tree.
    pub fn shape(&self) -> TreeShape {
        self.shape
    }
    /// Arrived paths per batch (`k`).
    pub fn write_back_every(&self) -> usize {
        self.write_back_every
    }
    /// Plaintext bytes of one bucket.
    pub fn bucket_bytes(&self) -> usize {
        self.z as usize * (SLOT_HEADER + self.block_size as usize)
    }

    /// Checks one request's arguments: the block is in range, a write is one block.
    pub fn validate(&self, block: BlockId, op: &Op) -> Result<()> {
        if block.0 >= self.blocks {
            return Err(OramError::BlockOutOfRange { block: block.0, blocks: self.blocks });
        }
        if let Op::Write(d) = op {
            if d.len() != self.block_size as usize {
                return Err(OramError::WrongBlockSize { got: d.len(), expected: self.block_size });
            }
        }
        Ok(())
    }

    /// Buckets on the path to `leaf`, root first.
    pub fn path(&self, leaf: Leaf) -> impl Iterator<Item = BucketId> {
        let shape = self.shape;
        (0..shape.levels()).map(move |l| shape.bucket_on_path(leaf, l))
    }

    /// Decodes a bucket's plaintext (the format of [`crate::PathOram`]: `Z` slots of
    /// `id + 1`, leaf and contents; empty slots are zeros).
    pub fn decode_bucket(&self, plain: &[u8]) -> Result<Vec<TaoBlock>> {
        let slot = SLOT_HEADER + self.block_size as usize;
        if plain.len() != self.bucket_bytes() {
            return Err(OramError::Corrupt(format!(
                "bucket of {} bytes, expected {}",
                plain.len(),
                self.bucket_bytes()
            )));
        }
        let leaves = self.shape.leaves();
        let mut out = Vec::new();
        for raw in plain.chunks_exact(slot) {
            let id1 = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
            if id1 == 0 {
                continue;
            }
            let leaf = u32::from_le_bytes(raw[8..12].try_into().expect("4 bytes"));
            if id1 > self.blocks || u64::from(leaf) >= leaves {
                return Err(OramError::Corrupt(format!(
                    "slot names block {} at leaf {leaf}",
                    id1 - 1
                )));
            }
            out.push(TaoBlock { id: id1 - 1, leaf, data: raw[SLOT_HEADER..].into() });
        }
        Ok(out)
    }

    /// A bucket's plaintext from at most `Z` blocks of the block size (the caller checks).
    pub fn encode_bucket<'a>(&self, blocks: impl Iterator<Item = (u64, u32, &'a [u8])>) -> Vec<u8> {
        encode_bucket(self.z, self.block_size, blocks)
    }

    /// As [`TaoSchemeConfig::encode_bucket`], appending the plaintext to `out`.
    pub fn encode_bucket_into<'a>(
        &self,
        blocks: impl Iterator<Item = (u64, u32, &'a [u8])>,
        out: &mut Vec<u8>,
    ) {
        encode_bucket_into(self.z, self.block_size, blocks, out);
    }
}

/// A bucket's plaintext in the format of [`crate::PathOram`]: `Z` slots of `id + 1`, leaf and
/// contents; empty slots are zeros. At most `z` blocks of `block_size` bytes (the caller checks).
pub fn encode_bucket<'a>(
    z: u32,
    block_size: u32,
    blocks: impl Iterator<Item = (u64, u32, &'a [u8])>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(z as usize * (SLOT_HEADER + block_size as usize));
    encode_bucket_into(z, block_size, blocks, &mut out);
    out
}

/// As [`encode_bucket`], appending the bucket's plaintext to `out` (after whatever it holds,
/// e.g. the room a sealer wants before the plaintext it seals in place): each byte written
/// once, none zeroed first but the empty slots.
pub fn encode_bucket_into<'a>(
    z: u32,
    block_size: u32,
    blocks: impl Iterator<Item = (u64, u32, &'a [u8])>,
    out: &mut Vec<u8>,
) {
    let slot = SLOT_HEADER + block_size as usize;
    let end = out.len() + z as usize * slot;
    out.reserve(end - out.len());
    for (id, leaf, data) in blocks.take(z as usize) {
        debug_assert_eq!(data.len(), block_size as usize, "a block of the block size");
        let at = out.len();
        out.extend_from_slice(&(id + 1).to_le_bytes());
        out.extend_from_slice(&leaf.to_le_bytes());
        out.extend_from_slice(&data[..data.len().min(block_size as usize)]);
        out.resize(at + slot, 0);
    }
    out.resize(end, 0);
}

/// Running statistics of a TaoStore engine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaoStats {
    /// Logical requests accepted.
    pub requests: u64,
    /// Paths fetched from the store (one per request).
    pub paths_fetched: u64,
    /// Requests that fetched a random path because a real read of their block was in flight.
    pub fake_reads: u64,
    /// Batches of `k` paths written back.
    pub write_backs: u64,
    /// Store writes issued by write-backs (fewer than batches when the writer fell behind
    /// and wrote several queued batches at once).
    pub write_requests: u64,
    /// Cells written by write-backs.
    pub cells_written: u64,
    /// Largest stash seen (blocks).
    pub max_stash: usize,
    /// Largest subtree seen (buckets).
    pub max_subtree: usize,
    /// Most requests in flight at once.
    pub max_in_flight: usize,
}

/// What one request reveals to the store, decided when it arrives: the leaf of the path it
/// reads, and the fresh leaf its block moves to. A durable driver logs these before the reads
/// are issued so that after a crash it can move the blocks to those fresh leaves instead of
/// bringing them back on leaves the store has seen ([`TaoScheme::replay_settle`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reveal {
    /// The block requested.
    pub block: u64,
    /// The leaf whose path the request reads (the block's old leaf, or a random one for a
    /// fake read).
    pub read: u32,
    /// The block's new leaf, never revealed before.
    pub new: u32,
}

/// A block in trusted memory: its id, leaf and contents (shared, so snapshots are cheap).
#[derive(Clone)]
pub struct TaoBlock {
    /// Logical address.
    pub id: u64,
    /// Its leaf.
    pub leaf: u32,
    /// Its contents.
    pub data: Arc<[u8]>,
}

impl fmt::Debug for TaoBlock {
    // Ids, leaves and contents are secrets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaoBlock").finish_non_exhaustive()
    }
}

/// Names one request from [`TaoScheme::start`] to its answer, in arrival order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub u64);

#[derive(Debug)]
enum Kind {
    Real(Op),
    Fake,
    Sweep,
}

/// A request in flight: the path it reads. Hand it back to [`TaoScheme::arrive`] with the
/// path's buckets.
#[derive(Debug)]
pub struct TaoRequest {
    ticket: Ticket,
    block: u64,
    leaf: Leaf,
    kind: Kind,
    reveal: Reveal,
}

impl TaoRequest {
    /// Its place in arrival order.
    pub fn ticket(&self) -> Ticket {
        self.ticket
    }
    /// The leaf of the path it reads: all the store learns of it.
    pub fn leaf(&self) -> Leaf {
        self.leaf
    }
    /// The block requested (secret; meaningless for a sweep).
    pub fn block(&self) -> BlockId {
        BlockId(self.block)
    }
    /// What it reveals, for a durable driver's log.
    pub fn reveal(&self) -> Reveal {
        self.reveal
    }
    /// A real read: other requests of the block wait for it ([`TaoScheme::abandon`]).
    pub fn is_real(&self) -> bool {
        matches!(self.kind, Kind::Real(_))
    }
    /// A step of a sweep ([`TaoScheme::start_sweep`]): answers nobody.
    pub fn is_sweep(&self) -> bool {
        matches!(self.kind, Kind::Sweep)
    }
    /// A fake read: answered by the real one ([`Arrived::answered`]), not by its own arrival.
    pub fn is_fake(&self) -> bool {
        matches!(self.kind, Kind::Fake)
    }
}

/// What [`TaoScheme::arrive`] decided.
#[derive(Debug)]
pub struct Arrived {
    /// The request's answer, the block before it (empty for a sweep); `None` for a fake read,
    /// answered through [`Arrived::answered`] of the real one.
    pub answer: Option<Vec<u8>>,
    /// Answers of the fake reads that waited for this real one, in arrival order.
    pub answered: Vec<(Ticket, Vec<u8>)>,
    /// The paths of the batch this arrival closed, to write back (in order with earlier ones).
    pub closed: Option<Vec<Leaf>>,
    /// The stash or the subtree went past its bound (the request took effect anyway).
    pub over: Option<String>,
}

/// The contents of a write-back, from [`TaoScheme::snapshot`].
#[derive(Debug)]
pub struct WriteBack {
    /// Buckets to write with their current blocks, in bucket order.
    pub buckets: Vec<(BucketId, Vec<TaoBlock>)>,
    /// Resident buckets left out because the store below holds them as they are.
    pub unchanged: u64,
    /// The buckets of `buckets`, kept for [`TaoScheme::written`] when the driver takes those.
    ids: Vec<u64>,
    clock: u64,
}

/// A bucket held in the subtree.
#[derive(Debug)]
struct Node {
    blocks: Vec<TaoBlock>,
    /// Value of the modification clock when this bucket last changed.
    modified: u64,
    /// Value of the clock at which the store's copy last held these contents (when the bucket
    /// was fetched, or the write-back snapshot that wrote it): contents unchanged since iff
    /// `modified <= saved`.
    saved: u64,
}

impl Node {
    /// The ids of the blocks it holds, sorted.
    fn block_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.blocks.iter().map(|e| e.id).collect();
        ids.sort_unstable();
        ids
    }
}

/// TaoStore's processor: position map, stash, subtree, pins and the batching of write-backs.
/// See the module docs.
pub struct TaoScheme {
    config: TaoSchemeConfig,
    posmap: Vec<u32>,
    stash: HashMap<u64, TaoBlock>,
    subtree: HashMap<u64, Node>,
    /// Requested paths not yet written back that cover each bucket.
    pins: HashMap<u64, u32>,
    /// Blocks with a real read in flight, with the fake reads that arrived for them since.
    pending: HashMap<u64, Vec<(Ticket, Op)>>,
    /// Paths arrived since the last batch closed.
    batch: Vec<Leaf>,
    clock: u64,
    next_ticket: u64,
    /// Buckets `0 .. resident` stay in the subtree once fetched; see
    /// [`TaoScheme::keep_top_resident`].
    resident: u64,
    /// Resident buckets now in the subtree (not counted against the subtree bound).
    resident_held: usize,
    /// Resident buckets that entered the subtree since [`TaoScheme::take_newly_open`].
    newly_open: Vec<BucketId>,
    rng: ChaCha20Rng,
    stats: TaoStats,
}

impl fmt::Debug for TaoScheme {
    // Leaves and block ids are secrets: print only public parameters.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaoScheme").field("config", &self.config).finish_non_exhaustive()
    }
}

impl TaoScheme {
    /// A scheme with position map `posmap` (leaf + 1 per block, 0 if never assigned) and
    /// `stash` (id, leaf, contents), drawing leaves from `rng`.
    pub fn new(
        config: TaoSchemeConfig,
        posmap: Vec<u32>,
        stash: Vec<(u64, u32, Vec<u8>)>,
        stats: TaoStats,
        rng: ChaCha20Rng,
    ) -> Result<Self> {
        let bad = |m: &str| Err(OramError::InvalidConfig(m.into()));
        if posmap.len() as u64 != config.blocks {
            return bad("position map size does not match the configuration");
        }
        let leaves = config.shape.leaves();
        let mut map = HashMap::with_capacity(stash.len());
        for (id, leaf, data) in stash {
            if id >= config.blocks
                || u64::from(leaf) >= leaves
                || data.len() != config.block_size as usize
            {
                return bad("stash entry out of range");
            }
            map.insert(id, TaoBlock { id, leaf, data: data.into() });
        }
        Ok(Self {
            config,
            posmap,
            stash: map,
            subtree: HashMap::new(),
            pins: HashMap::new(),
            pending: HashMap::new(),
            batch: Vec::new(),
            clock: 0,
            next_ticket: 0,
            resident: 0,
            resident_held: 0,
            newly_open: Vec::new(),
            rng,
            stats,
        })
    }

    /// The parameters.
    pub fn config(&self) -> &TaoSchemeConfig {
        &self.config
    }

    /// Checks one request's arguments ([`TaoSchemeConfig::validate`]).
    pub fn validate(&self, block: BlockId, op: &Op) -> Result<()> {
        self.config.validate(block, op)
    }

    fn random_leaf(&mut self) -> Leaf {
        Leaf(self.rng.gen_range(0..self.config.shape.leaves()))
    }

    fn ticket(&mut self) -> Ticket {
        self.next_ticket += 1;
        Ticket(self.next_ticket - 1)
    }

    fn pin(&mut self, leaf: Leaf) {
        let shape = self.config.shape;
        for l in 0..shape.levels() {
            *self.pins.entry(shape.bucket_on_path(leaf, l).0).or_insert(0) += 1;
        }
    }

    /// Arrival of a request: remaps the block and decides which path it reads (the block's
    /// old leaf, or a random one if a real read of the block is in flight). No I/O; the
    /// arguments must have passed [`TaoScheme::validate`].
    pub fn start(&mut self, block: BlockId, op: Op) -> TaoRequest {
        let id = block.0;
        let old = match self.posmap[id as usize] {
            0 => self.random_leaf(),
            v => Leaf(u64::from(v - 1)),
        };
        let fresh = self.random_leaf();
        self.posmap[id as usize] = fresh.0 as u32 + 1;
        let ticket = self.ticket();
        // A real read of this block in flight answers this request too (`None`); meanwhile it
        // reads a path that is as random as any other request's.
        let real = match self.pending.entry(id) {
            MapEntry::Occupied(mut waiting) => {
                waiting.get_mut().push((ticket, op));
                None
            }
            MapEntry::Vacant(v) => {
                v.insert(Vec::new());
                Some(op)
            }
        };
        let (leaf, kind) = match real {
            Some(op) => (old, Kind::Real(op)),
            None => {
                self.stats.fake_reads += 1;
                (self.random_leaf(), Kind::Fake)
            }
        };
        self.pin(leaf);
        self.stats.requests += 1;
        let reveal = Reveal { block: id, read: leaf.0 as u32, new: fresh.0 as u32 };
        TaoRequest { ticket, block: id, leaf, kind, reveal }
    }

    /// A step of a sweep: reads the public path to `leaf` and writes it back with the next
    /// write-back, remapping no block.
    pub fn start_sweep(&mut self, leaf: Leaf) -> Result<TaoRequest> {
        if leaf.0 >= self.config.shape.leaves() {
            return Err(OramError::Protocol(format!(
                "sweep path {} out of range (a sweep has {} paths)",
                leaf.0,
                self.config.shape.leaves()
            )));
        }
        let ticket = self.ticket();
        self.pin(leaf);
        let reveal = Reveal { block: u64::MAX, read: leaf.0 as u32, new: leaf.0 as u32 };
        Ok(TaoRequest { ticket, block: u64::MAX, leaf, kind: Kind::Sweep, reveal })
    }

    /// Of the path `buckets`, the positions the store must send: all but the resident buckets
    /// already held open (the store below keeps those in trusted memory).
    pub fn to_fetch(&self, buckets: &[BucketId]) -> Vec<usize> {
        (0..buckets.len())
            .filter(|&i| {
                !(self.is_resident(buckets[i]) && self.subtree.contains_key(&buckets[i].0))
            })
            .collect()
    }

    /// Of the path `buckets`, the positions whose fetched copies must be opened and given to
    /// [`TaoScheme::arrive`]: those not in the subtree (a copy there is as fresh or fresher).
    pub fn to_open(&self, buckets: &[BucketId]) -> Vec<usize> {
        (0..buckets.len()).filter(|&i| !self.subtree.contains_key(&buckets[i].0)).collect()
    }

    /// Puts fetched buckets into the subtree unless a copy is there already (another request
    /// brought it in meanwhile: its copy is as fresh or fresher).
    fn insert_fetched(&mut self, opened: Vec<(BucketId, Vec<TaoBlock>)>) {
        self.clock += 1;
        let clock = self.clock;
        for (b, blocks) in opened {
            if let MapEntry::Vacant(v) = self.subtree.entry(b.0) {
                v.insert(Node { blocks, modified: clock, saved: clock });
                if b.0 < self.resident {
                    self.resident_held += 1;
                    self.newly_open.push(b);
                }
            }
        }
        // Changes from now on are after the fetched copies.
        self.clock += 1;
    }

    /// The path of `request` arrived, with the buckets [`TaoScheme::to_open`] named, opened:
    /// merges them into the subtree, answers the request (and the fake reads waiting for it),
    /// evicts into the path and closes a batch every `k` arrivals.
    pub fn arrive(
        &mut self,
        request: TaoRequest,
        opened: Vec<(BucketId, Vec<TaoBlock>)>,
    ) -> Arrived {
        let TaoRequest { block, leaf, kind, .. } = request;
        self.insert_fetched(opened);
        let (answer, answered) = match kind {
            Kind::Real(op) => {
                let (mine, others) = self.answer(block, leaf, op);
                (Some(mine), others)
            }
            Kind::Fake => (None, Vec::new()),
            Kind::Sweep => (Some(Vec::new()), Vec::new()),
        };
        self.stats.paths_fetched += 1;
        self.evict(leaf);
        self.stats.max_stash = self.stats.max_stash.max(self.stash.len());
        self.stats.max_subtree = self.stats.max_subtree.max(self.held());
        self.batch.push(leaf);
        let closed = (self.batch.len() >= self.config.write_back_every)
            .then(|| std::mem::take(&mut self.batch));
        Arrived { answer, answered, closed, over: self.over() }
    }

    /// Which bound trusted memory is past, if any.
    fn over(&self) -> Option<String> {
        if self.stash.len() > self.config.stash_limit {
            Some(format!(
                "stash holds {} blocks, limit {}",
                self.stash.len(),
                self.config.stash_limit
            ))
        } else if self.held() > self.config.subtree_limit {
            Some(format!(
                "subtree holds {} buckets, limit {}",
                self.held(),
                self.config.subtree_limit
            ))
        } else {
            None
        }
    }

    /// The real read of `block` failed: the fake reads waiting for it will not be answered.
    /// Returns their tickets.
    pub fn abandon(&mut self, block: BlockId) -> Vec<Ticket> {
        self.pending.remove(&block.0).unwrap_or_default().into_iter().map(|(t, _)| t).collect()
    }

    /// Serves a real read: finds the block on its old path or in the stash, applies this
    /// request's operation and then those of the requests that arrived for it meanwhile, in
    /// arrival order, and gives it its newest leaf.
    fn answer(&mut self, block: u64, leaf: Leaf, op: Op) -> (Vec<u8>, Vec<(Ticket, Vec<u8>)>) {
        let mut found = self.stash.remove(&block);
        if found.is_none() {
            for b in self.config.path(leaf) {
                let node = self.subtree.get_mut(&b.0).expect("the whole path is in the subtree");
                if let Some(i) = node.blocks.iter().position(|e| e.id == block) {
                    found = Some(node.blocks.swap_remove(i));
                    node.modified = self.clock;
                    break;
                }
            }
        }
        let size = self.config.block_size as usize;
        let zeros = || -> Arc<[u8]> { vec![0u8; size].into() };
        let mut current: Option<Arc<[u8]>> = found.map(|e| e.data);
        let mut apply = |op: Op| -> Vec<u8> {
            let before = current.clone().unwrap_or_else(zeros).to_vec();
            if let Op::Write(data) = op {
                current = Some(data.into());
            }
            before
        };
        let mine = apply(op);
        let waiters = self.pending.remove(&block).unwrap_or_default();
        let others = waiters.into_iter().map(|(t, op)| (t, apply(op))).collect();
        if let Some(data) = current {
            let leaf = self.posmap[block as usize];
            debug_assert!(leaf > 0, "an accessed block has a leaf");
            self.stash.insert(block, TaoBlock { id: block, leaf: leaf - 1, data });
        }
        (mine, others)
    }

    /// Greedy eviction of the stash and the path to `leaf` into the path's buckets (all in the
    /// subtree), deepest first.
    fn evict(&mut self, leaf: Leaf) {
        let shape = self.config.shape;
        let z = self.config.z as usize;
        let levels = shape.levels() as usize;
        let mut by_depth: Vec<Vec<TaoBlock>> = vec![Vec::new(); levels];
        // Each bucket's blocks before, to tell which buckets this eviction changed (a block
        // is never changed in place, so the same ids mean the same contents).
        let mut before: Vec<Vec<u64>> = Vec::with_capacity(levels);
        for b in self.config.path(leaf) {
            let node = self.subtree.get_mut(&b.0).expect("the whole path is in the subtree");
            before.push(node.block_ids());
            for e in node.blocks.drain(..) {
                let d = shape.common_depth(leaf, Leaf(u64::from(e.leaf)));
                by_depth[d as usize].push(e);
            }
        }
        for (_, e) in self.stash.drain() {
            let d = shape.common_depth(leaf, Leaf(u64::from(e.leaf)));
            by_depth[d as usize].push(e);
        }
        let mut pool: Vec<TaoBlock> = Vec::new();
        for level in (0..levels).rev() {
            pool.append(&mut by_depth[level]);
            let b = shape.bucket_on_path(leaf, level as u32);
            let node = self.subtree.get_mut(&b.0).expect("the whole path is in the subtree");
            let take = pool.len().min(z);
            node.blocks.extend(pool.drain(pool.len() - take..));
            if node.block_ids() != before[level] {
                node.modified = self.clock;
            }
        }
        for e in pool {
            self.stash.insert(e.id, e);
        }
    }

    /// Closes the batch of paths arrived so far, if any (a flush writes back an incomplete
    /// batch too).
    pub fn close_batch(&mut self) -> Option<Vec<Leaf>> {
        (!self.batch.is_empty()).then(|| std::mem::take(&mut self.batch))
    }

    /// Whether paths have arrived since the last batch closed.
    pub fn batch_open(&self) -> bool {
        !self.batch.is_empty()
    }

    /// Starts a write-back of the closed batches' `paths`: the current contents of the union
    /// of their buckets, but for resident buckets the store below holds as they are. Every
    /// bucket is in the subtree (pinned). Changes from now on are after this snapshot.
    pub fn snapshot(&mut self, paths: &[Leaf]) -> WriteBack {
        let mut buckets: Vec<u64> =
            paths.iter().flat_map(|&l| self.config.path(l)).map(|b| b.0).collect();
        buckets.sort_unstable();
        buckets.dedup();
        let mut out = Vec::with_capacity(buckets.len());
        let mut unchanged = 0;
        for b in buckets {
            let node = self.subtree.get(&b);
            debug_assert!(node.is_some(), "pinned buckets stay in the subtree");
            if b < self.resident && node.is_some_and(|n| n.modified <= n.saved) {
                unchanged += 1;
                continue;
            }
            out.push((BucketId(b), node.map(|n| n.blocks.clone()).unwrap_or_default()));
        }
        let ids = out.iter().map(|(b, _)| b.0).collect();
        let clock = self.clock;
        self.clock += 1;
        WriteBack { buckets: out, unchanged, ids, clock }
    }

    /// The write-back of `paths` snapshotted as `wb` completed: unpins the paths and lets go
    /// of every bucket that is not resident, not pinned and unchanged since the snapshot.
    pub fn written(&mut self, paths: &[Leaf], wb: &WriteBack) {
        let clock = wb.clock;
        for &leaf in paths {
            for b in self.config.path(leaf) {
                if let MapEntry::Occupied(mut o) = self.pins.entry(b.0) {
                    *o.get_mut() -= 1;
                    if *o.get() == 0 {
                        o.remove();
                    }
                }
            }
        }
        for &b in &wb.ids {
            let resident = b < self.resident;
            let Some(node) = self.subtree.get_mut(&b) else { continue };
            node.saved = node.saved.max(clock);
            if !resident && !self.pins.contains_key(&b) && node.modified <= clock {
                self.subtree.remove(&b);
            }
        }
    }

    /// Before [`TaoScheme::replay_read`]: checks the reveals and that nothing has happened yet.
    pub fn replay_check(&self, reveals: &[Reveal]) -> Result<()> {
        let leaves = self.config.shape.leaves();
        if let Some(r) = reveals.iter().find(|r| {
            r.block >= self.config.blocks
                || u64::from(r.read) >= leaves
                || u64::from(r.new) >= leaves
        }) {
            return Err(OramError::Protocol(format!(
                "logged reveal names block {} or a leaf out of range",
                r.block
            )));
        }
        if !self.subtree.is_empty() || !self.batch.is_empty() || !self.pending.is_empty() {
            return Err(OramError::Protocol("replay needs a fresh, quiescent engine".into()));
        }
        Ok(())
    }

    /// After a crash, the next logged reveal's path is read again: pins it and returns its
    /// buckets. Feed them with [`TaoScheme::replay_arrive`].
    pub fn replay_read(&mut self, reveal: &Reveal) -> Vec<BucketId> {
        let leaf = Leaf(u64::from(reveal.read));
        self.pin(leaf);
        self.config.path(leaf).collect()
    }

    /// The buckets of a replayed path that [`TaoScheme::to_open`] named, opened.
    pub fn replay_arrive(&mut self, opened: Vec<(BucketId, Vec<TaoBlock>)>) {
        self.insert_fetched(opened);
        self.stats.paths_fetched += 1;
    }

    /// Once every replayed path arrived: moves every block named in `reveals` to its last
    /// logged new leaf, takes it out of the subtree and evicts along every replayed path, which
    /// then wait for the next write-back. Returns an error if the stash is past its bound.
    pub fn replay_settle(&mut self, reveals: &[Reveal]) -> Result<(), String> {
        // Last logged leaf wins: the reveals are in arrival order.
        let mut last: HashMap<u64, u32> = HashMap::new();
        for r in reveals {
            last.insert(r.block, r.new);
            self.posmap[r.block as usize] = r.new + 1;
        }
        // Take every such block out of the subtree into the stash, on its new leaf.
        for node in self.subtree.values_mut() {
            let mut i = 0;
            while i < node.blocks.len() {
                if last.contains_key(&node.blocks[i].id) {
                    let e = node.blocks.swap_remove(i);
                    node.modified = self.clock;
                    self.stash.insert(e.id, e);
                } else {
                    i += 1;
                }
            }
        }
        for (id, leaf) in &last {
            if let Some(e) = self.stash.get_mut(id) {
                e.leaf = *leaf;
            }
        }
        for r in reveals {
            let leaf = Leaf(u64::from(r.read));
            self.evict(leaf);
            self.batch.push(leaf);
        }
        self.stats.max_stash = self.stats.max_stash.max(self.stash.len());
        self.stats.max_subtree = self.stats.max_subtree.max(self.held());
        if self.stash.len() > self.config.stash_limit {
            return Err(format!(
                "stash holds {} blocks after replaying the reveal log, limit {}",
                self.stash.len(),
                self.config.stash_limit
            ));
        }
        Ok(())
    }

    /// Keeps the top `buckets` buckets of the tree (heap order) in the subtree, open, once
    /// they are fetched, and leaves one out of write-backs while it is unchanged since the
    /// store below last held it. Only for buckets the store below keeps in trusted memory.
    pub fn keep_top_resident(&mut self, buckets: u64) {
        self.resident = buckets.min(self.config.shape.buckets());
    }

    /// Whether bucket `b` is part of the resident tree top.
    pub fn is_resident(&self, b: BucketId) -> bool {
        b.0 < self.resident
    }

    /// The resident buckets that entered the subtree since the last call.
    pub fn take_newly_open(&mut self) -> Vec<BucketId> {
        std::mem::take(&mut self.newly_open)
    }

    /// The blocks of bucket `b`, if it is in the subtree.
    pub fn held_bucket(&self, b: BucketId) -> Option<&[TaoBlock]> {
        self.subtree.get(&b.0).map(|n| &n.blocks[..])
    }

    /// Every resident bucket in the subtree with its blocks, in no particular order.
    pub fn resident_buckets(&self) -> impl Iterator<Item = (BucketId, &[TaoBlock])> {
        self.subtree
            .iter()
            .filter(|(&b, _)| b < self.resident)
            .map(|(&b, n)| (BucketId(b), &n.blocks[..]))
    }

    /// Whether the subtree holds nothing but resident buckets, each as the store holds it:
    /// what every write-back having completed leaves.
    pub fn settled(&self) -> bool {
        self.subtree.iter().all(|(&b, n)| b < self.resident && n.modified <= n.saved)
    }

    /// Buckets in the subtree that count against the subtree bound (all but the resident top).
    pub fn held(&self) -> usize {
        self.subtree.len() - self.resident_held
    }

    /// Buckets in the subtree, resident ones included.
    pub fn subtree_buckets(&self) -> usize {
        self.subtree.len()
    }

    /// Blocks held in the subtree's buckets.
    pub fn subtree_blocks(&self) -> usize {
        self.subtree.values().map(|n| n.blocks.len()).sum()
    }

    /// Blocks in the stash.
    pub fn stash_len(&self) -> usize {
        self.stash.len()
    }

    /// Entries of the position map.
    pub fn posmap_len(&self) -> usize {
        self.posmap.len()
    }

    /// Statistics so far.
    pub fn stats(&self) -> &TaoStats {
        &self.stats
    }

    /// Statistics, for the driver's own counters (write requests, requests in flight).
    pub fn stats_mut(&mut self) -> &mut TaoStats {
        &mut self.stats
    }

    /// The position map and the stash sorted by id, for an export.
    #[allow(clippy::type_complexity)]
    pub fn export(&self) -> (Vec<u32>, Vec<(u64, u32, Vec<u8>)>) {
        let mut stash: Vec<_> =
            self.stash.values().map(|e| (e.id, e.leaf, e.data.to_vec())).collect();
        stash.sort_unstable_by_key(|e| e.0);
        (self.posmap.clone(), stash)
    }

    /// Blocks whose current path crosses one of the buckets `bad`, sorted; blocks in the
    /// stash are not among them.
    pub fn blocks_through(&self, bad: &[u64]) -> Vec<u64> {
        let bad: HashSet<u64> = bad.iter().copied().collect();
        let mut out: Vec<u64> = self
            .posmap
            .iter()
            .enumerate()
            .filter(|(id, &v)| {
                v > 0
                    && !self.stash.contains_key(&(*id as u64))
                    && self.config.path(Leaf(u64::from(v - 1))).any(|b| bad.contains(&b.0))
            })
            .map(|(id, _)| id as u64)
            .collect();
        out.sort_unstable();
        out
    }
}
