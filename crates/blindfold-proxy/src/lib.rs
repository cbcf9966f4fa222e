//! Drivers that run blindfold's ORAM schemes against sealed, untrusted stores.
//!
//! A scheme (from `blindfold-oram`) says which cells to read and write, in plaintext. A driver
//! here carries that plan out: it reads the cells from a [`blindfold_store::Store`], opens them
//! with a [`blindfold_crypto::CellSealer`] against the trusted version of each cell, feeds the
//! plaintext to the scheme, seals what the scheme wants written under the next version, and
//! writes it. Rollback, swapping and tampering of cells all surface as
//! [`ProxyError::Integrity`], never as wrong data.
//!
//! * [`VersionTable`] — the trusted per-cell write counters that make replays detectable.
//! * [`SealedPathOram`] — Path ORAM over any store, one access at a time.
//! * [`DurablePathOram`] — Path ORAM whose trusted state survives a crash at any instant
//!   (redo log plus checkpoints in a local directory).
//! * [`SealedRingOram`] — Ring ORAM and XOR Ring ORAM over a metadata array and a data array
//!   (the XOR variant needs a data store with the [`blindfold_store::XorStore`] capability).
//! * [`TaoOram`] — the concurrent TaoStore-style engine: many requests in flight over one
//!   Path ORAM tree, a sequencer, fake reads, an in-memory subtree and batched background
//!   write-backs (see [`tao`]).
//! * [`slots`] — two copies per cell, so commits never overwrite committed cells and the redo
//!   log carries no cell contents; [`pinned`] — the top of the tree kept in trusted memory.
//! * [`rebuild`] — rebuilding a durable engine's tree into a new store array under a fresh
//!   key epoch, with fresh random leaves (`blindfold recover`).
//! * `SealedOnionOram` (feature `onion`) — Onion ORAM over a metadata array and a data array
//!   that computes Damgård–Jurik selects (`blindfold_store::SelectStore`).
//! * [`DurableTee`] — the TEE-assisted engine (seed 004): an m-ary tree whose queries and
//!   evictions a trusted component beside the store carries out
//!   ([`blindfold_store::TeeStore`]); crash-consistent, many queries at once.
//! * [`SealedDirect`] — the baseline: the same blocks sealed and stored at fixed places with
//!   no ORAM, for measuring what obliviousness costs.
//!
//! ```
//! use std::sync::Arc;
//! use blindfold_crypto::{CellSealer, MasterKey, StoreId};
//! use blindfold_oram::{BlockId, PathOramConfig};
//! use blindfold_proxy::SealedPathOram;
//! use blindfold_store::MemoryStore;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let config = PathOramConfig::builder(1000, 64).build().unwrap();
//! let store = Arc::new(MemoryStore::new(SealedPathOram::geometry(&config).unwrap()));
//! let sealer = CellSealer::new(&MasterKey::generate(), StoreId::random(), 0);
//! let mut oram = SealedPathOram::new(config, store, sealer).unwrap();
//! oram.write(BlockId(42), vec![7; 64]).await.unwrap();
//! assert_eq!(oram.read(BlockId(42)).await.unwrap(), vec![7; 64]);
//! # });
//! ```

/// The block calls of an engine that serves each block through its own
/// `access(&self, BlockId, Op) -> Result<Vec<u8>>` (concurrent accesses, replies in order):
/// `read`, `write`, `read_many` and `write_many`, in the engine's `impl` block.
macro_rules! block_calls {
    ($engine:ident) => {
        /// Reads a block (zeros if never written).
        pub async fn read(&self, block: BlockId) -> Result<Vec<u8>> {
            self.access(block, Op::Read).await
        }

        #[doc = concat!("Writes a block; durable after the next [`", stringify!($engine), "::commit`].")]
        pub async fn write(&self, block: BlockId, data: Vec<u8>) -> Result<()> {
            self.access(block, Op::Write(data)).await.map(drop)
        }

        /// Reads distinct blocks at once.
        pub async fn read_many(&self, blocks: &[BlockId]) -> Result<Vec<Vec<u8>>> {
            futures::future::try_join_all(blocks.iter().map(|&b| self.access(b, Op::Read))).await
        }

        /// Writes distinct blocks at once.
        pub async fn write_many(&self, blocks: Vec<(BlockId, Vec<u8>)>) -> Result<()> {
            futures::future::try_join_all(
                blocks.into_iter().map(|(b, d)| self.access(b, Op::Write(d))),
            )
            .await
            .map(drop)
        }
    };
}

mod bulk;
pub mod catalogue;
mod direct;
mod durable;
mod durable_tao;
pub mod engine;
mod error;
mod journal;
pub mod lifecycle;
mod oblivistore;
#[cfg(feature = "onion")]
mod onion;
mod packed;
mod path;
pub mod pinned;
pub mod rebuild;
mod retry;
mod ring;
mod sealing;
pub mod slots;
pub mod tao;
mod tee;
mod toplog;
mod versions;

pub use catalogue::{EngineParams, OramEngine};
pub use direct::SealedDirect;
pub use durable::{DurablePathOram, Recovery, VerifyReport};
pub use durable_tao::{DurableTao, OverlayStore};
pub use engine::{EngineGauges, InPlaceGrowth, SharedEngine};
pub use error::ProxyError;
pub use journal::{make_private, LogMirror, Mirrored, Tap};
pub use lifecycle::DurableEngine;
pub use oblivistore::{DurableObliviStore, ObliviStoreEngineStats};
#[cfg(feature = "onion")]
pub use onion::{OnionPhaseTimes, SealedOnionOram, SealedOnionState};
pub use packed::{PackedStore, Packing, MAX_PACK_LEVELS, READ_BACK_CACHE_BYTES};
pub use path::{SealedPathOram, SealedPathState};
pub use pinned::{PinnedCells, PinnedStore};
pub use ring::{AccessTiming, RingData, RingPhaseTimes, SealedRingOram, SealedRingState};
pub use slots::{slotted_geometry, SlotMap, SlottedStore};
pub use tao::{Reply, Reveal, TaoConfig, TaoOram, TaoState, TaoStats};
pub use tee::{DurableTee, Preload, TeeEngineStats};
pub use versions::VersionTable;

/// The trusted-state files every durable engine keeps in its state directory, for engines in
/// other crates (the load balancer of `blindfold-node`): a sealed checkpoint written atomically
/// ([`state_file::write_checkpoint_as`], [`state_file::decode_checkpoint`]) and a redo log of
/// sealed, checksummed frames ([`state_file::append_record`],
/// [`state_file::read_frames_with_legacy`]), all under the master key's
/// [`blindfold_crypto::StateSealer`].
pub mod state_file {
    pub use crate::journal::{
        append_frame, append_frames, append_frames_mirroring, append_record, append_reveal,
        append_reveal_frames, decode_checkpoint, decode_record, empty_log, encode_frame, open_log,
        read_frames_with_legacy, sync_dir, write_checkpoint_as, Frame, LogMirror, Mirrored, Tap,
        CHECKPOINT, REDO_LOG,
    };
}

/// Result type of this crate.
pub type Result<T, E = ProxyError> = std::result::Result<T, E>;
