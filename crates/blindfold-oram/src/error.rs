/// Errors of the ORAM schemes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OramError {
    /// A configuration that cannot work.
    #[error("invalid ORAM configuration: {0}")]
    InvalidConfig(String),

    /// A logical block address past the capacity.
    #[error("block {block} is out of range: the ORAM holds blocks 0..{blocks}")]
    BlockOutOfRange {
        /// Address asked for.
        block: u64,
        /// Capacity in blocks.
        blocks: u64,
    },

    /// A write whose data is not exactly one block.
    #[error("write of {got} bytes, but blocks are {expected} bytes")]
    WrongBlockSize {
        /// Bytes given.
        got: usize,
        /// Block size.
        expected: u32,
    },

    /// The stash grew past its configured bound. The access that caused it did take effect;
    /// the bound protects trusted memory, and the store saw nothing unusual.
    #[error(
        "stash overflow in tree {tree}: {size} blocks held, the bound is {limit}; \
         raise the stash limit or use a larger Z"
    )]
    StashOverflow {
        /// Which tree (0 is the data tree, then the position-map trees).
        tree: usize,
        /// Blocks in the stash.
        size: usize,
        /// The configured bound.
        limit: usize,
    },

    /// A bucket of a stash-less scheme (Onion ORAM) would receive more blocks than it has
    /// slots. Nothing was written; the parameters (slots per bucket) are too small for the
    /// load, which the defaults make improbable.
    #[error(
        "bucket {bucket} would receive {blocks} blocks but has {slots} slots; \
         use more slots per bucket"
    )]
    Overflow {
        /// The bucket (heap order).
        bucket: u64,
        /// Blocks it would have to take.
        blocks: usize,
        /// Its slots.
        slots: usize,
    },

    /// The driver called the state machine out of order or fed the wrong number of cells.
    #[error("ORAM driver protocol error: {0}")]
    Protocol(String),

    /// A block recovered without its own seal (XOR Ring ORAM's XORed reads) does not match the
    /// digest in its authenticated bucket metadata: the store returned wrong data.
    #[error("integrity violation: {0}")]
    Integrity(String),

    /// Decrypted bucket contents break an invariant. With authenticated cells this cannot
    /// happen unless trusted state was lost or mixed up with another store.
    #[error("corrupt ORAM state: {0}")]
    Corrupt(String),
}
