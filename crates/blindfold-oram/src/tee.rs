//! The gateway side of the TEE-assisted design (seed 004): an m-ary storage tree whose
//! retrieval and eviction a trusted component beside the store carries out, while the gateway
//! keeps the index and the blocks in flight.
//!
//! This module is the gateway's planner, a state machine without I/O or cryptography. It keeps
//! what the paper's client gateway keeps: the *index table* (for every block, its leaf and where
//! it is), an *index block* for every node of the tree (what each slot holds and whether it was
//! read since the node was last written), and the ring of blocks waiting to go back to the
//! tree. A driver (`blindfold-proxy`) turns its plans into sealed requests to the store's
//! trusted component.
//!
//! # The tree
//!
//! Layer 0 is the root, layer `L-1` the leaves; a node of layer `i` has `m` children, so layer
//! `i` has `m^i` nodes. Non-leaf nodes have `Z1` slots, leaves `Z0`. Every block has a leaf,
//! drawn uniformly when the block is written to the tree, and lives in one node on the path from
//! the root to that leaf. Each node has **two areas** of cells in the store: evictions read the
//! current area and write the other one, so queries can keep reading a node while an eviction
//! rewrites it, and a crash half-way through an eviction leaves the current area whole.
//!
//! # Query
//!
//! A query reads exactly one slot of every node on one path: the path of the block's leaf if
//! the block is in the tree, a uniformly random path otherwise (the block is in the gateway,
//! or was never written). In the node that holds the block, its slot; in every other node a
//! uniformly random slot that holds no live block and was not read since the node was last
//! written. The trusted component selects the wanted slot among them without showing which.
//! A block read from the tree moves to the gateway's ring; its copy in the tree is stale.
//!
//! Every node keeps at least `D` slots without a live block, and after `D` reads it is
//! *reshuffled* (re-permuted into its other area) before it is read again. The number of reads
//! of a node is public, so the reshuffle is a public event; it does not depend on how many live
//! blocks the node holds.
//!
//! # Eviction
//!
//! After every `k` queries (the paper's `q`) a round starts: `c` blocks (`c ≥ k`, by default
//! `2k`) go up from the ring — the oldest waiting blocks with fresh leaves, padded with dummies
//! — and travel down the next path in reverse-lexicographic order. At layer `i` the trusted
//! component permutes the node's `Z` slots together with the `c` incoming blocks (the
//! permutation is the gateway's, sealed): the first `Z` go back to the node, the last `c` go on
//! to layer `i+1`; what is left after the leaf is dropped. The gateway chooses the permutation
//! so that a live block goes on down only if its leaf is under the next node of the path, at
//! most `c` of them; every other live block stays.
//!
//! `c = 2k` rather than the paper's `c = k`: a node's share of blocks for the child on the
//! eviction path then arrives at half the rate it can leave, so the backlog in a node stays
//! small. With `c = k` the queue is critically loaded and its length is a random walk.
//!
//! # Security
//!
//! What the store sees: per query, one cell of each node of a path that is uniformly random
//! and independent of earlier queries (each slot of a node at most once between two writes of
//! the node, and which slots are live is hidden by the uniformly random permutation of the
//! node's last write); per round, the nodes of the next path of a fixed order; reshuffles of
//! nodes after a public number of reads. A node that would have to keep more live blocks than
//! its slots allow (`Z - D`) stops the round with [`OramError::Overflow`]; the defaults make
//! this improbable.

use std::collections::{HashMap, VecDeque};

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::{BlockId, OramError, Result};

/// The tag of a dummy slot's content.
pub const DUMMY: u64 = u64::MAX;

/// The largest number of blocks the trusted component permutes at once (one 4 KiB page holds
/// one nibble of 8,192 blocks' 32-byte vectors).
pub const MAX_PERMUTED: usize = 8192;

/// Queries per round unless told otherwise (`k`). The paper used 800; 450 is the largest
/// whose layers of a million blocks permute at most 4,096 blocks at once, which the trusted
/// component lays out a byte per page instead of a nibble (5.2 against 6.7 µs per block of
/// 1 KiB on one core). Measured on 1 GiB of 1 KiB blocks (`blindfold bench tee --round-queries`): 5.1–5.3
/// MB/s against 4.4–4.8 MB/s with 800, and a store a sixth smaller.
pub const DEFAULT_ROUND_QUERIES: u32 = 450;

/// What a slot holds, as the gateway knows it: which block (or [`DUMMY`]) and the serial its
/// cell was sealed with. The driver binds the cell's seal to exactly this pair, so a slot that
/// the store rolled back, swapped or altered does not open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SlotTag {
    /// The block, or [`DUMMY`].
    pub block: u64,
    /// A serial number unique to this sealing (a counter of the gateway's).
    pub serial: u64,
}

/// Parameters of the tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeeOramConfig {
    blocks: u64,
    block_size: u32,
    arity: u32,
    layers: u32,
    round_queries: u32,
    round_blocks: u32,
    node_slots: u32,
    leaf_slots: u32,
    dummy_reads: u32,
}

/// Builds a [`TeeOramConfig`]; unset parameters get defaults derived from the others.
#[derive(Clone, Debug)]
pub struct TeeOramConfigBuilder {
    blocks: u64,
    block_size: u32,
    arity: u32,
    layers: Option<u32>,
    round_queries: u32,
    round_blocks: Option<u32>,
    node_slots: Option<u32>,
    leaf_slots: Option<u32>,
    dummy_reads: Option<u32>,
}

impl TeeOramConfig {
    /// A builder for `blocks` blocks of `block_size` bytes: arity 8, rounds of
    /// [`DEFAULT_ROUND_QUERIES`] queries.
    pub fn builder(blocks: u64, block_size: u32) -> TeeOramConfigBuilder {
        TeeOramConfigBuilder {
            blocks,
            block_size,
            arity: 8,
            layers: None,
            round_queries: DEFAULT_ROUND_QUERIES,
            round_blocks: None,
            node_slots: None,
            leaf_slots: None,
            dummy_reads: None,
        }
    }

