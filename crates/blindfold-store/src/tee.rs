//! [`TeeStore`]: the third server-side capability — the host half of the TEE-assisted design
//! (seed 004 §III-D and §III-E), in which a trusted component next to the data picks query
//! targets and permutes and re-encrypts blocks during eviction, so neither the choice nor the
//! permutation crosses the trust boundary in the clear.
//!
//! Two parties share the storage server:
//!
//! * the **trusted component** ([`Trusted`], implemented by the enclave crate): pure,
//!   synchronous, CPU-heavy; it opens tickets sealed by the gateway and never does I/O;
//! * the **untrusted host** ([`TeeHost`]): reads the cells a request names, hands them to the
//!   trusted component and writes what comes back. It sees only which cells are read and
//!   written, the sizes, and opaque tickets.
//!
//! [`TeeStore::tee_query`] reads the query's cells into one buffer and asks the trusted
//! component for the sealed answer (the seed's `enclave_query`). [`TeeStore::tee_evict`] runs
//! one eviction round layer by layer ([`TeeRound`]): the blocks carried down (at first those
//! the gateway uploads) are appended to the layer's node, the trusted component permutes and
//! re-encrypts them all, the first ones go back into the node and the rest are carried to the
//! next layer. [`TeeHost`] overlaps the I/O with the trusted work as the seed's buffers do: it
//! reads layer `i + 1`'s node while layer `i` is evicted and writes layer `i`'s node while
//! layer `i + 1` is evicted, holding at most three layer buffers.
//!
//! Same shape as the other capabilities: a trait on top of [`Store`], passed through
//! (counted, recorded, delayed, failed) by the wrappers, forwarded by
//! [`RemoteStore`](crate::RemoteStore) to a storage server that runs a trusted component, and
//! opened from a URL by [`open_tee_store`].
//!
//! # Limits
//!
//! Everything a gateway (or a peer of the storage server) sends is checked by
//! [`check_tee_query`] and [`check_tee_round`] before anything is read, allocated or written:
//! at most [`MAX_TEE_CELLS`] cells per query and per layer buffer, [`MAX_TEE_LAYERS`] layers,
//! [`MAX_TEE_TICKET`] bytes per ticket and [`MAX_TEE_BUFFER_BYTES`] bytes in one buffer of
//! blocks, so a hostile request cannot make the host allocate without bound. The trusted
//! component's answer to a query may be at most [`MAX_TEE_ANSWER_OVERHEAD`] bytes longer than
//! a cell.
//!
//! # Security
//!
//! The host learns the cells each request reads and writes, their number and the sizes of
//! tickets, incoming blocks and answers — what a [`Store::read`] and [`Store::write`] of the
//! same cells would tell it. The order of its own store requests is a function of that public
//! shape only (never of the tickets' contents or of timing). Which candidate a query selects
//! and how blocks move during eviction are inside the tickets, sealed for the trusted
//! component. Without a real enclave, the trusted component runs in the host's process, and
//! whoever runs the host is trusted with the key.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use crate::{
    ByteRange, CellId, CountingStore, FaultStore, Geometry, JitterStore, LatencyStore, LinkConfig,
    RecordingStore, Result, Store, StoreError, StoreUrl, TraceEvent, TraceOp,
};

/// Most cells one query reads, and most blocks in one layer's buffer (its node's cells plus the
/// blocks carried in): 65 536. The seed's buffers hold a few thousand.
pub const MAX_TEE_CELLS: usize = 1 << 16;
/// Most layers in one eviction round: 256 (a tree far higher than any store holds).
pub const MAX_TEE_LAYERS: usize = 256;
/// Longest ticket: 1 MiB (an eviction ticket's permutation of [`MAX_TEE_CELLS`] positions takes
/// 256 KiB).
pub const MAX_TEE_TICKET: usize = 1 << 20;
/// Most bytes in one buffer of blocks (a query's candidates, a layer's buffer, a round's
/// incoming blocks): 256 MiB.
pub const MAX_TEE_BUFFER_BYTES: usize = 256 << 20;
/// How much longer than a cell a query's answer may be: 4 KiB (sealing adds a nonce and a tag).
pub const MAX_TEE_ANSWER_OVERHEAD: usize = 4096;

