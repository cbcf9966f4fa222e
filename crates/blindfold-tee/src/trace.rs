//! Instrumentation: the trusted component's memory accesses, as a test (or an auditor) sees
//! them.
//!
//! [`Enclave::evict_traced`](crate::Enclave::evict_traced) and
//! [`Enclave::query_traced`](crate::Enclave::query_traced) report every access the algorithm
//! makes at the granularity an SGX host can observe through page faults: which page of the
//! enclave's structures, which piece of which cell in untrusted memory. The offset *within* a
//! page is deliberately not reported — it is where the secret lives, and it is what the
//! page-level argument does not hide (see the crate docs).
//!
//! The untraced entry points run the same generic code with a tracer that does nothing, so the
//! instrumentation costs nothing when it is off.

/// One of the enclave's spread structures (64 pages of nibbles, or fewer of whole bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Area {
    /// Old random vectors (piece 0 of every input block).
    Orvp,
    /// New random vectors (piece 0 of every output block).
    Nrvp,
    /// The current piece of every output block.
    Piece,
}

/// One observable memory access of the trusted component.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// A 32-byte piece of a cell handed in by the host (untrusted memory).
    Cell {
        /// The cell's position in the host's slice.
        cell: u32,
        /// The piece within the cell.
        piece: u32,
        /// Written (true) or read (false).
        write: bool,
    },
    /// A page of one of the eviction structures.
    Page {
        /// Which structure.
        area: Area,
        /// The page, `0..64`.
        page: u8,
        /// Written (true) or read (false).
        write: bool,
    },
    /// A piece of the query's one-block selection buffer.
    Buffer {
        /// The piece within the buffer.
        piece: u32,
        /// Written (true) or read (false).
        write: bool,
    },
}

/// Receives accesses; implemented by every `FnMut(Access)`.
pub(crate) trait Tracer {
    fn record(&mut self, access: Access);
}

impl<F: FnMut(Access) + ?Sized> Tracer for F {
    #[inline(always)]
    fn record(&mut self, access: Access) {
        self(access)
    }
}