    /// Logical blocks.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }
    /// Bytes per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }
    /// Children per node (`m`).
    pub fn arity(&self) -> u32 {
        self.arity
    }
    /// Layers of the tree (`L`), root and leaves included.
    pub fn layers(&self) -> u32 {
        self.layers
    }
    /// Queries between two rounds (`k`, the paper's `q`).
    pub fn round_queries(&self) -> u32 {
        self.round_queries
    }
    /// Blocks that go up per round and travel down the path (`c`).
    pub fn round_blocks(&self) -> u32 {
        self.round_blocks
    }
    /// Slots of a non-leaf node (`Z1`).
    pub fn node_slots(&self) -> u32 {
        self.node_slots
    }
    /// Slots of a leaf (`Z0`).
    pub fn leaf_slots(&self) -> u32 {
        self.leaf_slots
    }
    /// Reads of a node between two writes of it (`D`); also the slots kept free of live blocks.
    pub fn dummy_reads(&self) -> u32 {
        self.dummy_reads
    }
    /// Leaves (`m^(L-1)`).
    pub fn leaves(&self) -> u64 {
        u64::from(self.arity).pow(self.layers - 1)
    }
    /// Nodes of all layers.
    pub fn nodes(&self) -> u64 {
        (0..self.layers).map(|i| u64::from(self.arity).pow(i)).sum()
    }
    /// Slots of a node of `layer`.
    pub fn slots_at(&self, layer: u32) -> u32 {
        if layer + 1 == self.layers {
            self.leaf_slots
        } else {
            self.node_slots
        }
    }
    /// Cells in the store: two areas of every node.
    pub fn total_cells(&self) -> u64 {
        2 * (0..self.layers)
            .map(|i| u64::from(self.arity).pow(i) * u64::from(self.slots_at(i)))
            .sum::<u64>()
    }
}

fn ceil_sqrt(x: f64) -> u32 {
    x.sqrt().ceil() as u32
}

impl TeeOramConfigBuilder {
    /// Children per node (`m`, at least 2).
    pub fn arity(mut self, m: u32) -> Self {
        self.arity = m;
        self
    }
    /// Layers (`L`, at least 2); by default the fewest that keep a leaf's expected load at
    /// most `5k` blocks.
    pub fn layers(mut self, l: u32) -> Self {
        self.layers = Some(l);
        self
    }
    /// Queries between two rounds (`k`).
    pub fn round_queries(mut self, k: u32) -> Self {
        self.round_queries = k;
        self
    }
    /// Blocks per round (`c ≥ k`; default `2k`).
    pub fn round_blocks(mut self, c: u32) -> Self {
        self.round_blocks = Some(c);
        self
    }
    /// Slots of a non-leaf node (`Z1`).
    pub fn node_slots(mut self, z: u32) -> Self {
        self.node_slots = Some(z);
        self
    }
    /// Slots of a leaf (`Z0`).
    pub fn leaf_slots(mut self, z: u32) -> Self {
        self.leaf_slots = Some(z);
        self
    }
    /// Reads of a node between writes (`D`).
    pub fn dummy_reads(mut self, d: u32) -> Self {
        self.dummy_reads = Some(d);
        self
    }

    /// Checks and completes the parameters.
    ///
    /// Defaults: `D = k + 6√k + 4` (reads of a node between its evictions are about
    /// Poisson(k): a node of layer `i` is evicted every `m^i` rounds and lies on the path of
    /// one query in `m^i`); `Z1 = k(m+1)/2 + 8√(km) + D` (a node holds, for each child, the
    /// blocks that arrived since the eviction path last went through that child: about
    /// `k(m-1)/2` in all); `Z0 = μ + 7√μ + 8 + D` with `μ = N / leaves`.
    pub fn build(self) -> Result<TeeOramConfig> {
        let bad = |why: String| Err(OramError::InvalidConfig(why));
        if self.blocks == 0 || self.block_size == 0 {
            return bad("the tree needs at least one block of at least one byte".into());
        }
        if self.arity < 2 || self.arity > 64 {
            return bad(format!("arity {} is not in 2..=64", self.arity));
        }
        let k = self.round_queries;
        if k == 0 {
            return bad("a round needs at least one query".into());
        }
        let c = self.round_blocks.unwrap_or(2 * k);
        if c < k {
            return bad(format!("{c} blocks per round cannot take back the blocks of {k} queries"));
        }
        let m = u64::from(self.arity);
        let layers = match self.layers {
            Some(l) => l,
            None => {
                let mut l = 2u32;
                // A leaf is evicted with every round that reaches it, like the nodes above
                // it: a load of a few `k` keeps its share of a round's work near theirs.
                while self.blocks.div_ceil(m.pow(l - 1)) > 5 * u64::from(k) && l < 12 {
                    l += 1;
                }
                l
            }
        };
        if !(2..=16).contains(&layers) || m.checked_pow(layers - 1).is_none_or(|x| x > 1 << 32) {
            return bad(format!("{layers} layers of arity {m} is not a usable tree"));
        }
        let d = self.dummy_reads.unwrap_or(k + ceil_sqrt(36.0 * f64::from(k)) + 4);
        if d == 0 {
            return bad("a node must allow at least one read".into());
        }
        let kf = f64::from(k);
        let mf = m as f64;
        let node_slots = self.node_slots.unwrap_or_else(|| {
            (kf * (mf + 1.0) / 2.0).ceil() as u32 + ceil_sqrt(64.0 * kf * mf) + d
        });
        let leaves = m.pow(layers - 1);
        let mu = self.blocks as f64 / leaves as f64;
        let leaf_slots =
            self.leaf_slots.unwrap_or_else(|| (mu + 7.0 * mu.sqrt()).ceil() as u32 + 8 + d);
        for (what, z) in [("a node", node_slots), ("a leaf", leaf_slots)] {
            if z <= d {
                return bad(format!("{what} of {z} slots cannot keep {d} slots free for reads"));
            }
            if (z as usize) + (c as usize) > MAX_PERMUTED {
                return bad(format!(
                    "{what} of {z} slots plus {c} blocks per round is more than the {MAX_PERMUTED} \
                     blocks the trusted component permutes at once; use fewer queries per \
                     round or more layers"
                ));
            }
        }
        let config = TeeOramConfig {
            blocks: self.blocks,
            block_size: self.block_size,
            arity: self.arity,
            layers,
            round_queries: k,
            round_blocks: c,
            node_slots,
            leaf_slots,
            dummy_reads: d,
        };
        if (leaf_slots - d) as u64 * leaves < self.blocks {
            return bad(format!(
                "{leaves} leaves of {} usable slots cannot hold {} blocks",
                leaf_slots - d,
                self.blocks
            ));
        }
        Ok(config)
    }
}

/// Where a block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Place {
    /// Never written: reads as zeros.
    Nowhere,
    /// In the tree, live in `slot` of `node` (current area).
    Tree { node: u32, slot: u32 },
    /// In the gateway's ring (its data is there).
    Ring,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Slot {
    tag: SlotTag,
    live: bool,
    read: bool,
}

#[derive(Clone, Debug)]
struct Node {
    /// Which of the two areas is current.
    area: u8,
    slots: Vec<Slot>,
    /// Slots without a live block, unread since the node was last written.
    free: Vec<u32>,
    /// Reads since the node was last written.
    reads: u32,
}

impl Node {
    fn new(area: u8, slots: Vec<Slot>) -> Self {
        let free = slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.live && !s.read)
            .map(|(i, _)| i as u32)
            .collect();
        Self { area, slots, free, reads: 0 }
    }
}

/// One node's new contents, applied when its eviction completes.
#[derive(Clone, Debug)]
struct NewNode {
    node: u32,
    slots: Vec<Slot>,
}

