use std::path::PathBuf;

use crate::CellId;

/// Errors from untrusted storage. [`StoreError::is_retryable`] says whether trying the same
/// request again may help.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The geometry asked for is not allowed.
    #[error("invalid store geometry: {0}")]
    InvalidGeometry(String),

    /// A stored array exists with another shape than the one asked for.
    #[error(
        "store at {path} holds {found_cells} cells of {found_size} bytes, \
         but {wanted_cells} cells of {wanted_size} bytes were asked for; \
         use the parameters it was created with, or another path"
    )]
    GeometryMismatch {
        /// Where the store lives.
        path: PathBuf,
        /// Cells found on disk.
        found_cells: u64,
        /// Cell size found on disk.
        found_size: u32,
        /// Cells asked for.
        wanted_cells: u64,
        /// Cell size asked for.
        wanted_size: u32,
    },

    /// A file exists at the path but is not a blindfold cell file (or is damaged).
    #[error("{path} is not a blindfold cell file: {reason}")]
    NotAStore {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },

    /// A cell address past the end of the array.
    #[error("{cell:?} is out of range (the store has {cell_count} cells)")]
    OutOfRange {
        /// The address.
        cell: CellId,
        /// Number of cells.
        cell_count: u64,
    },

    /// A byte range that does not fit inside its cell.
    #[error("range {offset}+{len} does not fit in {cell:?} of {cell_size} bytes")]
    RangeOutOfCell {
        /// The cell.
        cell: CellId,
        /// Start of the range.
        offset: u32,
        /// Length of the range.
        len: u32,
        /// Size of a cell.
        cell_size: u32,
    },

    /// A write whose buffer is not exactly one cell long.
    #[error("write to {cell:?} has {got} bytes, cells are {expected} bytes")]
    WrongCellSize {
        /// The cell.
        cell: CellId,
        /// Bytes given.
        got: usize,
        /// Cell size.
        expected: u32,
    },

    /// An I/O error from the operating system or the network.
    #[error("storage I/O error ({context}): {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        #[source]
        source: std::io::Error,
        /// Whether the same request may succeed if tried again.
        retryable: bool,
    },

    /// The backend did not answer in time.
    #[error("storage request timed out ({0})")]
    Timeout(String),

    /// A fault injected on purpose by [`crate::FaultStore`].
    #[error("injected storage fault ({0})")]
    Injected(String),

    /// A configuration value (of a wrapper such as [`crate::LatencyStore`] or
    /// [`crate::FaultStore`]) that cannot be used.
    #[error("invalid store configuration: {0}")]
    InvalidConfig(String),

    /// A store name (one array inside a store URL) that is not allowed.
    #[error("invalid store name {name:?}: {reason}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The store file is open in another process (or another handle in this one).
    #[error(
        "{path} is in use by another blindfold process (or is already open in this one); \
         two writers would corrupt it"
    )]
    InUse {
        /// The file.
        path: PathBuf,
    },

    /// A request that no store could carry out as asked (for example an XOR of ranges of
    /// different lengths).
    #[error("invalid storage request: {0}")]
    InvalidRequest(String),

    /// The store does not offer a capability (such as server-side XOR) that was asked for.
    #[error("the store does not support {0}")]
    Unsupported(String),

    /// The remote storage server broke the wire protocol or answered with an error that has no
    /// more specific variant.
    #[error("storage server error: {message}")]
    Remote {
        /// What the server said, or what was wrong with its answer.
        message: String,
        /// Whether the same request may succeed if tried again.
        retryable: bool,
    },

    /// A remote backend refused the credentials or the request (wrong key or password,
    /// expired token, missing permission).
    #[error(
        "{store}: access denied ({reason}); check the credentials (for s3:// the \
         AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY environment variables, for redis:// the \
         password, for remote:// the key_file)"
    )]
    AccessDenied {
        /// The store, as a URL without secrets.
        store: String,
        /// What the backend said.
        reason: String,
    },

    /// The container a store URL names (an S3 bucket, a Redis database) does not exist.
    #[error("{store}: {what} does not exist ({reason})")]
    Missing {
        /// The store, as a URL without secrets.
        store: String,
        /// What is missing, e.g. `bucket "photos"`.
        what: String,
        /// What the backend said.
        reason: String,
    },

    /// A remote backend cannot be reached (connection refused, unknown host, no route). It may
    /// come back, so this is retryable.
    #[error("cannot reach {store} at {endpoint}: {reason}")]
    Unreachable {
        /// The store, as a URL without secrets.
        store: String,
        /// The address that was tried.
        endpoint: String,
        /// The cause.
        reason: String,
    },

    /// Any other failure reported by an S3 or Redis backend.
    #[error("{store}: {context}: {source}")]
    Backend {
        /// The store, as a URL without secrets.
        store: String,
        /// What was being done.
        context: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
        /// Whether the same request may succeed if tried again.
        retryable: bool,
    },

    /// The trusted component beside the store (the TEE design) refused a request. With
    /// `integrity` set, sealed data it was handed failed authentication: the store altered,
    /// swapped or rolled back a cell. Otherwise a ticket was malformed, forged or replayed.
    #[error("the trusted component refused: {message}")]
    Trusted {
        /// Whether sealed data failed authentication.
        integrity: bool,
        /// What it said.
        message: String,
    },

    /// Another holder's lease is live: this gateway may not write to the store.
    #[error(
        "lease {name:?} of this store is held by {holder:?} (generation {generation}) for \
         another {expires_in:.1?}: another gateway is using this store; stop that gateway \
         (it releases the lease on a clean shutdown) or wait for its lease to expire, then try \
         again"
    )]
    LeaseHeld {
        /// The lease.
        name: String,
        /// Who holds it, as it named itself.
        holder: String,
        /// Its generation.
        generation: u64,
        /// How long until it expires, by this machine's clock.
        expires_in: std::time::Duration,
    },

    /// Our lease is gone: someone else took it after it expired, or it was released. We are
    /// fenced and must stop writing to the store.
    #[error(
        "lease {name:?} of generation {generation} is lost ({reason}): this gateway is fenced \
         and must stop writing to the store; acquire the lease again (after stopping whoever \
         holds it) to continue"
    )]
    LeaseLost {
        /// The lease.
        name: String,
        /// The generation we held.
        generation: u64,
        /// The generation the store records now (0 if it has no record).
        current_generation: u64,
        /// Who holds that generation (empty if there is no record).
        current_holder: String,
        /// What the store records, in words.
        reason: String,
    },

    /// This process's lease on the store lapsed or was lost ([`crate::LeaseGate`]): it writes
    /// nothing more (the reason says why and what to do).
    #[error("{0}")]
    Fenced(String),

    /// A store URL that cannot be understood.
    #[error("invalid store URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl StoreError {
    /// Whether the same request may succeed if it is tried again.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Io { retryable, .. } | StoreError::Remote { retryable, .. } => *retryable,
            StoreError::Timeout(_) | StoreError::Injected(_) => true,
            StoreError::Backend { retryable, .. } => *retryable,
            StoreError::Unreachable { .. } => true,
            _ => false,
        }
    }

    /// Whether the trusted component found sealed data that failed authentication.
    pub fn is_integrity(&self) -> bool {
        matches!(self, StoreError::Trusted { integrity: true, .. })
    }

    /// An I/O error, classified by its kind.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        use std::io::ErrorKind::*;
        let retryable = matches!(
            source.kind(),
            Interrupted | WouldBlock | TimedOut | ConnectionReset | ConnectionAborted
        );
        StoreError::Io { context: context.into(), source, retryable }
    }
}
