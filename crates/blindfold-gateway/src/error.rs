use blindfold_proxy::ProxyError;

/// Errors of the gateway's object layer. They map to S3 error codes in exactly one place
/// (`s3.rs`), and their messages never contain object names or sizes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// The bucket does not exist.
    #[error("the bucket does not exist")]
    NoSuchBucket,
    /// The object does not exist.
    #[error("the object does not exist")]
    NoSuchKey,
    /// The version does not exist (or names a version of another key).
    #[error("the version does not exist")]
    NoSuchVersion,
    /// The request names a delete marker, which holds no data or tags.
    #[error("the version is a delete marker")]
    DeleteMarker,
    /// The bucket still holds objects.
    #[error("the bucket is not empty")]
    BucketNotEmpty,
    /// The multipart upload does not exist.
    #[error("the multipart upload does not exist")]
    NoSuchUpload,
    /// A part named in CompleteMultipartUpload is missing or its ETag does not match.
    #[error("a listed part was not uploaded or its ETag does not match")]
    InvalidPart,
    /// Parts in CompleteMultipartUpload are not in ascending order.
    #[error("the parts are not in ascending order")]
    InvalidPartOrder,
    /// The requested range is outside the object.
    #[error("the requested range is not satisfiable")]
    InvalidRange,
    /// The body's MD5 is not the one the client announced (nothing was stored).
    #[error("the body's MD5 does not match the ETag sent with it; nothing was stored")]
    BadDigest,
    /// A precondition (If-Match and friends) failed.
    #[error("a precondition failed")]
    PreconditionFailed,
    /// The ORAM has no free blocks left.
    #[error("the oblivious store is full ({capacity} blocks); grow it with `blindfold grow --capacity SIZE` (the gateway may keep running), or start it with --grow-at to grow automatically")]
    Full {
        /// Capacity in blocks.
        capacity: u64,
    },
    /// The data directory's disk is nearly full: new data is refused until there is room
    /// (reads and deletes go on; see [`crate::space`]). The message names the disk and what
    /// to free.
    #[error("{0}")]
    NoRoom(String),
    /// The object is larger than this gateway accepts.
    #[error("the object is too large")]
    TooLarge,
    /// The client's request body could not be read.
    #[error("reading the request body failed: {0}")]
    Body(String),
    /// The ORAM engine failed (storage error, integrity violation, …).
    #[error(transparent)]
    Engine(ProxyError),
    /// The directory database failed.
    #[error("directory database error: {0}")]
    Directory(String),
    /// Trusted state is inconsistent.
    #[error("corrupt gateway state: {0}")]
    Corrupt(String),
    /// The bucket's state does not allow the request (such as suspending versioning where
    /// object lock is on); says why.
    #[error("{0}")]
    InvalidBucketState(String),
    /// Object lock forbids the change (a retention period or a legal hold); says which.
    #[error("{0}")]
    Locked(String),
    /// Configuration or data-directory problem.
    #[error("{0}")]
    Config(String),
}

impl From<ProxyError> for GatewayError {
    /// An engine's refusal of its parameters stays a configuration problem of the gateway's.
    fn from(e: ProxyError) -> Self {
        match e {
            ProxyError::Config(message) => GatewayError::Config(message),
            other => GatewayError::Engine(other),
        }
    }
}

impl GatewayError {
    /// Whether this is a detected integrity violation of the untrusted store.
    pub fn is_integrity(&self) -> bool {
        matches!(self, GatewayError::Engine(ProxyError::Integrity { .. }))
    }
}