#[derive(Debug)]
struct InFlight {
    nodes: Vec<NewNode>,
    /// Blocks of the round's upload, with their data, served from here until it completes.
    replicas: HashMap<u64, Vec<u8>>,
    /// Where each live block will be when the round completes: (index in `nodes`, slot).
    lands: HashMap<u64, (usize, u32)>,
    /// Blocks read (or rewritten) by queries while the round ran: stale in `nodes`.
    stale: Vec<u64>,
    reshuffle: bool,
}

/// A path chosen for a query that had to wait for a reshuffle or a round: the query keeps it
/// (a fresh draw after the wait would tell a hiding query from a real one).
#[derive(Debug)]
struct Kept {
    leaf: u32,
    real: bool,
    /// A hiding query's copy of the block's data (the round that lands during the wait may
    /// take it from the ring into the tree).
    data: Option<Vec<u8>>,
}

/// One query's plan: read one cell per layer; the trusted component returns cell `target`
/// (whose content is `expected`), after checking that every cell holds what `tags` says.
#[derive(Clone, Debug)]
pub struct QueryPlan {
    /// The cells, root first.
    pub cells: Vec<blindfold_store::CellId>,
    /// What each of them holds, in the same order: the driver binds the query to exactly
    /// these contents, so the store cannot hand the trusted component other cells.
    pub tags: Vec<SlotTag>,
    /// Which of them the trusted component must return.
    pub target: u32,
    /// What that cell holds (`tags[target]`).
    pub expected: SlotTag,
    /// Whether the block comes from the store (false: it is in the gateway or never written,
    /// and the query only hides that).
    pub real: bool,
    /// For a query that only hides: the block's data as it was when the query began, to pass
    /// to [`TeeOram::finish_query`] (`None`: the planner has it).
    pub data: Option<Vec<u8>>,
}

/// What to do before a query can be planned.
#[derive(Debug)]
pub enum QueryStep {
    /// Read these cells.
    Query(QueryPlan),
    /// Run this reshuffle of exhausted nodes first, call [`TeeOram::finish_round`], then plan
    /// the query again (the same path is kept).
    Reshuffle(RoundPlan),
    /// A node of the path is exhausted and an eviction in flight is rewriting it: finish that
    /// round first, then plan the query again.
    Wait,
}

/// A cell the driver seals for upload.
#[derive(Clone, Debug)]
pub struct Upload {
    /// What it holds.
    pub tag: SlotTag,
    /// Its data (zeros for a dummy).
    pub data: Vec<u8>,
}

/// One layer of a round: read `read` (current area), permute with `perm` together with the
/// blocks coming down, write the first `write.len()` to `write` (the other area).
#[derive(Clone, Debug)]
pub struct LayerPlan {
    /// The node.
    pub node: u32,
    /// Cells read, in slot order.
    pub read: Vec<blindfold_store::CellId>,
    /// Cells written, in slot order.
    pub write: Vec<blindfold_store::CellId>,
    /// Position `j` of (node's slots ++ incoming) goes to position `perm[j]`.
    pub perm: Vec<u32>,
}

/// An eviction round or a reshuffle.
#[derive(Clone, Debug)]
pub struct RoundPlan {
    /// Round number (strictly increasing, reshuffles included).
    pub round: u64,
    /// Cells that go up with the round, in order (empty for a reshuffle).
    pub incoming: Vec<Upload>,
    /// The layers, root first (for a reshuffle: each exhausted node, carrying nothing).
    pub layers: Vec<LayerPlan>,
    /// The fresh leaf of every block that goes up (secret: log it only sealed).
    pub leaves: Vec<(u64, u32)>,
}

impl RoundPlan {
    /// What a redo log must keep of this round to apply it again after a crash
    /// ([`TeeOram::replay_round`]): everything but the cells' data.
    pub fn record(&self) -> RoundRecord {
        RoundRecord {
            round: self.round,
            incoming: self.incoming.iter().map(|u| u.tag).collect(),
            layers: self.layers.iter().map(|l| (l.node, l.perm.clone())).collect(),
            leaves: self.leaves.clone(),
        }
    }
}

/// A round as the redo log keeps it (see [`RoundPlan::record`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoundRecord {
    /// Round number.
    pub round: u64,
    /// Tags of the cells that went up (empty for a reshuffle).
    pub incoming: Vec<SlotTag>,
    /// Each layer's node and permutation.
    pub layers: Vec<(u32, Vec<u32>)>,
    /// Fresh leaves of the blocks that went up.
    pub leaves: Vec<(u64, u32)>,
}

/// The planner's whole state, for a checkpoint (taken with nothing in flight).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TeeOramState {
    config: TeeOramConfig,
    leaf: Vec<u32>,
    place: Vec<Place>,
    nodes: Vec<(u8, Vec<Slot>, u32)>,
    waiting: Vec<u64>,
    ring: Vec<(u64, Vec<u8>)>,
    serial: u64,
    round: u64,
    evictions: u64,
    /// Queries since the last round (the public schedule goes on across restarts).
    #[serde(default)]
    queries_since_round: u32,
    stats: TeeOramStats,
}

impl TeeOramState {
    /// The parameters of the saved tree.
    pub fn config(&self) -> &TeeOramConfig {
        &self.config
    }
}

/// A completed query: the block's data before the query, and whether the ring changed (the
/// block's data there is new to the redo log).
#[derive(Clone, Debug)]
pub struct Finished {
    /// The block as it was.
    pub data: Vec<u8>,
    /// Whether the ring now holds data the redo log has not seen.
    pub ring_changed: bool,
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeeOramStats {
    /// Queries planned.
    pub queries: u64,
    /// Queries that read a block from the store.
    pub real_queries: u64,
    /// Eviction rounds planned.
    pub rounds: u64,
    /// Reshuffles planned.
    pub reshuffles: u64,
    /// Most blocks ever waiting in the ring.
    pub max_waiting: usize,
    /// Most live blocks ever kept by a non-leaf node.
    pub max_node_live: u32,
    /// Most live blocks ever kept by a leaf.
    pub max_leaf_live: u32,
}

/// The gateway's planner of the TEE-assisted tree. See the [module docs](self).
#[derive(Debug)]
pub struct TeeOram {
    config: TeeOramConfig,
    rng: ChaCha20Rng,
    /// Leaf of every block (valid while it is in the tree).
    leaf: Vec<u32>,
    place: Vec<Place>,
    nodes: Vec<Node>,
    /// First cell of every node's area 0; area 1 follows it.
    node_base: Vec<u64>,
    /// First node of every layer.
    layer_start: Vec<u32>,
    /// The ring: blocks waiting to go up, oldest first, and their data.
    waiting: VecDeque<u64>,
    ring: HashMap<u64, Vec<u8>>,
    in_flight: Option<InFlight>,
    /// A path chosen for a query that had to wait: (block, leaf).
    /// Paths kept by queries that wait (one per block: a driver runs one query of a block at
    /// a time).
    kept: HashMap<u64, Kept>,
    serial: u64,
    round: u64,
    evictions: u64,
    queries_since_round: u32,
    stats: TeeOramStats,
}

impl TeeOram {
    /// An empty tree (every block reads as zeros): every cell holds a dummy, sealed by the
    /// driver from [`TeeOram::initial_cells`].
    pub fn new(config: TeeOramConfig) -> Self {
        Self::with_rng(config, ChaCha20Rng::from_entropy())
    }