/// The trusted component as the untrusted host calls it (implemented by the enclave crate's
/// `Enclave`).
///
/// Both calls are synchronous. [`TeeHost`] runs a query of at most 64 KiB of candidates on the
/// async executor (microseconds of work), larger ones on tokio's blocking pool, and every
/// eviction on a thread of its own at a lower priority. A refused ticket or block should come
/// back as [`StoreError::InvalidRequest`].
pub trait Trusted: Send + Sync + fmt::Debug {
    /// Selects one of `candidates` as the sealed `ticket` says, obliviously, and returns the
    /// answer sealed for the gateway (the seed's `enclave_query`).
    fn query(&self, candidates: &[Vec<u8>], ticket: &[u8]) -> Result<Vec<u8>>;

    /// Permutes and re-encrypts `blocks` in place as the sealed `ticket` says (the seed's
    /// `evict`). Every block keeps its length.
    fn evict(&self, blocks: &mut [Vec<u8>], ticket: &[u8]) -> Result<()>;
}

/// One layer of an eviction round: the node's cells to read, the cells to write back, and the
/// sealed ticket of the layer's permutation.
#[derive(Clone, PartialEq, Eq)]
pub struct TeeLayer {
    /// Cells read into the front of the layer's buffer, in order.
    pub read: Vec<CellId>,
    /// Cells the first `write.len()` blocks of the permuted buffer go to (as many as `read`).
    pub write: Vec<CellId>,
    /// The layer's eviction ticket, opened only by the trusted component.
    pub ticket: Vec<u8>,
}

impl fmt::Debug for TeeLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TeeLayer")
            .field("read", &self.read)
            .field("write", &self.write)
            .field("ticket_len", &self.ticket.len())
            .finish()
    }
}

/// One eviction round ([`TeeStore::tee_evict`]): the blocks the gateway uploads and the layers
/// they are evicted through, top to bottom.
#[derive(Clone, PartialEq, Eq)]
pub struct TeeRound {
    /// The blocks carried into the first layer, each exactly one cell long.
    pub incoming: Vec<Vec<u8>>,
    /// The layers, in order; at least one.
    pub layers: Vec<TeeLayer>,
}

impl fmt::Debug for TeeRound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TeeRound")
            .field("incoming", &self.incoming.len())
            .field("layers", &self.layers)
            .finish()
    }
}

impl TeeRound {
    /// Bytes the gateway sends for the round: the incoming blocks and the tickets.
    pub fn bytes_sent(&self) -> u64 {
        let blocks: u64 = self.incoming.iter().map(|b| b.len() as u64).sum();
        blocks + self.layers.iter().map(|l| l.ticket.len() as u64).sum::<u64>()
    }

    /// Cells the round reads and writes, over all layers.
    pub fn cells(&self) -> (u64, u64) {
        let read = self.layers.iter().map(|l| l.read.len() as u64).sum();
        let written = self.layers.iter().map(|l| l.write.len() as u64).sum();
        (read, written)
    }
}

/// A store whose host runs a trusted component next to the data.
///
/// Contract (a bad request fails whole, before anything is read or written, with
/// [`StoreError::InvalidRequest`] or [`StoreError::OutOfRange`]):
///
/// * [`tee_query`](Self::tee_query) reads `cells` (in range, at least one) and returns what the
///   trusted component answers for them and `ticket`;
/// * [`tee_evict`](Self::tee_evict) runs the round as [`TeeRound`] and
///   [`check_tee_round`] describe: `carry = incoming`; for each layer in order, `buf =
///   read(layer.read) ++ carry`, the trusted component evicts `buf` with the layer's ticket,
///   `buf[k]` is written to `layer.write[k]` for `k < layer.write.len()`, and `carry` becomes
///   the rest of `buf`; the carry left after the last layer is dropped. A layer sees the
///   writes of the layers before it. A failure part-way (of the store or of the trusted
///   component) may leave earlier layers written.
///
/// Unlike the [`Store`] calls, a round is not idempotent: after a failure, even a retryable
/// one, it may have run wholly or in part, and a real trusted component refuses its tickets a
/// second time (they carry the round and layer), so the caller recovers with a new round
/// rather than retrying this one.
///
/// # Security
///
/// The store learns the cells each request reads and writes and the sizes of tickets, blocks
/// and answers, not the tickets' contents: which candidate a query selects and how a round
/// permutes the blocks stay sealed for the trusted component. Without a real enclave the
/// trusted component runs in the host's process, and whoever runs the host holds the key.
#[async_trait]
pub trait TeeStore: Store {
    /// Reads `cells`, hands them to the trusted component with `ticket`, returns its answer.
    async fn tee_query(&self, cells: &[CellId], ticket: &[u8]) -> Result<Vec<u8>>;

