//! Untrusted storage for blindfold: the trust boundary.
//!
//! Everything that crosses the [`Store`] trait is what the adversary sees. A store is a fixed
//! array of equally sized *cells* addressed by [`CellId`]; it knows nothing about ORAM, keys or
//! objects. Schemes above it only ever send opaque, sealed, fixed-size cells.
//!
//! The trait is deliberately small:
//!
//! * [`Store::read`] — batched reads of whole cells,
//! * [`Store::read_ranges`] — batched reads of byte ranges inside cells (Ring ORAM reads one
//!   block per bucket),
//! * [`Store::write`] — batched writes of whole cells,
//! * [`Store::flush`] — durability barrier,
//! * [`Store::geometry`] — the public shape of the array.
//!
//! A cell that was never written reads back as all zero bytes; callers above the seal layer
//! know which cells they wrote and ignore the contents of the others, so a new store needs no
//! initialisation pass.
//!
//! Behaviour is added by *wrapping* a store rather than by flags: [`CountingStore`] (requests,
//! bytes and round trips), [`RecordingStore`] (the adversary's view, request by request),
//! [`LatencyStore`] (round-trip time and a bandwidth limit, to emulate a WAN on one machine) and
//! [`FaultStore`] (seeded errors, time-outs and lost acknowledgements) and [`JitterStore`]
//! (seeded random delays that reorder concurrent calls and their replies). Wrappers stack, and
//! wrap a shared `Arc<dyn Store>` as well as a concrete store.
//!
//! Backends: [`MemoryStore`] and [`FileStore`] (one preallocated file per array, byte format in
//! its docs), [`S3Store`] (one object per cell in any S3-compatible bucket) and [`RedisStore`]
//! (one key per cell); [`open_store`] builds one from a URL such as `memory:`,
//! `file:///var/lib/blindfold/cells`, `s3://bucket/prefix?endpoint=http://127.0.0.1:9000` or
//! `redis://127.0.0.1:6379/0`. [`RemoteStore`] (`remote://host:port?key_file=/path`) reaches
//! arrays held by a `blindfold storage-server` over TCP, authenticated with the server's
//! pre-shared [`remote::AuthKey`] ([`remote::protocol`] has the wire format).
//!
//! Server-side computation is a *capability*: a trait on top of [`Store`] that only the
//! backends able to compute implement. [`XorStore`] (XOR of byte ranges, for XOR Ring ORAM) is
//! offered by memory, file and remote stores and passed through (counted, recorded, delayed) by
//! the wrappers; [`open_xor_store`] opens one from a URL. `SelectStore` (Onion ORAM's
//! homomorphic select over Damgård–Jurik ciphertexts; feature `select`, which links GMP) is
//! offered and passed through the same way, and opened by `open_select_store`. [`TeeStore`]
//! (the TEE-assisted design's trusted component, seed 004) is offered by [`TeeHost`], which
//! runs a [`Trusted`] component over any store, and by the remote store of a storage server
//! started with one; [`open_tee_store`] opens one.
//!
//! The [`lease`] module is the *one writer* capability: [`LeaseStore`] keeps a named lease with
//! a generation number in the store itself, taken and renewed through each backend's own
//! conditional writes, so that a second gateway is refused and a fenced one learns it;
//! [`open_lease_store`] opens it for any store URL.
//!
//! ```
//! use blindfold_store::{CellId, Geometry, MemoryStore, Store};
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let store = MemoryStore::new(Geometry::new(16, 64).unwrap());
//! store.write(vec![(CellId(3), vec![7u8; 64])]).await.unwrap();
//! let cells = store.read(&[CellId(3), CellId(4)]).await.unwrap();
//! assert_eq!(cells[0], vec![7u8; 64]);
//! assert_eq!(cells[1], vec![0u8; 64]); // never written: zeros
//! # });
//! ```
//!
//! Measuring what an adversary sees:
//!
//! ```
//! use std::sync::Arc;
//! use blindfold_store::{CellId, CountingStore, Geometry, MemoryStore, RecordingStore};
//! use blindfold_store::{Store, TraceOp};
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let shared: Arc<dyn Store> = Arc::new(MemoryStore::new(Geometry::new(16, 64).unwrap()));
//! let store = CountingStore::new(RecordingStore::new(shared));
//! store.read(&[CellId(1), CellId(2)]).await.unwrap();
//! assert_eq!(store.counts().bytes_down(), 128);
//! assert_eq!(store.inner().trace()[0].shape(), (TraceOp::Read, 2, 128));
//! # });
//! ```

