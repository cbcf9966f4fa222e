//! ORAM schemes for blindfold, written as state machines without I/O.
//!
//! A scheme never touches storage. It is asked to perform a logical access and answers with
//! the *physical plan*: which cells to read; given their plaintext contents, which cells to write
//! and, when the access is complete, the logical block. A driver (see `blindfold-proxy`) carries
//! out the plan against a sealed [`blindfold_store::Store`]. Because the plan is all the
//! storage ever sees, the adversary's view can be tested directly on the plans.
//!
//! Schemes so far:
//!
//! * [`PathOram`] — Path ORAM (Stefanov et al.; seed 002, Algorithm 1) with Z-block buckets,
//!   greedy bottom-up eviction, a bounded stash, an in-memory or recursive position map and an
//!   optional cache of the top levels of the tree in trusted memory.
//! * [`RingOram`] — Ring ORAM and XOR Ring ORAM (Ren et al.; seed 002, Algorithms 2–7): `Z`
//!   real and `S` dummy slots per bucket, one block read per bucket, eviction every `A`
//!   accesses in reverse-lexicographic order, early reshuffles; the XOR variant lets the store
//!   XOR the path's slots so one block comes back.
//! * [`OnionOram`] — Onion ORAM (Devadas et al.; seed 002, Algorithms 8–11): no stash, one
//!   homomorphic select per access, triplet eviction in reverse-lexicographic order and leaf
//!   stripping; the plans name which slot every select picks, the driver does the
//!   Damgård–Jurik work.
//! * [`TaoScheme`] — TaoStore's processor (Sahin et al.; seed 000): the position map, stash,
//!   subtree, real and fake reads and the batching of write-backs of the concurrent engine,
//!   whose driver in `blindfold-proxy` adds the locks, tasks, sealing and the sequencer.
//! * [`TeeOram`] — the gateway side of the TEE-assisted design (seed 004): an m-ary tree whose
//!   queries and evictions a trusted component beside the store carries out; the plans name
//!   the cells and the secret permutations, the driver seals them for the trusted component.
//!
//! ```
//! use blindfold_oram::{BlockId, Op, PathOram, PathOramConfig, Progress};
//! use std::collections::HashMap;
//!
//! let config = PathOramConfig::builder(64, 32).z(4).build().unwrap();
//! let mut oram = PathOram::with_seed(config, 7);
//! // A toy driver: cells live in a HashMap, in plaintext.
//! let mut cells: HashMap<u64, Vec<u8>> = HashMap::new();
//! let mut run = |oram: &mut PathOram, block, op| {
//!     let mut read = oram.start(block, op).unwrap();
//!     loop {
//!         let fetched = read.iter().map(|c| cells.get(&c.0).cloned()).collect();
//!         match oram.feed(fetched).unwrap() {
//!             Progress::Continue { writes, read: next } => {
//!                 cells.extend(writes.into_iter().map(|(c, d)| (c.0, d)));
//!                 read = next;
//!             }
//!             Progress::Done { writes, data } => {
//!                 cells.extend(writes.into_iter().map(|(c, d)| (c.0, d)));
//!                 return data;
//!             }
//!         }
//!     }
//! };
//! run(&mut oram, BlockId(5), Op::Write(vec![9; 32]));
//! assert_eq!(run(&mut oram, BlockId(5), Op::Read), vec![9; 32]);
//! assert_eq!(run(&mut oram, BlockId(6), Op::Read), vec![0; 32]); // never written
//! ```
//!
//! # Security
//!
//! Every access to [`PathOram`] reads and writes exactly one path of every tree (the data tree
//! and each position-map tree), in a fixed order, with leaves drawn uniformly at random and
//! independent of the logical addresses. The number of accesses and their timing are public.
//! A stash overflow does not change what the store sees, but is reported as an error because
//! the trusted memory bound was exceeded.

mod bytes;
mod error;
pub mod oblivistore;
pub mod onion;
pub mod path;
pub mod ring;
pub mod tao;
pub mod tee;
pub mod tree;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use error::OramError;
pub use onion::{
    OnionOram, OnionOramConfig, OnionOramConfigBuilder, OnionOramState, OnionOramStats,
};
pub use path::{
    BulkLoad, OramDelta, PathOram, PathOramConfig, PathOramConfigBuilder, PathOramState,
    PathOramStats, PosMapMode,
};
pub use ring::{
    RingInput, RingOram, RingOramConfig, RingOramConfigBuilder, RingOramState, RingOramStats,
    RingPlan, RingRead, RingVariant,
};
pub use tao::{
    Arrived, Reveal, TaoBlock, TaoRequest, TaoScheme, TaoSchemeConfig, TaoStats, Ticket, WriteBack,
};
pub use tee::{
    QueryPlan, QueryStep, RoundPlan, SlotTag, TeeOram, TeeOramConfig, TeeOramConfigBuilder,
    TeeOramStats,
};
pub use tree::TreeShape;

/// Result type of this crate.
pub type Result<T, E = OramError> = std::result::Result<T, E>;

/// A logical block address, as the layer above sees it. Secret.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BlockId(pub u64);

impl fmt::Debug for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block#{}", self.0)
    }
}

/// A leaf of a tree: names the path from the root to it. Secret until it is read.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub struct Leaf(pub u64);

/// A bucket of one tree, in heap order (root = 0).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub struct BucketId(pub u64);

/// A logical operation on one block.
#[derive(Clone, PartialEq, Eq)]
pub enum Op {
    /// Return the block's contents (zeros if it was never written).
    Read,
    /// Replace the block's contents; the old contents are returned.
    Write(Vec<u8>),
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Read => write!(f, "Read"),
            Op::Write(d) => write!(f, "Write({} bytes)", d.len()),
        }
    }
}

/// What a driver must do next for an access in progress.
#[derive(Debug)]
pub enum Progress {
    /// Write these cells (plaintext; the driver seals them), then read `read` and feed the
    /// contents back. The writes and the next read are independent and may be issued together.
    Continue {
        /// Cells to write.
        writes: Vec<(blindfold_store::CellId, Vec<u8>)>,
        /// Cells to read next.
        read: Vec<blindfold_store::CellId>,
    },
    /// Write these cells; the access is then complete and `data` is the block's contents
    /// before the access.
    Done {
        /// Cells to write.
        writes: Vec<(blindfold_store::CellId, Vec<u8>)>,
        /// The block as it was before this access.
        data: Vec<u8>,
    },
}
