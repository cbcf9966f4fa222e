//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in `blindfold-crypto`.
///
/// No variant ever carries key material, a passphrase or plaintext, so errors may be logged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CryptoError {
    /// A sealed cell segment failed authentication: it was modified, swapped with another cell or
    /// segment, rolled back to an older version, moved from another store, or claims a key epoch
    /// this sealer has not reached yet.
    ///
    /// Retrying the same read returns the same error; the data in the store is bad.
    #[error(
        "integrity check failed for cell {cell} segment {segment}: \
         the stored data was modified, swapped or rolled back"
    )]
    Integrity {
        /// The cell address the caller expected.
        cell: u64,
        /// The segment index the caller expected.
        segment: u32,
    },

    /// An input has the wrong shape (e.g. a sealed segment shorter than
    /// [`CellSealer::OVERHEAD`](crate::CellSealer::OVERHEAD), an output buffer of the wrong
    /// length, bad hex).
    #[error("malformed input: {0}")]
    Malformed(String),

    /// A key file exists but cannot be used (unknown format, bad field, refusing to overwrite…).
    #[error("key file {}: {reason}", path.display())]
    KeyFile {
        /// The key file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// The passphrase does not unlock the key file (or the file's wrapped key was altered; the
    /// two cannot be told apart).
    #[error("wrong passphrase for key file {}", path.display())]
    WrongPassphrase {
        /// The key file.
        path: PathBuf,
    },

    /// The key file is protected by a passphrase and none was given.
    #[error("key file {} is protected by a passphrase, but none was given", path.display())]
    PassphraseRequired {
        /// The key file.
        path: PathBuf,
    },

    /// Reading or writing a file failed.
    #[error("i/o error on {}: {source}", path.display())]
    Io {
        /// The file (or directory) being accessed.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The operating system's random number generator failed.
    #[error("the system random number generator failed")]
    Rng,

    /// The sealer has used every key epoch up to `u32::MAX`; the store must be re-keyed (moved
    /// to a new master key).
    #[error("all key epochs are used up; the store must be re-keyed")]
    EpochsExhausted,
}
