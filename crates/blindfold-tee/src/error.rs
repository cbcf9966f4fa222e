//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in `blindfold-tee`.
///
/// No variant carries key material, plaintext, a permutation or a query target, so errors may
/// be logged and may cross to the untrusted host.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TeeError {
    /// Sealed data failed authentication: a cell (or the block a query selected), a ticket or
    /// an answer was modified, forged, swapped, replayed as another kind of message, or sealed
    /// under another key or associated data. `what` says which.
    ///
    /// Retrying with the same input gives the same error; the data is bad.
    #[error("integrity check failed: {what}")]
    Integrity {
        /// What failed, e.g. "the selected block failed authentication".
        what: &'static str,
    },

    /// An input has the wrong shape: a cell or answer of the wrong length, a plaintext that is
    /// not one block, a ticket whose fields do not fit together.
    #[error("malformed {what}: {reason}")]
    Malformed {
        /// The kind of input ("cell", "query ticket", …).
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// An eviction ticket is not newer than the last one accepted for its stream: a replay.
    #[error(
        "replayed eviction ticket: (round {round}, layer {layer}) is not after the last accepted \
         (round {last_round}, layer {last_layer}) of its stream"
    )]
    Replay {
        /// The ticket's round.
        round: u64,
        /// The ticket's layer.
        layer: u32,
        /// The last round accepted on the stream.
        last_round: u64,
        /// The last layer accepted on the stream.
        last_layer: u32,
    },

    /// A query ticket's number is not above the last one answered on its stream: the ticket
    /// was replayed, or delivered after a later one.
    #[error(
        "replayed or reordered query ticket: number {query_id} is not after the last answered \
         ({last}) on its stream"
    )]
    QueryReplay {
        /// The ticket's number.
        query_id: u64,
        /// The last number answered on the stream.
        last: u64,
    },

    /// An eviction names more blocks than the enclave's pages hold.
    #[error("eviction of {blocks} blocks refused: at most {max} fit the enclave's pages")]
    TooManyBlocks {
        /// Blocks in the eviction.
        blocks: usize,
        /// The limit, [`MAX_EVICT_BLOCKS`](crate::MAX_EVICT_BLOCKS).
        max: usize,
    },

    /// The replay table is full: the enclave already tracks its maximum number of streams.
    #[error("refusing a new stream: the enclave already tracks {max} streams; restart it")]
    TooManyStreams {
        /// The limit, [`MAX_STREAMS`](crate::MAX_STREAMS).
        max: usize,
    },

    /// The system random number generator failed.
    #[error("the system random number generator failed")]
    Rng,

    /// A key file cannot be created or used.
    #[error("TEE key file {}: {reason}", path.display())]
    KeyFile {
        /// The key file.
        path: PathBuf,
        /// What is wrong with it (never quotes the file's contents).
        reason: String,
    },
}

impl TeeError {
    pub(crate) fn malformed(what: &'static str, reason: impl Into<String>) -> Self {
        Self::Malformed { what, reason: reason.into() }
    }

    /// Whether this error means the data was tampered with (as opposed to a bad shape or a
    /// local failure).
    pub fn is_integrity(&self) -> bool {
        matches!(self, Self::Integrity { .. })
    }
}