    /// Runs one eviction round (see the trait docs).
    async fn tee_evict(&self, round: &TeeRound) -> Result<()>;
}

fn invalid(what: impl Into<String>) -> StoreError {
    StoreError::InvalidRequest(what.into())
}

fn check_ticket(ticket: &[u8], what: &str) -> Result<()> {
    if ticket.len() > MAX_TEE_TICKET {
        return Err(invalid(format!(
            "{what}: a ticket of {} bytes (at most {MAX_TEE_TICKET})",
            ticket.len()
        )));
    }
    Ok(())
}

/// Checks that `blocks` blocks of one cell each may be held in one buffer.
fn check_buffer(geometry: &Geometry, blocks: usize, what: &str) -> Result<()> {
    let bytes = blocks.saturating_mul(geometry.cell_size() as usize);
    if blocks > MAX_TEE_CELLS || bytes > MAX_TEE_BUFFER_BYTES {
        return Err(invalid(format!(
            "{what}: {blocks} blocks of {} bytes (at most {MAX_TEE_CELLS} blocks and \
             {MAX_TEE_BUFFER_BYTES} bytes)",
            geometry.cell_size()
        )));
    }
    Ok(())
}

/// Checks a query against `geometry`: at least one cell, every cell in range, the candidates
/// and the ticket within the limits ([`MAX_TEE_CELLS`], [`MAX_TEE_BUFFER_BYTES`],
/// [`MAX_TEE_TICKET`]).
pub fn check_tee_query(geometry: &Geometry, cells: &[CellId], ticket: &[u8]) -> Result<()> {
    if cells.is_empty() {
        return Err(invalid("a TEE query with no cells"));
    }
    check_buffer(geometry, cells.len(), "TEE query")?;
    check_ticket(ticket, "TEE query")?;
    for &c in cells {
        geometry.check_cell(c)?;
    }
    Ok(())
}

/// Checks a round against `geometry`: at least one layer and at most [`MAX_TEE_LAYERS`]; every
/// incoming block exactly one cell long; in each layer as many cells written as read, every cell
/// in range, the buffer (cells read plus blocks carried) and the ticket within the limits
/// ([`MAX_TEE_CELLS`], [`MAX_TEE_BUFFER_BYTES`], [`MAX_TEE_TICKET`]).
pub fn check_tee_round(geometry: &Geometry, round: &TeeRound) -> Result<()> {
    if round.layers.is_empty() {
        return Err(invalid("a TEE eviction round with no layers"));
    }
    if round.layers.len() > MAX_TEE_LAYERS {
        return Err(invalid(format!(
            "a TEE eviction round of {} layers (at most {MAX_TEE_LAYERS})",
            round.layers.len()
        )));
    }
    let cell = geometry.cell_size() as usize;
    check_buffer(geometry, round.incoming.len(), "TEE eviction round's incoming blocks")?;
    if let Some((i, b)) = round.incoming.iter().enumerate().find(|(_, b)| b.len() != cell) {
        return Err(invalid(format!(
            "TEE eviction round: incoming block {i} has {} bytes, cells are {cell} bytes",
            b.len()
        )));
    }
    for (i, layer) in round.layers.iter().enumerate() {
        if layer.read.len() != layer.write.len() {
            return Err(invalid(format!(
                "TEE eviction round: layer {i} reads {} cells but writes {}",
                layer.read.len(),
                layer.write.len()
            )));
        }
        check_buffer(
            geometry,
            layer.read.len().saturating_add(round.incoming.len()),
            &format!("TEE eviction round, layer {i}"),
        )?;
        check_ticket(&layer.ticket, &format!("TEE eviction round, layer {i}"))?;
        for &c in layer.read.iter().chain(&layer.write) {
            geometry.check_cell(c)?;
        }
    }
    Ok(())
}