mod counting;
mod duration;
pub use duration::parse_duration;
mod error;
mod fault;
mod file;
mod jitter;
mod latency;
pub mod lease;
mod memory;
mod recording;
pub mod redis;
pub mod remote;
pub mod room;
pub mod s3;
#[cfg(feature = "select")]
mod select;
mod tee;
mod url;
mod xor;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use crate::redis::{RedisAddress, RedisOptions, RedisPassword, RedisStore};
pub use counting::{CountingStore, Counts};
pub use error::StoreError;
pub use fault::{FaultConfig, FaultStore};
pub use file::{FileStore, SyncMode};
pub use jitter::JitterStore;
pub use latency::{LatencyStore, LinkConfig};
pub use lease::{
    check_holder, open_lease_records, open_lease_store, FileLeaseRecords, GatedStore, LeaseGate,
    LeaseInfo, LeaseRecords, LeaseStore, Leases, LoadedRecord, MemoryLeaseRecords, MAX_HOLDER_LEN,
    MAX_LEASE_RECORD,
};
pub use memory::MemoryStore;
pub use recording::{RecordingStore, TraceEvent, TraceOp};
pub use remote::RemoteStore;
pub use s3::{aws_builder, S3Credentials, S3Options, S3Store};
#[cfg(feature = "select")]
pub use select::{
    check_combined, check_select, check_select_writes, combine_locally, combined_answer_len,
    combined_by_reading, open_compute_store, open_select_store, select_answer_len,
    select_by_reading, select_locally, write_select_by_reading, CombinedSelect, ComputeStore,
    SelectRequest, SelectStore, SelectWrite,
};
pub use tee::{
    check_tee_query, check_tee_round, open_tee_store, tee_answer_max, tee_query_bytes,
    tee_round_bytes, TeeHost, TeeLayer, TeeRound, TeeStore, Trusted, MAX_TEE_ANSWER_OVERHEAD,
    MAX_TEE_BUFFER_BYTES, MAX_TEE_CELLS, MAX_TEE_LAYERS, MAX_TEE_TICKET,
};
pub use url::{open_store, remove_array, StoreUrl};
pub use xor::{check_xor, open_xor_store, xor_buffers, xor_by_reading, xor_into, XorStore};

/// Result type of this crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Address of one cell in a store.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CellId(pub u64);

impl fmt::Debug for CellId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cell#{}", self.0)
    }
}

impl fmt::Display for CellId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The public shape of a store: how many cells, of how many bytes each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    cell_count: u64,
    cell_size: u32,
}

impl Geometry {
    /// Largest cell this crate accepts (64 MiB).
    pub const MAX_CELL_SIZE: u32 = 64 << 20;

    /// A geometry of `cell_count` cells of `cell_size` bytes. Both must be non-zero and the
    /// cell size at most [`Geometry::MAX_CELL_SIZE`].
    pub fn new(cell_count: u64, cell_size: u32) -> Result<Self> {
        if cell_count == 0 || cell_size == 0 || cell_size > Self::MAX_CELL_SIZE {
            return Err(StoreError::InvalidGeometry(format!(
                "{cell_count} cells of {cell_size} bytes (need at least one cell of 1..={} bytes)",
                Self::MAX_CELL_SIZE
            )));
        }
        cell_count.checked_mul(u64::from(cell_size)).ok_or_else(|| {
            StoreError::InvalidGeometry(format!("{cell_count} cells of {cell_size} bytes overflow"))
        })?;
        Ok(Self { cell_count, cell_size })
    }

    /// Number of cells.
    pub fn cell_count(&self) -> u64 {
        self.cell_count
    }

    /// Bytes per cell.
    pub fn cell_size(&self) -> u32 {
        self.cell_size
    }

    /// Total bytes the cells take.
    pub fn total_bytes(&self) -> u64 {
        self.cell_count * u64::from(self.cell_size)
    }

    /// Checks that `cell` is inside the array.
    pub fn check_cell(&self, cell: CellId) -> Result<()> {
        if cell.0 >= self.cell_count {
            return Err(StoreError::OutOfRange { cell, cell_count: self.cell_count });
        }
        Ok(())
    }

