//! [`RecordingStore`]: records the adversary's view of the store, request by request, so
//! obliviousness can be tested on real traces.

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::{ByteRange, CellId, Geometry, Result, Store};

/// The kind of a storage request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TraceOp {
    /// [`Store::read`].
    Read,
    /// [`Store::read_ranges`].
    ReadRanges,
    /// [`Store::write`].
    Write,
    /// [`Store::flush`].
    Flush,
    /// [`XorStore::read_xor`](crate::XorStore::read_xor): the store XORs the ranges and returns
    /// one range's worth of bytes.
    ReadXor,
    /// `SelectStore::read_select` (feature `select`): the
    /// store reads the ranges, selects among them under the encrypted selector and returns one
    /// slot's worth of ciphertexts.
    ReadSelect,
    /// `SelectStore::read_select_combined`: one
    /// select per group of ranges ([`TraceEvent::groups`]), combined by one more.
    ReadSelectCombined,
    /// `SelectStore::write_select`: selects whose answers
    /// the store writes into [`TraceEvent::targets`] instead of returning them.
    WriteSelect,
    /// [`TeeStore::tee_query`](crate::TeeStore::tee_query): the host reads the cells and its
    /// trusted component answers one sealed block.
    TeeQuery,
    /// [`TeeStore::tee_evict`](crate::TeeStore::tee_evict): one eviction round; the event
    /// carries no cells and is followed by one [`TraceOp::Read`] and one [`TraceOp::Write`]
    /// event per layer, in layer order, for the cells the host reads and writes.
    /// [`TraceEvent::groups`] holds the cells read per layer.
    TeeEvict,
}

/// One request as the store (the adversary) sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TraceEvent {
    /// What kind of request.
    pub op: TraceOp,
    /// The cells addressed, in request order (one per range for [`TraceOp::ReadRanges`],
    /// [`TraceOp::ReadXor`] and the select operations, empty for [`TraceOp::Flush`]).
    pub cells: Vec<CellId>,
    /// `(offset, len)` inside each cell of `cells`; only for [`TraceOp::ReadRanges`],
    /// [`TraceOp::ReadXor`] and the select operations, else empty.
    pub ranges: Vec<(u32, u32)>,
    /// Payload bytes the request moves: cell bytes requested by a read, range bytes requested
    /// by a ranged read, buffer bytes sent by a write, zero for a flush, the length of one range
    /// (what comes back) for an XOR read; for the select operations, the selector ciphertext
    /// bytes sent plus, for the two reads, the answer's bytes; for [`TraceOp::TeeQuery`] the
    /// ticket's bytes and for [`TraceOp::TeeEvict`] the incoming blocks' and tickets' bytes.
    pub bytes: u64,
    /// The buffers of a write, in order; only when recording
    /// [with payloads](RecordingStore::with_payloads), else empty.
    pub payloads: Vec<Vec<u8>>,
    /// For [`TraceOp::ReadSelectCombined`] and [`TraceOp::WriteSelect`]: how many of `ranges`
    /// each select reads, in order (they split `ranges` into groups, resp. writes); for
    /// [`TraceOp::TeeEvict`], how many cells each layer reads; else empty.
    #[serde(default)]
    pub groups: Vec<u32>,
    /// For [`TraceOp::WriteSelect`]: the cell each select's answer is written to; else empty.
    #[serde(default)]
    pub targets: Vec<CellId>,
}

impl TraceEvent {
    /// An event of `op` over `cells` and `ranges` moving `bytes`, with no payloads, groups or
    /// targets.
    pub fn new(op: TraceOp, cells: Vec<CellId>, ranges: Vec<(u32, u32)>, bytes: u64) -> Self {
        Self {
            op,
            cells,
            ranges,
            bytes,
            payloads: Vec::new(),
            groups: Vec::new(),
            targets: Vec::new(),
        }
    }

    /// The event without addresses or contents: kind, number of cells (or ranges), bytes.
    pub fn shape(&self) -> (TraceOp, usize, u64) {
        (self.op, self.cells.len(), self.bytes)
    }
}