    /// An empty tree of `old`'s configuration whose every node's current area is the one
    /// `old` does not use: a re-keying in place writes the new tree where `old` keeps nothing
    /// live, so `old` stays whole until the new tree's checkpoint replaces it.
    pub fn new_beside(old: &TeeOram) -> Self {
        let mut t = Self::new(old.config.clone());
        for (node, was) in t.nodes.iter_mut().zip(&old.nodes) {
            let slots = std::mem::take(&mut node.slots);
            *node = Node::new(1 - was.area, slots);
        }
        t
    }

    /// As [`TeeOram::new`] with a seeded generator (tests and benchmarks).
    pub fn with_seed(config: TeeOramConfig, seed: u64) -> Self {
        Self::with_rng(config, ChaCha20Rng::seed_from_u64(seed))
    }

    fn with_rng(config: TeeOramConfig, rng: ChaCha20Rng) -> Self {
        let m = config.arity;
        let mut layer_start = Vec::new();
        let mut nodes = Vec::new();
        let mut node_base = Vec::new();
        let mut cell = 0u64;
        let mut serial = 0u64;
        for layer in 0..config.layers {
            layer_start.push(nodes.len() as u32);
            let z = config.slots_at(layer);
            for _ in 0..m.pow(layer) {
                node_base.push(cell);
                cell += 2 * u64::from(z);
                let slots = (0..z)
                    .map(|_| {
                        serial += 1;
                        Slot { tag: SlotTag { block: DUMMY, serial }, live: false, read: false }
                    })
                    .collect();
                nodes.push(Node::new(0, slots));
            }
        }
        let n = config.blocks as usize;
        Self {
            rng,
            leaf: vec![0; n],
            place: vec![Place::Nowhere; n],
            nodes,
            node_base,
            layer_start,
            waiting: VecDeque::new(),
            ring: HashMap::new(),
            in_flight: None,
            kept: HashMap::new(),
            serial,
            round: 0,
            evictions: 0,
            queries_since_round: 0,
            stats: TeeOramStats::default(),
            config,
        }
    }

    /// The parameters.
    pub fn config(&self) -> &TeeOramConfig {
        &self.config
    }

    /// Counters.
    pub fn stats(&self) -> TeeOramStats {
        self.stats
    }

    /// Blocks waiting in the gateway's ring for a round.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Whether a round (or reshuffle) is in flight.
    pub fn in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Bytes of trusted state (index table, index blocks, ring), roughly.
    pub fn trusted_bytes(&self) -> u64 {
        let slots: u64 = self.nodes.iter().map(|n| n.slots.len() as u64).sum();
        let ring: u64 = self.ring.values().map(|d| d.len() as u64 + 16).sum();
        let flight: u64 = self
            .in_flight
            .as_ref()
            .map_or(0, |f| f.replicas.values().map(|d| d.len() as u64 + 8).sum());
        self.leaf.len() as u64 * 16 + slots * std::mem::size_of::<Slot>() as u64 + ring + flight
    }

    fn cell(&self, node: u32, area: u8, slot: u32) -> blindfold_store::CellId {
        let z = self.nodes[node as usize].slots.len() as u64;
        blindfold_store::CellId(
            self.node_base[node as usize] + u64::from(area) * z + u64::from(slot),
        )
    }

    fn layer_of(&self, node: u32) -> u32 {
        self.layer_start.partition_point(|&s| s <= node) as u32 - 1
    }

    /// The node of `layer` on the path to `leaf`.
    fn node_on_path(&self, leaf: u32, layer: u32) -> u32 {
        let below = u64::from(self.config.arity).pow(self.config.layers - 1 - layer);
        self.layer_start[layer as usize] + (u64::from(leaf) / below) as u32
    }

    /// Every cell of the current areas with what it holds: what the driver seals once when it
    /// creates the store (the other areas are written by evictions before they are read).
    pub fn initial_cells(&self) -> impl Iterator<Item = (blindfold_store::CellId, SlotTag)> + '_ {
        self.nodes.iter().enumerate().flat_map(move |(n, node)| {
            node.slots
                .iter()
                .enumerate()
                .map(move |(s, slot)| (self.cell(n as u32, node.area, s as u32), slot.tag))
        })
    }

    /// Places blocks `0..count` straight into their leaves, at fresh random leaves, before the
    /// first query (a bulk load: the driver then seals [`TeeOram::initial_cells`], with each
    /// block's data where the tag names a block). Fails if a leaf would keep fewer than `D`
    /// free slots.
    pub fn bulk_place(&mut self, count: u64) -> Result<()> {
        if count > self.config.blocks {
            return Err(OramError::BlockOutOfRange { block: count, blocks: self.config.blocks });
        }
        self.bulk_place_blocks(0..count)
    }

    /// As [`TeeOram::bulk_place`] for the blocks `blocks` (each at most once, in any order):
    /// a rebuild places exactly the blocks it found. The others read as zeros.
    pub fn bulk_place_blocks(&mut self, blocks: impl IntoIterator<Item = u64>) -> Result<()> {
        if self.stats.queries > 0 || self.place.iter().any(|p| *p != Place::Nowhere) {
            return Err(OramError::Protocol("a bulk load needs a fresh tree".into()));
        }
        let leaves = self.config.leaves() as u32;
        let last = self.config.layers - 1;
        let mut fill = vec![0u32; leaves as usize];
        let limit = self.config.leaf_slots - self.config.dummy_reads;
        for b in blocks {
            if b >= self.config.blocks {
                return Err(OramError::BlockOutOfRange { block: b, blocks: self.config.blocks });
            }
            if self.place[b as usize] != Place::Nowhere {
                return Err(OramError::Protocol(format!("block {b} bulk-loaded twice")));
            }
            let leaf = self.rng.gen_range(0..leaves);
            let node = self.node_on_path(leaf, last);
            let used = &mut fill[leaf as usize];
            if *used >= limit {
                return Err(OramError::Overflow {
                    bucket: u64::from(node),
                    blocks: *used as usize + 1,
                    slots: limit as usize,
                });
            }
            let slot = *used;
            *used += 1;
            self.serial += 1;
            self.nodes[node as usize].slots[slot as usize] =
                Slot { tag: SlotTag { block: b, serial: self.serial }, live: true, read: false };
            self.leaf[b as usize] = leaf;
            self.place[b as usize] = Place::Tree { node, slot };
        }
        // Hide which slots the loaded blocks took.
        for n in self.layer_start[last as usize]..self.nodes.len() as u32 {
            let node = &mut self.nodes[n as usize];
            node.slots.shuffle(&mut self.rng);
            *node = Node::new(node.area, std::mem::take(&mut node.slots));
            let node = &self.nodes[n as usize];
            for (s, slot) in node.slots.iter().enumerate() {
                if slot.live {
                    self.place[slot.tag.block as usize] = Place::Tree { node: n, slot: s as u32 };
                }
            }
            self.stats.max_leaf_live =
                self.stats.max_leaf_live.max(fill[(n - self.layer_start[last as usize]) as usize]);
        }
        Ok(())
    }