/// Longest answer a query may get on an array of `geometry`.
pub fn tee_answer_max(geometry: &Geometry) -> usize {
    geometry.cell_size() as usize + MAX_TEE_ANSWER_OVERHEAD
}

/// Bytes [`TeeHost`] holds at most while it answers a checked query: the candidates and the
/// answer.
pub fn tee_query_bytes(geometry: &Geometry, cells: &[CellId]) -> usize {
    cells
        .len()
        .saturating_mul(geometry.cell_size() as usize)
        .saturating_add(tee_answer_max(geometry))
}

/// Bytes [`TeeHost`] holds at most while it runs a checked round: the incoming blocks and three
/// layer buffers (one prefetched, one being evicted, one being written).
pub fn tee_round_bytes(geometry: &Geometry, round: &TeeRound) -> usize {
    let cell = geometry.cell_size() as usize;
    let widest = round.layers.iter().map(|l| l.read.len()).max().unwrap_or(0);
    let buffer = widest.saturating_add(round.incoming.len()).saturating_mul(cell);
    round.incoming.len().saturating_mul(cell).saturating_add(buffer.saturating_mul(3))
}

/// Largest query (the candidates' bytes) the host's trusted component answers on the async
/// executor itself rather than on tokio's blocking pool: 64 KiB, about 20 µs of work.
const INLINE_QUERY_BYTES: usize = 64 << 10;

/// Runs CPU-heavy work (the trusted component's calls, homomorphic selects) off the async
/// executor; `what` names it if the task is cancelled.
pub(crate) async fn off_executor<T: Send + 'static>(
    what: &str,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(join) => Err(invalid(format!("{what} cancelled: {join}"))),
    }
}

/// The untrusted host of the TEE design: any [`Store`] plus a [`Trusted`] component, offering
/// [`TeeStore`]. [`Store`] calls pass through unchanged.
///
/// It keeps no state between calls and takes no lock, so queries run while a round is in
/// flight (the gateway reads other cells meanwhile, and must not query the cells a round is
/// rewriting). Small queries run on the executor, large ones on tokio's blocking pool, eviction
/// layers on threads of their own, less urgent than everything else.
///
/// A round issues its store requests in a fixed order that depends only on the round's shape:
/// the first layer's read, then for each layer `i` the write of layer `i - 1` and the read of
/// layer `i + 1` while layer `i` is evicted, then the last write. A layer whose read shares a
/// cell with the writes of one of the two layers before it is read only after those writes
/// (still a function of the shape), so every layer sees what earlier layers wrote.
pub struct TeeHost<S> {
    inner: S,
    trusted: Arc<dyn Trusted>,
}

impl<S: fmt::Debug> fmt::Debug for TeeHost<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TeeHost")
            .field("inner", &self.inner)
            .field("trusted", &self.trusted)
            .finish()
    }
}

impl<S: Store> TeeHost<S> {
    /// Hosts `trusted` over `inner`.
    pub fn new(inner: S, trusted: Arc<dyn Trusted>) -> Self {
        Self { inner, trusted }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The trusted component.
    pub fn trusted(&self) -> &Arc<dyn Trusted> {
        &self.trusted
    }

    /// Evicts `buf` with `ticket` off the executor; checks the blocks are still one cell each.
    async fn evict(&self, buf: Vec<Vec<u8>>, ticket: &[u8], layer: usize) -> Result<Vec<Vec<u8>>> {
        let trusted = Arc::clone(&self.trusted);
        let ticket = ticket.to_vec();
        let blocks = buf.len();
        let started = std::time::Instant::now();
        let (buf, busy_ms) = in_background(move || {
            let started = std::time::Instant::now();
            let mut buf = buf;
            trusted.evict(&mut buf, &ticket)?;
            Ok((buf, started.elapsed().as_secs_f64() * 1e3))
        })
        .await?;
        tracing::debug!(
            layer,
            blocks,
            evict_ms = busy_ms,
            total_ms = started.elapsed().as_secs_f64() * 1e3,
            "evicted a layer"
        );
        let cell = self.inner.geometry().cell_size() as usize;
        if let Some(b) = buf.iter().find(|b| b.len() != cell) {
            return Err(invalid(format!(
                "the trusted component returned a block of {} bytes at layer {layer} (cells are \
                 {cell} bytes)",
                b.len()
            )));
        }
        Ok(buf)
    }
}

/// How much nicer than the rest of the process the threads that run eviction layers are: the
/// trusted component's permutation takes tens of milliseconds of CPU per layer, and at the same
/// priority it would share the cores equally with the queries (tens of microseconds each) that
/// arrive meanwhile. Ten steps nicer, the scheduler runs a waking query first; eviction still
/// gets every idle cycle, and when it falls behind the gateway's ring fills and queries wait
/// for it.
const EVICTION_NICER: i32 = 10;

/// Runs an eviction layer on a thread of its own, [`EVICTION_NICER`] (threads the trusted
/// component starts inherit its priority). A fresh thread, not one of tokio's blocking pool: a thread
/// cannot raise its priority again, and the pool's threads serve queries' reads too.
async fn in_background<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("tee-evict".into())
        .spawn(move || {
            lower_priority();
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)));
        })
        .map_err(|e| StoreError::io("starting an eviction thread", e))?;
    match rx.await {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => Err(invalid("the eviction thread ended without an answer")),
    }
}

