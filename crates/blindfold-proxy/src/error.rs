use blindfold_crypto::CryptoError;
use blindfold_oram::OramError;
use blindfold_store::{Geometry, StoreError};

/// Errors of the drivers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// A cell failed authentication: the store modified, swapped or rolled back data. The
    /// access did not complete and no data was returned.
    #[error(
        "integrity violation at cell {cell}: stored data was modified, swapped or rolled back"
    )]
    Integrity {
        /// The cell that failed.
        cell: u64,
        /// The cause.
        #[source]
        source: CryptoError,
    },
    /// The storage backend failed; see [`ProxyError::is_retryable`].
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The scheme refused the request or detected a broken invariant.
    #[error(transparent)]
    Oram(#[from] OramError),
    /// Sealing failed (for example, no randomness).
    #[error(transparent)]
    Crypto(CryptoError),
    /// The store's shape does not fit the scheme.
    #[error("store geometry {found} does not fit the scheme, which needs {needed}")]
    Geometry {
        /// What the store has.
        found: String,
        /// What the scheme needs.
        needed: String,
    },
    /// A previous access failed half-way: the trusted state may no longer match the store.
    #[error("a previous access failed half-way; reload the trusted state before continuing")]
    Poisoned,
    /// A bound on trusted memory (stash or TaoStore subtree) was exceeded. The access took
    /// effect and the state is consistent, but the configured memory bound no longer holds.
    #[error("trusted memory bound exceeded: {0}")]
    Capacity(String),
    /// The disk holding the trusted state stayed full while a write of it waited for room
    /// (`blindfold_store::room`): the access did not complete; nothing acknowledged was lost.
    #[error("the disk is full: {0}")]
    DiskFull(String),
    /// Saved trusted state that cannot be used.
    #[error("invalid trusted state: {0}")]
    State(String),
    /// Parameters that no engine can run with (a capacity too small for the engine, a block
    /// size it cannot hold): the operator's to change, nothing was touched.
    #[error("{0}")]
    Config(String),
}

impl ProxyError {
    /// Whether the same request may succeed if tried again.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ProxyError::Store(e) if e.is_retryable())
    }

    /// Whether this is an integrity violation: a sealed cell failed authentication, or a
    /// block recovered from XORed slots did not match its authenticated digest.
    pub fn is_integrity(&self) -> bool {
        matches!(self, ProxyError::Integrity { .. } | ProxyError::Oram(OramError::Integrity(_)))
    }
}

/// A seal that did not open: an integrity violation at `cell` when the stored bytes are to blame
/// (wrong tag, malformed), otherwise the sealer's own error.
pub(crate) fn integrity(cell: u64, source: CryptoError) -> ProxyError {
    match source {
        CryptoError::Integrity { .. } | CryptoError::Malformed(_) => {
            ProxyError::Integrity { cell, source }
        }
        other => ProxyError::Crypto(other),
    }
}

/// Checks that the array `what` (of shape `found`) can hold a scheme's array of shape `needed`:
/// the same cell size and at least as many cells.
pub(crate) fn check_array(found: Geometry, needed: Geometry, what: &str) -> Result<(), ProxyError> {
    if found.cell_size() != needed.cell_size() || found.cell_count() < needed.cell_count() {
        return Err(ProxyError::Geometry {
            found: format!("{what}: {} cells of {} bytes", found.cell_count(), found.cell_size()),
            needed: format!(
                "at least {} cells of {} bytes",
                needed.cell_count(),
                needed.cell_size()
            ),
        });
    }
    Ok(())
}