    fn check_block(&self, block: BlockId) -> Result<usize> {
        if block.0 >= self.config.blocks {
            return Err(OramError::BlockOutOfRange { block: block.0, blocks: self.config.blocks });
        }
        Ok(block.0 as usize)
    }

    /// Plans a query of `block`. See [`QueryStep`]. After a [`QueryStep::Query`], call
    /// [`TeeOram::finish_query`] with the block's data when the answer arrives (any data for
    /// a query that was not `real`).
    pub fn plan_query(&mut self, block: BlockId) -> Result<QueryStep> {
        let b = self.check_block(block)?;
        let (real, leaf, kept_data) = match self.kept.remove(&(b as u64)) {
            Some(k) => (k.real, k.leaf, k.data),
            None => match self.place[b] {
                Place::Tree { .. } => (true, self.leaf[b], None),
                _ => (false, self.rng.gen_range(0..self.config.leaves() as u32), None),
            },
        };
        // Exhausted nodes on the path must be rewritten before they are read again.
        let path: Vec<u32> = (0..self.config.layers).map(|i| self.node_on_path(leaf, i)).collect();
        let exhausted: Vec<u32> = path
            .iter()
            .copied()
            .filter(|&n| self.nodes[n as usize].reads >= self.config.dummy_reads)
            .collect();
        if !exhausted.is_empty() {
            let data = if real {
                None
            } else {
                kept_data.or_else(|| {
                    self.ring.get(&(b as u64)).cloned().or_else(|| {
                        self.in_flight.as_ref().and_then(|f| f.replicas.get(&(b as u64)).cloned())
                    })
                })
            };
            self.kept.insert(b as u64, Kept { leaf, real, data });
            if self.in_flight.is_some() {
                return Ok(QueryStep::Wait);
            }
            return Ok(QueryStep::Reshuffle(self.plan_reshuffle(&exhausted)));
        }
        let target_node = match self.place[b] {
            Place::Tree { node, .. } if real => Some(node),
            _ => None,
        };
        let mut cells = Vec::with_capacity(path.len());
        let mut tags = Vec::with_capacity(path.len());
        let mut target = None;
        for (i, &n) in path.iter().enumerate() {
            let slot = if Some(n) == target_node {
                let Place::Tree { slot, .. } = self.place[b] else { unreachable!() };
                target = Some((i as u32, self.nodes[n as usize].slots[slot as usize].tag));
                slot
            } else {
                self.random_free_slot(n)?
            };
            let node = &mut self.nodes[n as usize];
            node.slots[slot as usize].read = true;
            node.reads += 1;
            tags.push(node.slots[slot as usize].tag);
            cells.push(self.cell(n, self.nodes[n as usize].area, slot));
        }
        let (target, expected) = match target {
            Some(t) => t,
            None => {
                // A query that only hides: the trusted component opens one of the dummies.
                let i = self.rng.gen_range(0..path.len());
                let n = path[i];
                let cell = cells[i];
                let slot = (cell.0 - self.node_base[n as usize]) as usize
                    % self.nodes[n as usize].slots.len();
                (i as u32, self.nodes[n as usize].slots[slot].tag)
            }
        };
        if real {
            self.take_out_of_tree(b);
        }
        // A hiding query keeps a copy of the block: a round may take it from the ring into the
        // tree before the query completes.
        let data = if real {
            None
        } else {
            kept_data.or_else(|| {
                self.ring.get(&(b as u64)).cloned().or_else(|| {
                    self.in_flight.as_ref().and_then(|f| f.replicas.get(&(b as u64)).cloned())
                })
            })
        };
        self.stats.queries += 1;
        self.stats.real_queries += u64::from(real);
        self.queries_since_round += 1;
        debug_assert_eq!(tags[target as usize], expected);
        Ok(QueryStep::Query(QueryPlan { cells, tags, target, expected, real, data }))
    }

    /// Marks `b`'s copy in the tree (if any) stale, here and in the round in flight; the block
    /// is then in the ring (once its data is there).
    fn take_out_of_tree(&mut self, b: usize) {
        if let Place::Tree { node, slot } = self.place[b] {
            let nd = &mut self.nodes[node as usize];
            nd.slots[slot as usize].live = false;
            if !nd.slots[slot as usize].read {
                nd.free.push(slot);
            }
            self.place[b] = Place::Ring;
            if let Some(f) = &mut self.in_flight {
                f.stale.push(b as u64);
            }
        }
    }

    /// A uniformly random slot of `node` that holds no live block and was not read since the
    /// node was last written.
    fn random_free_slot(&mut self, node: u32) -> Result<u32> {
        let free = &mut self.nodes[node as usize].free;
        if free.is_empty() {
            return Err(OramError::Corrupt(format!("node {node} has no unread free slot")));
        }
        let pick = self.rng.gen_range(0..free.len());
        Ok(free.swap_remove(pick))
    }