    /// Checks that `range` lies inside one cell of the array.
    pub fn check_range(&self, range: &ByteRange) -> Result<()> {
        self.check_cell(range.cell)?;
        let end = u64::from(range.offset) + u64::from(range.len);
        if end > u64::from(self.cell_size) {
            return Err(StoreError::RangeOutOfCell {
                cell: range.cell,
                offset: range.offset,
                len: range.len,
                cell_size: self.cell_size,
            });
        }
        Ok(())
    }

    /// Checks a whole-cell write: address in range and exactly one cell of bytes.
    pub fn check_write(&self, cell: CellId, data: &[u8]) -> Result<()> {
        self.check_cell(cell)?;
        if data.len() != self.cell_size as usize {
            return Err(StoreError::WrongCellSize {
                cell,
                got: data.len(),
                expected: self.cell_size,
            });
        }
        Ok(())
    }
}

/// A byte range inside one cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ByteRange {
    /// The cell.
    pub cell: CellId,
    /// First byte, from the start of the cell.
    pub offset: u32,
    /// Number of bytes.
    pub len: u32,
}

/// An array of fixed-size cells held by someone we do not trust.
///
/// Contracts every implementation keeps (checked by the conformance suite in
/// `blindfold-testkit`):
///
/// * results come back in request order, one entry per requested cell or range;
/// * a cell never written reads as `cell_size` zero bytes;
/// * a batch with any invalid address or size fails whole, before touching anything;
/// * a write is visible to every read that starts after the write returned;
/// * after [`Store::flush`] returns, every write that returned before it survives a crash of
///   the process (for backends that persist at all).
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug {
    /// The public shape of this store.
    fn geometry(&self) -> Geometry;

    /// Reads whole cells, in order.
    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>>;

    /// Reads byte ranges inside cells, in order.
    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>>;

    /// Writes whole cells. Each buffer must be exactly one cell long. If the same cell appears
    /// twice, the later buffer wins.
    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()>;

    /// Writes whole cells whose buffers the caller keeps sharing (an engine that still serves
    /// reads from them): as [`Store::write`], with the same checks and results. A backend that
    /// can send or copy from a borrowed buffer says so by overriding this, and the caller's
    /// buffers are then never copied for it; the default hands [`Store::write`] a copy of each
    /// buffer still shared (none of one the caller no longer holds). Wrappers forward it, so a
    /// chain of them copies nothing either.
    async fn write_shared(&self, cells: Vec<(CellId, Arc<Vec<u8>>)>) -> Result<()> {
        self.write(cells.into_iter().map(|(c, d)| (c, Arc::unwrap_or_clone(d))).collect()).await
    }

    /// Makes every write that has returned durable.
    async fn flush(&self) -> Result<()>;

    /// Whether a failed [`Store::write`] may succeed if tried again (some of its errors are
    /// [retryable](StoreError::is_retryable)). A caller keeps a copy of a batch for a retry
    /// only then: a store whose writes never fail that way (memory) says `false`, and its
    /// callers hand it their buffers without copying them. Wrappers that add no failures of
    /// their own answer for the store they wrap.
    fn writes_may_be_retried(&self) -> bool {
        true
    }
}

#[async_trait]
impl<S: Store + ?Sized> Store for Arc<S> {
    fn geometry(&self) -> Geometry {
        (**self).geometry()
    }
    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>> {
        (**self).read(cells).await
    }
    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        (**self).read_ranges(ranges).await
    }
    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        (**self).write(cells).await
    }
    async fn write_shared(&self, cells: Vec<(CellId, Arc<Vec<u8>>)>) -> Result<()> {
        (**self).write_shared(cells).await
    }
    async fn flush(&self) -> Result<()> {
        (**self).flush().await
    }
    fn writes_may_be_retried(&self) -> bool {
        (**self).writes_may_be_retried()
    }
}

#[async_trait]
impl<S: Store + ?Sized> Store for Box<S> {
    fn geometry(&self) -> Geometry {
        (**self).geometry()
    }
    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>> {
        (**self).read(cells).await
    }
    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        (**self).read_ranges(ranges).await
    }
    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        (**self).write(cells).await
    }
    async fn write_shared(&self, cells: Vec<(CellId, Arc<Vec<u8>>)>) -> Result<()> {
        (**self).write_shared(cells).await
    }
    async fn flush(&self) -> Result<()> {
        (**self).flush().await
    }
    fn writes_may_be_retried(&self) -> bool {
        (**self).writes_may_be_retried()
    }
}