/// Makes the calling thread [`EVICTION_NICER`] than it was, at most 19 (on Linux
/// `getpriority`/`setpriority` with `who = 0` apply to the calling thread only); a refusal
/// only costs latency.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpriority_process, setpriority_process};
        let lowered = getpriority_process(None)
            .and_then(|now| setpriority_process(None, (now + EVICTION_NICER).min(19)));
        if let Err(e) = lowered {
            tracing::debug!(error = %e, "could not lower the eviction thread's priority");
        }
    }
}

/// Whether `a` and `b` share a cell.
fn overlap(a: &[CellId], b: &[CellId]) -> bool {
    if a.is_empty() || b.is_empty() {
        return false;
    }
    let set: HashSet<CellId> = a.iter().copied().collect();
    b.iter().any(|c| set.contains(c))
}

#[async_trait]
impl<S: Store> Store for TeeHost<S> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>> {
        self.inner.read(cells).await
    }
    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        self.inner.read_ranges(ranges).await
    }
    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        self.inner.write(cells).await
    }
    async fn flush(&self) -> Result<()> {
        self.inner.flush().await
    }
}

type WriteFuture<'a> = futures::future::BoxFuture<'a, Result<()>>;

#[async_trait]
impl<S: Store> TeeStore for TeeHost<S> {
    async fn tee_query(&self, cells: &[CellId], ticket: &[u8]) -> Result<Vec<u8>> {
        let geometry = self.inner.geometry();
        check_tee_query(&geometry, cells, ticket)?;
        let candidates = self.inner.read(cells).await?;
        // A query is one pass over its candidates (microseconds for a path of small blocks):
        // small ones run here, since a hop to the blocking pool and back costs more than the
        // work; large ones go off the executor.
        let work: usize = candidates.iter().map(Vec::len).sum();
        let answer = if work <= INLINE_QUERY_BYTES {
            self.trusted.query(&candidates, ticket)?
        } else {
            let trusted = Arc::clone(&self.trusted);
            let ticket = ticket.to_vec();
            off_executor("trusted component call", move || trusted.query(&candidates, &ticket))
                .await?
        };
        if answer.len() > tee_answer_max(&geometry) {
            return Err(invalid(format!(
                "the trusted component answered with {} bytes (at most {})",
                answer.len(),
                tee_answer_max(&geometry)
            )));
        }
        Ok(answer)
    }