    /// Completes a query of `block`: `op` applied, the block's data returned. `fetched` is the
    /// block's data from the store for a `real` query (ignored otherwise).
    pub fn finish_query(
        &mut self,
        block: BlockId,
        fetched: Option<Vec<u8>>,
        write: Option<Vec<u8>>,
    ) -> Result<Finished> {
        let b = self.check_block(block)?;
        let bs = self.config.block_size as usize;
        if let Some(w) = &write {
            if w.len() != bs {
                return Err(OramError::WrongBlockSize {
                    got: w.len(),
                    expected: self.config.block_size,
                });
            }
        }
        // The block's current data: just fetched, waiting in the ring, in flight, or zeros.
        let queued = self.ring.contains_key(&(b as u64));
        let current = if let Some(data) = fetched {
            if data.len() != bs {
                return Err(OramError::WrongBlockSize {
                    got: data.len(),
                    expected: self.config.block_size,
                });
            }
            data
        } else if let Some(d) = self.ring.get(&(b as u64)) {
            d.clone()
        } else if let Some(d) = self.in_flight.as_ref().and_then(|f| f.replicas.get(&(b as u64))) {
            d.clone()
        } else if self.place[b] == Place::Nowhere {
            vec![0; bs]
        } else {
            return Err(OramError::Protocol(format!(
                "block {b} was read from the store, but no data was given"
            )));
        };
        if write.is_some() && matches!(self.place[b], Place::Tree { .. }) {
            // A hiding query that waited while its block went up: the new data supersedes the
            // tree's copy.
            self.take_out_of_tree(b);
        }
        let in_flight_copy =
            self.in_flight.as_ref().is_some_and(|f| f.replicas.contains_key(&(b as u64)));
        let needs_ring = (self.place[b] == Place::Ring || write.is_some() || in_flight_copy)
            && !matches!(self.place[b], Place::Tree { .. });
        if needs_ring {
            let data = write.unwrap_or_else(|| current.clone());
            if !queued {
                self.waiting.push_back(b as u64);
            }
            self.ring.insert(b as u64, data);
            self.place[b] = Place::Ring;
            if in_flight_copy {
                // Its copy in the round in flight is stale once the round lands.
                if let Some(f) = &mut self.in_flight {
                    f.replicas.remove(&(b as u64));
                    f.stale.push(b as u64);
                }
            }
            self.stats.max_waiting = self.stats.max_waiting.max(self.waiting.len());
        }
        Ok(Finished { data: current, ring_changed: needs_ring })
    }

    /// The data of `block` while it waits in the ring.
    pub fn ring_data(&self, block: u64) -> Option<&[u8]> {
        self.ring.get(&block).map(Vec::as_slice)
    }

    /// The whole state, for a checkpoint. Only with nothing in flight.
    pub fn state(&self) -> Result<TeeOramState> {
        if self.in_flight.is_some() {
            return Err(OramError::Protocol("a checkpoint needs no round in flight".into()));
        }
        Ok(TeeOramState {
            config: self.config.clone(),
            leaf: self.leaf.clone(),
            place: self.place.clone(),
            nodes: self.nodes.iter().map(|n| (n.area, n.slots.clone(), n.reads)).collect(),
            waiting: self.waiting.iter().copied().collect(),
            ring: self.waiting.iter().map(|b| (*b, self.ring[b].clone())).collect(),
            serial: self.serial,
            round: self.round,
            evictions: self.evictions,
            queries_since_round: self.queries_since_round,
            stats: self.stats,
        })
    }

    /// A planner from a checkpoint, checked for consistency (it comes from a file).
    pub fn from_state(state: TeeOramState, seed: Option<u64>) -> Result<Self> {
        let rng = match seed {
            Some(s) => ChaCha20Rng::seed_from_u64(s),
            None => ChaCha20Rng::from_entropy(),
        };
        let mut oram = Self::with_rng(state.config.clone(), rng);
        let bad = |why: &str| Err(OramError::Corrupt(format!("checkpoint: {why}")));
        let n = state.config.blocks as usize;
        if state.leaf.len() != n || state.place.len() != n || state.nodes.len() != oram.nodes.len()
        {
            return bad("its tables do not fit its configuration");
        }
        let leaves = state.config.leaves();
        if state.leaf.iter().any(|&l| u64::from(l) >= leaves) {
            return bad("a leaf out of range");
        }
        for (i, (area, slots, reads)) in state.nodes.into_iter().enumerate() {
            if area > 1 || slots.len() != oram.nodes[i].slots.len() {
                return bad("a node of the wrong shape");
            }
            let mut node = Node::new(area, slots);
            node.reads = reads;
            oram.nodes[i] = node;
        }
        for (b, p) in state.place.iter().enumerate() {
            if let Place::Tree { node, slot } = *p {
                let ok = oram
                    .nodes
                    .get(node as usize)
                    .and_then(|nd| nd.slots.get(slot as usize))
                    .is_some_and(|s| s.live && s.tag.block == b as u64);
                if !ok {
                    return bad("the index table and the index blocks disagree");
                }
            }
        }
        if state.ring.len() != state.waiting.len()
            || state.ring.iter().zip(&state.waiting).any(|((b, d), w)| {
                b != w
                    || *b as usize >= n
                    || d.len() != state.config.block_size as usize
                    || state.place[*b as usize] != Place::Ring
            })
        {
            return bad("the ring does not match the index table");
        }
        oram.leaf = state.leaf;
        oram.place = state.place;
        oram.waiting = state.waiting.into_iter().collect();
        oram.ring = state.ring.into_iter().collect();
        oram.serial = state.serial;
        oram.round = state.round;
        oram.evictions = state.evictions;
        oram.queries_since_round = state.queries_since_round;
        oram.stats = state.stats;
        Ok(oram)
    }

    /// Replays a block's data that the redo log kept (written, or read out of the tree):
    /// the block is in the ring with `data`, its copy in the tree no longer live.
    pub fn replay_ring(&mut self, block: u64, data: Vec<u8>) -> Result<()> {
        let b = self.check_block(BlockId(block))?;
        if data.len() != self.config.block_size as usize {
            return Err(OramError::WrongBlockSize {
                got: data.len(),
                expected: self.config.block_size,
            });
        }
        if let Place::Tree { node, slot } = self.place[b] {
            let nd = &mut self.nodes[node as usize];
            nd.slots[slot as usize].live = false;
            if !nd.slots[slot as usize].read {
                nd.free.push(slot);
            }
        }
        self.place[b] = Place::Ring;
        if self.ring.insert(block, data).is_none() {
            self.waiting.push_back(block);
        }
        Ok(())
    }

    /// Applies a round the redo log kept, exactly as planned: the blocks that went up leave
    /// the ring, every layer's permutation moves the cells' tags. The result is the state the
    /// store holds once the round has been carried out (again, if need be).
    pub fn replay_round(&mut self, record: &RoundRecord) -> Result<()> {
        if self.in_flight.is_some() {
            return Err(OramError::Protocol("replay with a round in flight".into()));
        }
        let bad = |why: String| Err(OramError::Corrupt(format!("redo record: {why}")));
        let leaves = self.config.leaves();
        for &(b, leaf) in &record.leaves {
            if b >= self.config.blocks || u64::from(leaf) >= leaves {
                return bad(format!("block {b} or leaf {leaf} out of range"));
            }
            self.leaf[b as usize] = leaf;
        }
        let mut carry = Vec::with_capacity(record.incoming.len());
        for tag in &record.incoming {
            let live = tag.block != DUMMY;
            if live {
                if tag.block >= self.config.blocks {
                    return bad(format!("block {} out of range", tag.block));
                }
                if self.ring.remove(&tag.block).is_none() {
                    return bad(format!("block {} went up but was not in the ring", tag.block));
                }
                self.waiting.retain(|w| *w != tag.block);
            }
            self.serial = self.serial.max(tag.serial);
            carry.push(Slot { tag: *tag, live, read: false });
        }
        let mut touched = Vec::new();
        for (node, perm) in &record.layers {
            let Some(old) = self.nodes.get(*node as usize) else {
                return bad(format!("node {node} out of range"));
            };
            let z = old.slots.len();
            let sources: Vec<Slot> = old.slots.iter().chain(carry.iter()).copied().collect();
            if perm.len() != sources.len() {
                return bad(format!("a permutation of {} for {} cells", perm.len(), sources.len()));
            }
            let mut out: Vec<Option<Slot>> = vec![None; sources.len()];
            for (j, &to) in perm.iter().enumerate() {
                match out.get_mut(to as usize) {
                    Some(o @ None) => *o = Some(Slot { read: false, ..sources[j] }),
                    _ => return bad("not a permutation".into()),
                }
            }
            let mut out = out.into_iter().map(|s| s.expect("a permutation fills every place"));
            let slots: Vec<Slot> = out.by_ref().take(z).collect();
            carry = out.collect();
            let area = 1 - self.nodes[*node as usize].area;
            self.nodes[*node as usize] = Node::new(area, slots);
            touched.push(*node);
        }
        for node in touched {
            for (s, slot) in self.nodes[node as usize].slots.iter().enumerate() {
                if slot.live {
                    self.place[slot.tag.block as usize] = Place::Tree { node, slot: s as u32 };
                }
            }
        }
        if !record.incoming.is_empty() {
            self.evictions += 1;
        }
        self.round = self.round.max(record.round);
        Ok(())
    }