/// A store that appends a [`TraceEvent`] for every request passing through it to `S`.
///
/// Every request is recorded as issued, before it is forwarded, even if the inner store then
/// rejects it: the request itself is what the adversary sees. Concurrent requests are recorded
/// in the order they reach this wrapper.
#[derive(Debug)]
pub struct RecordingStore<S> {
    inner: S,
    payloads: bool,
    trace: Mutex<Vec<TraceEvent>>,
}

impl<S: Store> RecordingStore<S> {
    /// Wraps `inner`, recording operations, addresses and sizes but not the bytes written.
    pub fn new(inner: S) -> Self {
        Self { inner, payloads: false, trace: Mutex::new(Vec::new()) }
    }

    /// Wraps `inner`, also recording the bytes of every write (the stored ciphertexts).
    pub fn with_payloads(inner: S) -> Self {
        Self { inner, payloads: true, trace: Mutex::new(Vec::new()) }
    }

    /// A copy of the trace so far.
    pub fn trace(&self) -> Vec<TraceEvent> {
        self.trace.lock().clone()
    }

    /// The trace so far, leaving an empty one behind.
    pub fn take_trace(&self) -> Vec<TraceEvent> {
        std::mem::take(&mut *self.trace.lock())
    }

    /// Forgets the trace so far.
    pub fn clear(&self) {
        self.trace.lock().clear();
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn record(&self, event: TraceEvent) {
        self.trace.lock().push(event);
    }

    /// Records a request of a capability trait (implemented elsewhere in this crate) as it is
    /// issued.
    pub(crate) fn record_event(&self, event: TraceEvent) {
        self.record(event);
    }

    /// Records an XOR request as it is issued.
    pub(crate) fn record_xor(&self, ranges: &[ByteRange]) {
        self.record(TraceEvent::new(
            TraceOp::ReadXor,
            ranges.iter().map(|r| r.cell).collect(),
            ranges.iter().map(|r| (r.offset, r.len)).collect(),
            ranges.first().map_or(0, |r| u64::from(r.len)),
        ));
    }

    /// Records a write of `cells` (with their bytes when payloads are kept).
    fn record_write<B: AsRef<Vec<u8>>>(&self, cells: &[(CellId, B)]) {
        let payloads = if self.payloads {
            cells.iter().map(|(_, b)| b.as_ref().clone()).collect()
        } else {
            Vec::new()
        };
        self.record(TraceEvent {
            payloads,
            ..TraceEvent::new(
                TraceOp::Write,
                cells.iter().map(|(c, _)| *c).collect(),
                Vec::new(),
                cells.iter().map(|(_, b)| b.as_ref().len() as u64).sum(),
            )
        });
    }
}

#[async_trait]
impl<S: Store> Store for RecordingStore<S> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>> {
        let cell_size = u64::from(self.inner.geometry().cell_size());
        self.record(TraceEvent::new(
            TraceOp::Read,
            cells.to_vec(),
            Vec::new(),
            cells.len() as u64 * cell_size,
        ));
        self.inner.read(cells).await
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        self.record(TraceEvent::new(
            TraceOp::ReadRanges,
            ranges.iter().map(|r| r.cell).collect(),
            ranges.iter().map(|r| (r.offset, r.len)).collect(),
            ranges.iter().map(|r| u64::from(r.len)).sum(),
        ));
        self.inner.read_ranges(ranges).await
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        self.record_write(&cells);
        self.inner.write(cells).await
    }

    async fn write_shared(&self, cells: Vec<(CellId, std::sync::Arc<Vec<u8>>)>) -> Result<()> {
        self.record_write(&cells);
        self.inner.write_shared(cells).await
    }

    async fn flush(&self) -> Result<()> {
        self.record(TraceEvent::new(TraceOp::Flush, Vec::new(), Vec::new(), 0));
        self.inner.flush().await
    }
    fn writes_may_be_retried(&self) -> bool {
        self.inner.writes_may_be_retried()
    }
}