    async fn tee_evict(&self, round: &TeeRound) -> Result<()> {
        check_tee_round(&self.inner.geometry(), round)?;
        let started = std::time::Instant::now();
        let layers = &round.layers;
        // May layer `j`'s read be issued while the writes of layers `j - 1` and `j - 2` are
        // still in flight?
        let may_prefetch = |j: usize| {
            !overlap(&layers[j - 1].write, &layers[j].read)
                && (j < 2 || !overlap(&layers[j - 2].write, &layers[j].read))
        };
        let mut carry = round.incoming.clone();
        let mut prefetched: Option<Vec<Vec<u8>>> = None;
        let mut writing: Option<WriteFuture<'_>> = None;
        for (i, layer) in layers.iter().enumerate() {
            let mut buf = match prefetched.take() {
                Some(b) => b,
                None => self.inner.read(&layer.read).await?,
            };
            buf.append(&mut carry);
            let next = layers.get(i + 1).filter(|_| may_prefetch(i + 1));
            // Layer i is evicted while layer i - 1 is written and layer i + 1 read; the first
            // poll of each (which issues its request) happens in this order.
            let (evicted, written, read) = futures::join!(
                self.evict(buf, &layer.ticket, i),
                async {
                    match writing.take() {
                        Some(w) => w.await,
                        None => Ok(()),
                    }
                },
                async {
                    match next {
                        Some(l) => self.inner.read(&l.read).await.map(Some),
                        None => Ok(None),
                    }
                },
            );
            written?;
            prefetched = read?;
            let mut buf = evicted?;
            carry = buf.split_off(layer.write.len());
            let cells: Vec<(CellId, Vec<u8>)> = layer.write.iter().copied().zip(buf).collect();
            let write = self.inner.write(cells);
            if layers.get(i + 1).is_some() && !may_prefetch(i + 1) {
                // The next layer reads what this one writes: write first.
                write.await?;
            } else {
                writing = Some(write);
            }
        }
        if let Some(w) = writing {
            w.await?;
        }
        tracing::debug!(
            layers = layers.len(),
            round_ms = started.elapsed().as_secs_f64() * 1e3,
            "carried out a round"
        );
        Ok(())
    }
}

#[async_trait]
impl<S: TeeStore + ?Sized> TeeStore for Arc<S> {
    async fn tee_query(&self, cells: &[CellId], ticket: &[u8]) -> Result<Vec<u8>> {
        (**self).tee_query(cells, ticket).await
    }
    async fn tee_evict(&self, round: &TeeRound) -> Result<()> {
        (**self).tee_evict(round).await
    }
}

#[async_trait]
impl<S: TeeStore + ?Sized> TeeStore for Box<S> {
    async fn tee_query(&self, cells: &[CellId], ticket: &[u8]) -> Result<Vec<u8>> {
        (**self).tee_query(cells, ticket).await
    }
    async fn tee_evict(&self, round: &TeeRound) -> Result<()> {
        (**self).tee_evict(round).await
    }
}

// ---- What the wrappers see of a TEE request ----------------------------------------------------

#[async_trait]
impl<S: TeeStore> TeeStore for CountingStore<S> {
    async fn tee_query(&self, cells: &[CellId], ticket: &[u8]) -> Result<Vec<u8>> {
        self.count_tee_query(cells.len() as u64, ticket.len() as u64);
        let answer = self.inner().tee_query(cells, ticket).await?;
        self.count_tee_answer(answer.len() as u64);
        Ok(answer)
    }
    async fn tee_evict(&self, round: &TeeRound) -> Result<()> {
        let (read, written) = round.cells();
        self.count_tee_round(read, written, round.bytes_sent());
        self.inner().tee_evict(round).await
    }
}

#[async_trait]
impl<S: TeeStore> TeeStore for RecordingStore<S> {
    async fn tee_query(&self, cells: &[CellId], ticket: &[u8]) -> Result<Vec<u8>> {
        self.record_event(TraceEvent::new(
            TraceOp::TeeQuery,
            cells.to_vec(),
            Vec::new(),
            ticket.len() as u64,
        ));
        self.inner().tee_query(cells, ticket).await
    }
    async fn tee_evict(&self, round: &TeeRound) -> Result<()> {
        let cell = u64::from(self.geometry().cell_size());
        self.record_event(TraceEvent {
            groups: round.layers.iter().map(|l| l.read.len() as u32).collect(),
            ..TraceEvent::new(TraceOp::TeeEvict, Vec::new(), Vec::new(), round.bytes_sent())
        });
        for l in &round.layers {
            let n = l.read.len() as u64;
            self.record_event(TraceEvent::new(TraceOp::Read, l.read.clone(), Vec::new(), n * cell));
            self.record_event(TraceEvent::new(
                TraceOp::Write,
                l.write.clone(),
                Vec::new(),
                n * cell,
            ));
        }
        self.inner().tee_evict(round).await
    }
}