    /// Treats every node as read `D` times, so each is reshuffled before it is read again.
    /// After a crash the gateway does not know which slots the store saw read since the last
    /// record; reading one again would link two queries.
    pub fn exhaust_all(&mut self) {
        let d = self.config.dummy_reads;
        for n in &mut self.nodes {
            n.reads = d;
        }
    }

    /// A fresh round number for sending the round in flight again (the trusted component
    /// refuses a ticket it has seen, and a failed attempt may have reached it).
    pub fn renumber_round(&mut self) -> u64 {
        self.round += 1;
        self.round
    }

    /// Moves the round counter past `round` (the trusted component refuses tickets of rounds
    /// it has seen).
    pub fn skip_rounds_past(&mut self, round: u64) {
        self.round = self.round.max(round);
    }

    /// Every block's place, for verification: `(block, Some(cell))` for a block in the tree.
    pub fn blocks_in_tree(&self) -> impl Iterator<Item = (u64, blindfold_store::CellId)> + '_ {
        self.place.iter().enumerate().filter_map(move |(b, p)| match *p {
            Place::Tree { node, slot } => {
                Some((b as u64, self.cell(node, self.nodes[node as usize].area, slot)))
            }
            _ => None,
        })
    }

    /// The blocks in the gateway's ring, with their data, oldest first.
    pub fn ring_blocks(&self) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        self.waiting.iter().map(|b| (*b, self.ring[b].as_slice()))
    }

    /// Whether `block` was ever written (it is in the tree or in the ring).
    pub fn is_written(&self, block: u64) -> bool {
        self.place.get(block as usize).is_some_and(|p| *p != Place::Nowhere)
    }

    /// The current cells of every node, with their tags (what a verification opens).
    pub fn current_cells(&self) -> impl Iterator<Item = (blindfold_store::CellId, SlotTag)> + '_ {
        self.initial_cells()
    }

    /// Queries planned beyond the rounds planned so far, in queries (a round covers
    /// `round_queries`): public, since the store sees every query and every round.
    pub fn queries_ahead(&self) -> u32 {
        self.queries_since_round
    }

    /// Whether enough queries passed for the next round (and none is in flight).
    pub fn round_due(&self) -> bool {
        self.in_flight.is_none() && self.queries_since_round >= self.config.round_queries
    }

    fn fresh_serial(&mut self) -> u64 {
        self.serial += 1;
        self.serial
    }

    /// A reshuffle of `nodes` (each permuted alone into its other area).
    fn plan_reshuffle(&mut self, nodes: &[u32]) -> RoundPlan {
        self.round += 1;
        let mut layers = Vec::new();
        let mut news = Vec::new();
        for &n in nodes {
            let z = self.nodes[n as usize].slots.len();
            let mut perm: Vec<u32> = (0..z as u32).collect();
            perm.shuffle(&mut self.rng);
            let old = &self.nodes[n as usize];
            let mut slots = vec![old.slots[0]; z];
            for (j, &to) in perm.iter().enumerate() {
                slots[to as usize] = Slot { read: false, ..old.slots[j] };
            }
            layers.push(LayerPlan {
                node: n,
                read: (0..z as u32).map(|s| self.cell(n, old.area, s)).collect(),
                write: (0..z as u32).map(|s| self.cell(n, 1 - old.area, s)).collect(),
                perm,
            });
            news.push(NewNode { node: n, slots });
        }
        let lands = Self::landings(&news);
        self.stats.reshuffles += 1;
        self.in_flight = Some(InFlight {
            nodes: news,
            replicas: HashMap::new(),
            lands,
            stale: Vec::new(),
            reshuffle: true,
        });
        RoundPlan { round: self.round, incoming: Vec::new(), layers, leaves: Vec::new() }
    }

    fn landings(news: &[NewNode]) -> HashMap<u64, (usize, u32)> {
        let mut lands = HashMap::new();
        for (i, n) in news.iter().enumerate() {
            for (s, slot) in n.slots.iter().enumerate() {
                if slot.live {
                    lands.insert(slot.tag.block, (i, s as u32));
                }
            }
        }
        lands
    }

    /// Plans the next eviction round (call when [`TeeOram::round_due`]): up to `c` waiting
    /// blocks go up with fresh leaves, padded with dummies, down the next path. Call
    /// [`TeeOram::finish_round`] once the store has carried it out.
    pub fn plan_round(&mut self) -> Result<RoundPlan> {
        if self.in_flight.is_some() {
            return Err(OramError::Protocol("a round is already in flight".into()));
        }
        let c = self.config.round_blocks as usize;
        let leaves = self.config.leaves() as u32;
        let bs = self.config.block_size as usize;
        let mut incoming = Vec::with_capacity(c);
        let mut carry: Vec<Slot> = Vec::with_capacity(c);
        let mut replicas = HashMap::new();
        let mut new_leaves = Vec::new();
        while incoming.len() < c {
            let Some(block) = self.waiting.pop_front() else { break };
            let data = self.ring.remove(&block).expect("every waiting block has its data");
            let serial = self.fresh_serial();
            self.leaf[block as usize] = self.rng.gen_range(0..leaves);
            new_leaves.push((block, self.leaf[block as usize]));
            let tag = SlotTag { block, serial };
            carry.push(Slot { tag, live: true, read: false });
            replicas.insert(block, data.clone());
            incoming.push(Upload { tag, data });
        }
        while incoming.len() < c {
            let tag = SlotTag { block: DUMMY, serial: self.fresh_serial() };
            carry.push(Slot { tag, live: false, read: false });
            incoming.push(Upload { tag, data: vec![0; bs] });
        }
        // The eviction path: reverse-lexicographic order of the leaves.
        let digits = self.config.layers - 1;
        let m = u64::from(self.config.arity);
        let mut r = self.evictions % self.config.leaves();
        let mut leaf = 0u64;
        for _ in 0..digits {
            leaf = leaf * m + r % m;
            r /= m;
        }
        let leaf = leaf as u32;
        self.evictions += 1;
        self.round += 1;
        let mut layers = Vec::new();
        let mut news = Vec::new();
        let last = self.config.layers - 1;
        for layer in 0..self.config.layers {
            let n = self.node_on_path(leaf, layer);
            let next = (layer < last).then(|| self.node_on_path(leaf, layer + 1));
            let old = &self.nodes[n as usize];
            let z = old.slots.len();
            let keep_limit = z - self.config.dummy_reads as usize;
            // Sources: the node's slots, then the carry.
            let sources: Vec<Slot> = old.slots.iter().chain(carry.iter()).copied().collect();
            let mut stay = Vec::new();
            let mut down = Vec::new();
            let mut spare = Vec::new();
            for (j, s) in sources.iter().enumerate() {
                if !s.live {
                    spare.push(j);
                } else if next.is_some_and(|nx| {
                    self.node_on_path(self.leaf[s.tag.block as usize], layer + 1) == nx
                }) && down.len() < c
                {
                    down.push(j);
                } else {
                    stay.push(j);
                }
            }
            if layer == last {
                debug_assert!(down.is_empty());
            }
            if stay.len() > keep_limit {
                return Err(OramError::Overflow {
                    bucket: u64::from(n),
                    blocks: stay.len(),
                    slots: keep_limit,
                });
            }
            spare.shuffle(&mut self.rng);
            let mut to_node = stay.clone();
            to_node.extend(spare.drain(..z - stay.len()));
            let mut to_carry = down;
            to_carry.append(&mut spare);
            to_node.shuffle(&mut self.rng);
            to_carry.shuffle(&mut self.rng);
            let mut perm = vec![0u32; sources.len()];
            let mut slots = Vec::with_capacity(z);
            for (dest, &src) in to_node.iter().enumerate() {
                perm[src] = dest as u32;
                slots.push(Slot { read: false, ..sources[src] });
            }
            let mut next_carry = Vec::with_capacity(c);
            for (k, &src) in to_carry.iter().enumerate() {
                perm[src] = (z + k) as u32;
                next_carry.push(sources[src]);
            }
            let live = stay.len() as u32;
            if layer == last {
                self.stats.max_leaf_live = self.stats.max_leaf_live.max(live);
            } else {
                self.stats.max_node_live = self.stats.max_node_live.max(live);
            }
            layers.push(LayerPlan {
                node: n,
                read: (0..z as u32).map(|s| self.cell(n, old.area, s)).collect(),
                write: (0..z as u32).map(|s| self.cell(n, 1 - old.area, s)).collect(),
                perm,
            });
            news.push(NewNode { node: n, slots });
            carry = next_carry;
        }
        let lands = Self::landings(&news);
        self.queries_since_round =
            self.queries_since_round.saturating_sub(self.config.round_queries);
        self.stats.rounds += 1;
        self.in_flight =
            Some(InFlight { nodes: news, replicas, lands, stale: Vec::new(), reshuffle: false });
        Ok(RoundPlan { round: self.round, incoming, layers, leaves: new_leaves })
    }

    /// Applies the round (or reshuffle) in flight: its nodes' other areas become current.
    pub fn finish_round(&mut self) -> Result<()> {
        let Some(f) = self.in_flight.take() else {
            return Err(OramError::Protocol("no round is in flight".into()));
        };
        let mut news = f.nodes;
        for b in &f.stale {
            if let Some(&(i, s)) = f.lands.get(b) {
                news[i].slots[s as usize].live = false;
            }
        }
        for nn in news {
            let node = &mut self.nodes[nn.node as usize];
            *node = Node::new(1 - node.area, nn.slots);
            for (s, slot) in node.slots.iter().enumerate() {
                if slot.live {
                    self.place[slot.tag.block as usize] =
                        Place::Tree { node: nn.node, slot: s as u32 };
                }
            }
        }
        if !f.reshuffle {
            // Blocks that went up and were not asked for again now live in the tree.
            for b in f.replicas.keys() {
                if self.place[*b as usize] == Place::Ring && !self.ring.contains_key(b) {
                    return Err(OramError::Corrupt(format!(
                        "block {b} went up but did not land in the tree"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Checks the planner's invariants (tests): the index table and the index blocks agree,
    /// and the ring matches its order. Returns the first violation.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        for (b, p) in self.place.iter().enumerate() {
            if let Place::Tree { node, slot } = *p {
                let s = self.nodes[node as usize].slots[slot as usize];
                if !s.live || s.tag.block != b as u64 {
                    return Err(format!(
                        "block {b} placed at node {node} slot {slot}, which holds {s:?}"
                    ));
                }
                let layer = self.layer_of(node);
                if self.node_on_path(self.leaf[b], layer) != node {
                    return Err(format!(
                        "block {b} is in node {node}, off the path of its leaf {}",
                        self.leaf[b]
                    ));
                }
            }
            if (*p == Place::Ring) != self.ring.contains_key(&(b as u64))
                && !self.in_flight.as_ref().is_some_and(|f| f.replicas.contains_key(&(b as u64)))
                && *p != Place::Ring
            {
                return Err(format!("block {b} is in the ring but placed {p:?}"));
            }
        }
        for (n, node) in self.nodes.iter().enumerate() {
            for (i, s) in node.slots.iter().enumerate() {
                if s.live
                    && self.place[s.tag.block as usize]
                        != (Place::Tree { node: n as u32, slot: i as u32 })
                {
                    return Err(format!(
                        "node {n} slot {i} holds live block {} placed {:?}",
                        s.tag.block, self.place[s.tag.block as usize]
                    ));
                }
            }
        }
        if self.waiting.len() != self.ring.len() {
            return Err("ring and its order differ".into());
        }
        Ok(())
    }

    /// The cells of `node`'s current area and of its other area, in slot order.
    pub fn node_areas(
        &self,
        node: u32,
    ) -> Result<(Vec<blindfold_store::CellId>, Vec<blindfold_store::CellId>)> {
        let Some(n) = self.nodes.get(node as usize) else {
            return Err(OramError::Corrupt(format!("node {node} out of range")));
        };
        let z = n.slots.len() as u32;
        Ok((
            (0..z).map(|s| self.cell(node, n.area, s)).collect(),
            (0..z).map(|s| self.cell(node, 1 - n.area, s)).collect(),
        ))
    }

    /// The layer of `node` (public).
    pub fn node_layer(&self, node: u32) -> u32 {
        self.layer_of(node)
    }
}