#[async_trait]
impl<S: TeeStore> TeeStore for LatencyStore<S> {
    async fn tee_query(&self, cells: &[CellId], ticket: &[u8]) -> Result<Vec<u8>> {
        let up = cells.len() as u64 * LinkConfig::ADDRESS_BYTES + ticket.len() as u64;
        self.across_link(up, self.inner().tee_query(cells, ticket), |r| {
            r.as_ref().map_or(0, |a| a.len() as u64)
        })
        .await
    }
    async fn tee_evict(&self, round: &TeeRound) -> Result<()> {
        let (read, written) = round.cells();
        let up = round.bytes_sent() + (read + written) * LinkConfig::ADDRESS_BYTES;
        self.across_link(up, self.inner().tee_evict(round), |_| 0).await
    }
}

#[async_trait]
impl<S: TeeStore> TeeStore for FaultStore<S> {
    async fn tee_query(&self, cells: &[CellId], ticket: &[u8]) -> Result<Vec<u8>> {
        self.before_read("tee_query").await?;
        self.inner().tee_query(cells, ticket).await
    }
    async fn tee_evict(&self, round: &TeeRound) -> Result<()> {
        self.around_write("tee_evict", self.inner().tee_evict(round)).await
    }
}

#[async_trait]
impl<S: TeeStore> TeeStore for JitterStore<S> {
    async fn tee_query(&self, cells: &[CellId], ticket: &[u8]) -> Result<Vec<u8>> {
        self.delayed(self.inner().tee_query(cells, ticket)).await
    }
    async fn tee_evict(&self, round: &TeeRound) -> Result<()> {
        self.delayed(self.inner().tee_evict(round)).await
    }
}

// ---- Opening by URL ---------------------------------------------------------------------------

/// Opens (creating if needed) the array `name` at `url` as a [`TeeStore`].
///
/// * `remote://` gives the [`RemoteStore`](crate::RemoteStore): the trusted component runs in
///   the storage server (started with one), so `trusted` must be `None`;
/// * every local backend of [`open_store`](crate::open_store) (`memory:`, `file:`, `s3://`,
///   `redis://`) is wrapped in a [`TeeHost`] running `trusted` in this process — for tests and
///   benchmarks, since then this process holds the key; without one it is an error.
pub async fn open_tee_store(
    url: &StoreUrl,
    name: &str,
    geometry: Geometry,
    trusted: Option<Arc<dyn Trusted>>,
) -> Result<Arc<dyn TeeStore>> {
    match (url, trusted) {
        (StoreUrl::Remote { addr, key_file }, None) => {
            crate::url::check_name(name)?;
            let key = key_file.as_deref().map(crate::remote::AuthKey::load).transpose()?;
            Ok(Arc::new(crate::RemoteStore::open(addr, key, name, geometry).await?))
        }
        (StoreUrl::Remote { .. }, Some(_)) => Err(StoreError::InvalidConfig(
            "a remote:// store runs its trusted component in the storage server (started with \
             --enclave-key); do not pass an in-process one"
                .into(),
        )),
        (_, None) => Err(StoreError::InvalidConfig(format!(
            "the TEE design on {url} needs a trusted component: pass an in-process one (tests \
             and benchmarks only) or use remote:// with a storage server started with \
             --enclave-key"
        ))),
        (_, Some(trusted)) => {
            let store = crate::open_store(url, name, geometry).await?;
            Ok(Arc::new(TeeHost::new(store, trusted)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_finds_shared_cells() {
        assert!(!overlap(&[], &[CellId(1)]));
        assert!(!overlap(&[CellId(1), CellId(2)], &[CellId(3)]));
        assert!(overlap(&[CellId(1), CellId(2)], &[CellId(3), CellId(2)]));
    }

    #[test]
    fn round_bytes_cover_three_buffers_and_the_incoming() {
        let g = Geometry::new(100, 10).unwrap();
        let layer = |n: u64| TeeLayer {
            read: (0..n).map(CellId).collect(),
            write: (0..n).map(CellId).collect(),
            ticket: vec![0; 3],
        };
        let round = TeeRound { incoming: vec![vec![0; 10]; 2], layers: vec![layer(4), layer(6)] };
        assert_eq!(tee_round_bytes(&g, &round), 20 + 3 * 80);
        assert_eq!(round.bytes_sent(), 26);
        assert_eq!(round.cells(), (10, 10));
    }
}
