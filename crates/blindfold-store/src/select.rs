//! [`SelectStore`]: the second server-side computation capability — Onion ORAM's homomorphic
//! select (seed 002 Algorithms 8–11). The client sends one Damgård–Jurik ciphertext per slot (an
//! encrypted unit vector) and the ranges holding the slots' data; the store raises each
//! selector element to each chunk of its slot's data, multiplies per chunk, and returns one slot's
//! worth of ciphertexts, which encrypt exactly the slot the client chose.
//!
//! Three operations, all built on one select over equal-length slots:
//! * [`SelectStore::read_select`]: one select, answered to the client;
//! * [`SelectStore::read_select_combined`]: Onion ORAM's access — one select per bucket of a
//!   path (the buckets' slots may hold different onion layers), whose answers the store
//!   combines with one more select, so one block's worth of bytes comes back;
//! * [`SelectStore::write_select`]: Onion ORAM's triplet eviction — selects whose answers the
//!   store keeps in cells instead of returning them.
//!
//! Same shape as [`XorStore`]: a trait on top of [`Store`], implemented by the backends that
//! compute locally (memory, file) and by [`RemoteStore`](crate::RemoteStore) (the storage server
//! computes), passed through by the counting, recording, latency and fault wrappers, and opened
//! from a URL by [`open_select_store`].

use std::sync::Arc;

use async_trait::async_trait;
use blindfold_dj::{Ciphertext, DjError, Integer, PublicKey};

use crate::{
    ByteRange, CellId, CountingStore, FaultStore, FileStore, Geometry, LatencyStore, LinkConfig,
    MemoryStore, RecordingStore, Result, Store, StoreError, StoreUrl, TraceEvent, TraceOp,
    XorStore,
};

/// One homomorphic select over stored slots.
///
/// Slot `i` is `ranges[i]`; its bytes are read as consecutive `chunk_len`-byte big-endian
/// numbers, each of which must lie below `n^s` (for Onion ORAM they are the encodings of
/// layer-`(s-1)` ciphertexts, or raw data chunks at the bottom layer). The answer's chunk `j`
/// is `Π_i selector[i] ^ chunk_j(slot i) mod n^(s+1)`, a layer-`s` ciphertext.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectRequest {
    /// The public key the selector was made with (only `n` is used).
    pub public_key: Arc<PublicKey>,
    /// One encrypted selector element per range, all of one layer `s`.
    pub selector: Vec<Ciphertext>,
    /// The slots, one per selector element, all of one length (a multiple of `chunk_len`).
    pub ranges: Vec<ByteRange>,
    /// Bytes per chunk of slot data.
    pub chunk_len: u32,
}

/// Several selects (typically one per bucket of a path, each over its own slots and at its own
/// layer) combined by one more: the answer of group `g` is zero-padded at its end to the
/// longest answer rounded up to a whole number of `plaintext_chunk_len(S)`-byte chunks (`S` the
/// layer of `outer`), and the store returns the select of those padded answers under `outer`
/// (one element per group), chunk by chunk: layer-`S` ciphertexts. The client peels that layer,
/// cuts the padding (it knows the chosen group's answer length) and peels on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CombinedSelect {
    /// The per-group selects; all must use the same public key.
    pub groups: Vec<SelectRequest>,
    /// One encrypted selector element per group, all of one layer.
    pub outer: Vec<Ciphertext>,
}

/// One select whose answer the store keeps: computed as [`SelectStore::read_select`] would
/// answer `request`, then written into cell `target`, zero-padded to a whole cell (the answer
/// must fit).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectWrite {
    /// The select.
    pub request: SelectRequest,
    /// Where its answer goes.
    pub target: CellId,
}

/// A store that can compute Onion ORAM's homomorphic select over its cells.
///
/// Contract:
///
/// * every range must lie inside its cell and all must have one length, a non-zero multiple of
///   `chunk_len`; there must be one selector element per range, at least one, all of one layer;
///   every chunk must be below `n^s`. A bad request fails whole with
///   [`StoreError::InvalidRequest`] (or the range errors of [`Store::read_ranges`]);
/// * the answer is the concatenation, chunk by chunk, of the layer-`s` ciphertexts of the select
///   (each [`PublicKey::ciphertext_len`]`(s)` bytes, as `ciphertext_to_bytes` writes them):
///   exactly what [`select_locally`] computes from a [`Store::read_ranges`] of the ranges.
///
/// # Security
///
/// The store learns what a [`Store::read_ranges`] of the same ranges would tell it, plus the
/// selector ciphertexts, which under the decisional composite residuosity assumption say nothing
/// about which slot is selected. It returns one slot's worth of ciphertexts instead of all slots.
#[async_trait]
pub trait SelectStore: Store {
    /// Computes the select of `request` over this store's cells.
    async fn read_select(&self, request: &SelectRequest) -> Result<Vec<u8>>;

    /// Computes every group's select, combines the answers with `request.outer` (see
    /// [`CombinedSelect`]) and returns the combination. A bad request fails whole.
    async fn read_select_combined(&self, request: &CombinedSelect) -> Result<Vec<u8>>;

    /// Computes the selects in order, each answer written into its target before the next
    /// select reads (so a later select may read what an earlier one wrote). Every request is
    /// checked before anything is computed or written: a bad one fails the batch whole. A
    /// failure while writing may leave earlier targets written.
    async fn write_select(&self, writes: &[SelectWrite]) -> Result<()>;
}

fn invalid(what: impl Into<String>) -> StoreError {
    StoreError::InvalidRequest(what.into())
}

fn dj_error(e: DjError) -> StoreError {
    invalid(format!("homomorphic select: {e}"))
}

/// Checks a select request against `geometry` (everything that does not need the data): the
/// ranges, their common length, the chunking, the selector's shape and layer. Returns the
/// layer `s`.
pub fn check_select(geometry: &Geometry, request: &SelectRequest) -> Result<u32> {
    for r in &request.ranges {
        geometry.check_range(r)?;
    }
    let Some(first) = request.selector.first() else {
        return Err(invalid("homomorphic select with an empty selector"));
    };
    if request.selector.len() != request.ranges.len() {
        return Err(invalid(format!(
            "homomorphic select: {} selector elements for {} ranges",
            request.selector.len(),
            request.ranges.len()
        )));
    }
    let layer = first.layer();
    if request.selector.iter().any(|c| c.layer() != layer) {
        return Err(invalid("homomorphic select: selector elements of different layers"));
    }
    let len = request.ranges[0].len;
    if request.ranges.iter().any(|r| r.len != len) {
        return Err(invalid("homomorphic select over ranges of different lengths"));
    }
    if request.chunk_len == 0 || len == 0 || !len.is_multiple_of(request.chunk_len) {
        return Err(invalid(format!(
            "homomorphic select: range length {len} is not a positive multiple of the chunk length {}",
            request.chunk_len
        )));
    }
    Ok(layer)
}

/// The select computed from the slots' bytes (`parts[i]` is range `i`'s data, already checked by
/// [`check_select`]): what every computing backend does, on the calling thread (it spreads the
/// chunks over all cores itself).
pub fn select_locally(request: &SelectRequest, parts: &[Vec<u8>]) -> Result<Vec<u8>> {
    let pk = &request.public_key;
    let chunk = request.chunk_len as usize;
    let layer = request.selector[0].layer();
    let blocks = parts
        .iter()
        .map(|part| {
            part.chunks(chunk)
                .map(|c| pk.plaintext_from_bytes(layer, c))
                .collect::<std::result::Result<Vec<Integer>, DjError>>()
        })
        .collect::<std::result::Result<Vec<_>, DjError>>()
        .map_err(dj_error)?;
    let out = pk.select_blocks(&request.selector, &blocks).map_err(dj_error)?;
    let mut bytes = Vec::with_capacity(out.len() * pk.ciphertext_len(layer).map_err(dj_error)?);
    for c in &out {
        bytes.extend_from_slice(&pk.ciphertext_to_bytes(c));
    }
    Ok(bytes)
}

/// Checks a combined select against `geometry`: every group as [`check_select`], one outer
/// element per group, all of one layer, and one public key throughout.
pub fn check_combined(geometry: &Geometry, request: &CombinedSelect) -> Result<u32> {
    let Some(first) = request.groups.first() else {
        return Err(invalid("combined select with no groups"));
    };
    if request.outer.len() != request.groups.len() {
        return Err(invalid(format!(
            "combined select: {} outer elements for {} groups",
            request.outer.len(),
            request.groups.len()
        )));
    }
    for g in &request.groups {
        if g.public_key.n() != first.public_key.n() {
            return Err(invalid("combined select: groups under different public keys"));
        }
        check_select(geometry, g)?;
    }
    let layer = request.outer[0].layer();
    if request.outer.iter().any(|c| c.layer() != layer) {
        return Err(invalid("combined select: outer elements of different layers"));
    }
    first.public_key.plaintext_chunk_len(layer).map_err(dj_error)?;
    Ok(layer)
}

/// Checks a batch of select writes against `geometry`: every request as [`check_select`], every
/// target in range, and every answer no longer than a cell.
pub fn check_select_writes(geometry: &Geometry, writes: &[SelectWrite]) -> Result<()> {
    for w in writes {
        let layer = check_select(geometry, &w.request)?;
        geometry.check_cell(w.target)?;
        let answer = answer_len(&w.request, layer)?;
        if answer > geometry.cell_size() as usize {
            return Err(invalid(format!(
                "select answer of {answer} bytes does not fit a cell of {} bytes",
                geometry.cell_size()
            )));
        }
    }
    Ok(())
}

/// Bytes of the answer to a checked select of layer `layer`.
fn answer_len(request: &SelectRequest, layer: u32) -> Result<usize> {
    let (Some(range), true) = (request.ranges.first(), request.chunk_len > 0) else {
        return Err(invalid("homomorphic select with no ranges or a zero chunk length"));
    };
    let chunks = (range.len / request.chunk_len) as usize;
    chunks
        .checked_mul(request.public_key.ciphertext_len(layer).map_err(dj_error)?)
        .ok_or_else(|| invalid("homomorphic select answer too long"))
}

/// Bytes of the answer [`SelectStore::read_select`] gives for `request`, after checking it with
/// [`check_select`].
pub fn select_answer_len(geometry: &Geometry, request: &SelectRequest) -> Result<usize> {
    let layer = check_select(geometry, request)?;
    answer_len(request, layer)
}

/// Bytes of the answer [`SelectStore::read_select_combined`] gives for `request`, after checking
/// it with [`check_combined`]: the longest group answer, padded to whole chunks of the outer
/// layer, as that layer's ciphertexts.
pub fn combined_answer_len(geometry: &Geometry, request: &CombinedSelect) -> Result<usize> {
    let layer = check_combined(geometry, request)?;
    let mut longest = 1usize;
    for g in &request.groups {
        // Checked above: every group has a selector, all of one layer.
        longest = longest.max(answer_len(g, g.selector[0].layer())?);
    }
    let pk = &request.groups[0].public_key;
    let chunk = pk.plaintext_chunk_len(layer).map_err(dj_error)?;
    if chunk == 0 {
        return Err(invalid("combined select: an outer layer with empty chunks"));
    }
    longest
        .div_ceil(chunk)
        .checked_mul(pk.ciphertext_len(layer).map_err(dj_error)?)
        .ok_or_else(|| invalid("combined select answer too long"))
}

/// Combines group answers (already computed) with the outer selector, as [`CombinedSelect`]
/// describes.
pub fn combine_locally(request: &CombinedSelect, answers: Vec<Vec<u8>>) -> Result<Vec<u8>> {
    let pk = &request.groups[0].public_key;
    let layer = request.outer[0].layer();
    let chunk = pk.plaintext_chunk_len(layer).map_err(dj_error)?;
    let longest = answers.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let len = longest.div_ceil(chunk) * chunk;
    let parts: Vec<Vec<u8>> = answers
        .into_iter()
        .map(|mut a| {
            a.resize(len, 0);
            a
        })
        .collect();
    let outer = SelectRequest {
        public_key: Arc::clone(pk),
        selector: request.outer.clone(),
        ranges: Vec::new(),
        chunk_len: chunk as u32,
    };
    select_locally(&outer, &parts)
}

/// [`SelectStore::read_select_combined`] for any store: checks, reads every group's ranges in
/// one batch, computes off the executor.
pub async fn combined_by_reading<S: Store + ?Sized>(
    store: &S,
    request: &CombinedSelect,
) -> Result<Vec<u8>> {
    check_combined(&store.geometry(), request)?;
    let ranges: Vec<ByteRange> =
        request.groups.iter().flat_map(|g| g.ranges.iter().copied()).collect();
    let mut parts = store.read_ranges(&ranges).await?.into_iter();
    let grouped: Vec<Vec<Vec<u8>>> =
        request.groups.iter().map(|g| parts.by_ref().take(g.ranges.len()).collect()).collect();
    let request = request.clone();
    crate::tee::off_executor("homomorphic select", move || {
        let answers = request
            .groups
            .iter()
            .zip(&grouped)
            .map(|(g, parts)| select_locally(g, parts))
            .collect::<Result<Vec<_>>>()?;
        combine_locally(&request, answers)
    })
    .await
}

/// [`SelectStore::write_select`] for any store: checks the whole batch, then for each select
/// reads its ranges, computes off the executor and writes the padded answer.
pub async fn write_select_by_reading<S: Store + ?Sized>(
    store: &S,
    writes: &[SelectWrite],
) -> Result<()> {
    let geometry = store.geometry();
    check_select_writes(&geometry, writes)?;
    for w in writes {
        let parts = store.read_ranges(&w.request.ranges).await?;
        let request = w.request.clone();
        let cell = geometry.cell_size() as usize;
        let answer = crate::tee::off_executor("homomorphic select", move || {
            let mut a = select_locally(&request, &parts)?;
            a.resize(cell, 0);
            Ok(a)
        })
        .await?;
        store.write(vec![(w.target, answer)]).await?;
    }
    Ok(())
}

/// Checks, reads the ranges and computes the select off the async executor (each chunk costs
/// milliseconds): correct for any store, and what the memory and file backends do.
pub async fn select_by_reading<S: Store + ?Sized>(
    store: &S,
    request: &SelectRequest,
) -> Result<Vec<u8>> {
    check_select(&store.geometry(), request)?;
    let parts = store.read_ranges(&request.ranges).await?;
    let request = request.clone();
    crate::tee::off_executor("homomorphic select", move || select_locally(&request, &parts)).await
}

#[async_trait]
impl SelectStore for MemoryStore {
    async fn read_select(&self, request: &SelectRequest) -> Result<Vec<u8>> {
        select_by_reading(self, request).await
    }
    async fn read_select_combined(&self, request: &CombinedSelect) -> Result<Vec<u8>> {
        combined_by_reading(self, request).await
    }
    async fn write_select(&self, writes: &[SelectWrite]) -> Result<()> {
        write_select_by_reading(self, writes).await
    }
}

#[async_trait]
impl SelectStore for FileStore {
    async fn read_select(&self, request: &SelectRequest) -> Result<Vec<u8>> {
        select_by_reading(self, request).await
    }
    async fn read_select_combined(&self, request: &CombinedSelect) -> Result<Vec<u8>> {
        combined_by_reading(self, request).await
    }
    async fn write_select(&self, writes: &[SelectWrite]) -> Result<()> {
        write_select_by_reading(self, writes).await
    }
}

#[async_trait]
impl<S: SelectStore + ?Sized> SelectStore for Arc<S> {
    async fn read_select(&self, request: &SelectRequest) -> Result<Vec<u8>> {
        (**self).read_select(request).await
    }
    async fn read_select_combined(&self, request: &CombinedSelect) -> Result<Vec<u8>> {
        (**self).read_select_combined(request).await
    }
    async fn write_select(&self, writes: &[SelectWrite]) -> Result<()> {
        (**self).write_select(writes).await
    }
}

#[async_trait]
impl<S: SelectStore + ?Sized> SelectStore for Box<S> {
    async fn read_select(&self, request: &SelectRequest) -> Result<Vec<u8>> {
        (**self).read_select(request).await
    }
    async fn read_select_combined(&self, request: &CombinedSelect) -> Result<Vec<u8>> {
        (**self).read_select_combined(request).await
    }
    async fn write_select(&self, writes: &[SelectWrite]) -> Result<()> {
        (**self).write_select(writes).await
    }
}

// ---- What a select tells the wrappers -------------------------------------------------------

/// Bytes of a ciphertext as the wire carries it.
fn ciphertext_bytes(pk: &PublicKey, c: &Ciphertext) -> u64 {
    pk.ciphertext_len(c.layer()).map_or(0, |n| n as u64)
}

/// Ciphertext bytes of a select's selector.
fn selector_bytes(request: &SelectRequest) -> u64 {
    request.selector.iter().map(|c| ciphertext_bytes(&request.public_key, c)).sum()
}

/// Bytes of the ranges a select reads on the store's side.
fn scanned_bytes(request: &SelectRequest) -> u64 {
    request.ranges.iter().map(|r| u64::from(r.len)).sum()
}

/// Bytes of a public key as [`PublicKey::to_bytes`] writes it (sent once per request).
fn key_bytes(pk: &PublicKey) -> u64 {
    12 + u64::from(pk.n_bits().div_ceil(8))
}

/// The cost of one select request: selector bytes sent, range bytes the store reads, ranges
/// (and targets) addressed.
#[derive(Clone, Copy, Debug, Default)]
struct Cost {
    sent: u64,
    scanned: u64,
    addresses: u64,
    key: u64,
}

impl Cost {
    fn of(requests: impl IntoIterator<Item = impl std::borrow::Borrow<SelectRequest>>) -> Self {
        let mut cost = Cost::default();
        for r in requests {
            let r = r.borrow();
            cost.sent += selector_bytes(r);
            cost.scanned += scanned_bytes(r);
            cost.addresses += r.ranges.len() as u64;
            cost.key = key_bytes(&r.public_key);
        }
        cost
    }

    fn of_combined(request: &CombinedSelect) -> Self {
        let mut cost = Cost::of(&request.groups);
        if let Some(g) = request.groups.first() {
            cost.sent +=
                request.outer.iter().map(|c| ciphertext_bytes(&g.public_key, c)).sum::<u64>();
        }
        cost
    }

    /// Bytes on the link upstream: the key, the selectors and the addresses.
    fn up(&self) -> u64 {
        self.key + self.sent + self.addresses * LinkConfig::ADDRESS_BYTES
    }
}

/// What the store sees of a list of selects: their ranges, one after the other, and how many
/// belong to each.
fn ranges_seen<'a>(
    requests: impl IntoIterator<Item = &'a SelectRequest>,
) -> (Vec<CellId>, Vec<(u32, u32)>, Vec<u32>) {
    let (mut cells, mut ranges, mut groups) = (Vec::new(), Vec::new(), Vec::new());
    for r in requests {
        cells.extend(r.ranges.iter().map(|r| r.cell));
        ranges.extend(r.ranges.iter().map(|r| (r.offset, r.len)));
        groups.push(r.ranges.len() as u32);
    }
    (cells, ranges, groups)
}

#[async_trait]
impl<S: SelectStore> SelectStore for CountingStore<S> {
    async fn read_select(&self, request: &SelectRequest) -> Result<Vec<u8>> {
        let cost = Cost::of([request]);
        self.count_select(crate::counting::SelectKind::Read, cost.sent, cost.scanned, 0);
        let out = self.inner().read_select(request).await?;
        self.count_select_answer(out.len());
        Ok(out)
    }
    async fn read_select_combined(&self, request: &CombinedSelect) -> Result<Vec<u8>> {
        let cost = Cost::of_combined(request);
        self.count_select(crate::counting::SelectKind::Combined, cost.sent, cost.scanned, 0);
        let out = self.inner().read_select_combined(request).await?;
        self.count_select_answer(out.len());
        Ok(out)
    }
    async fn write_select(&self, writes: &[SelectWrite]) -> Result<()> {
        let cost = Cost::of(writes.iter().map(|w| &w.request));
        let cells = writes.len() as u64;
        self.count_select(crate::counting::SelectKind::Write, cost.sent, cost.scanned, cells);
        self.inner().write_select(writes).await
    }
}

#[async_trait]
impl<S: SelectStore> SelectStore for RecordingStore<S> {
    async fn read_select(&self, request: &SelectRequest) -> Result<Vec<u8>> {
        let (cells, ranges, _) = ranges_seen([request]);
        let answer = select_answer_len(&self.geometry(), request).unwrap_or(0) as u64;
        let bytes = Cost::of([request]).sent + answer;
        self.record_event(TraceEvent::new(TraceOp::ReadSelect, cells, ranges, bytes));
        self.inner().read_select(request).await
    }
    async fn read_select_combined(&self, request: &CombinedSelect) -> Result<Vec<u8>> {
        let (cells, ranges, groups) = ranges_seen(&request.groups);
        let answer = combined_answer_len(&self.geometry(), request).unwrap_or(0) as u64;
        let bytes = Cost::of_combined(request).sent + answer;
        self.record_event(TraceEvent {
            groups,
            ..TraceEvent::new(TraceOp::ReadSelectCombined, cells, ranges, bytes)
        });
        self.inner().read_select_combined(request).await
    }
    async fn write_select(&self, writes: &[SelectWrite]) -> Result<()> {
        let (cells, ranges, groups) = ranges_seen(writes.iter().map(|w| &w.request));
        let bytes = Cost::of(writes.iter().map(|w| &w.request)).sent;
        self.record_event(TraceEvent {
            groups,
            targets: writes.iter().map(|w| w.target).collect(),
            ..TraceEvent::new(TraceOp::WriteSelect, cells, ranges, bytes)
        });
        self.inner().write_select(writes).await
    }
}

fn answer_bytes(result: &Result<Vec<u8>>) -> u64 {
    result.as_ref().map_or(0, |b| b.len() as u64)
}

#[async_trait]
impl<S: SelectStore> SelectStore for LatencyStore<S> {
    async fn read_select(&self, request: &SelectRequest) -> Result<Vec<u8>> {
        let up = Cost::of([request]).up();
        self.across_link(up, self.inner().read_select(request), answer_bytes).await
    }
    async fn read_select_combined(&self, request: &CombinedSelect) -> Result<Vec<u8>> {
        let up = Cost::of_combined(request).up();
        self.across_link(up, self.inner().read_select_combined(request), answer_bytes).await
    }
    async fn write_select(&self, writes: &[SelectWrite]) -> Result<()> {
        let targets = writes.len() as u64 * LinkConfig::ADDRESS_BYTES;
        let up = Cost::of(writes.iter().map(|w| &w.request)).up() + targets;
        self.across_link(up, self.inner().write_select(writes), |_| 0).await
    }
}

#[async_trait]
impl<S: SelectStore> SelectStore for FaultStore<S> {
    async fn read_select(&self, request: &SelectRequest) -> Result<Vec<u8>> {
        self.before_read("read_select").await?;
        self.inner().read_select(request).await
    }
    async fn read_select_combined(&self, request: &CombinedSelect) -> Result<Vec<u8>> {
        self.before_read("read_select_combined").await?;
        self.inner().read_select_combined(request).await
    }
    async fn write_select(&self, writes: &[SelectWrite]) -> Result<()> {
        self.around_write("write_select", self.inner().write_select(writes)).await
    }
}

// ---- Opening by URL ---------------------------------------------------------------------------

/// Opens (creating if needed) the array `name` at `url` as a store that computes selects on its
/// side: like [`open_xor_store`](crate::open_xor_store) — `memory:`, `file:` (computed locally)
/// and `remote://` (computed by the storage server); S3 and Redis fail with
/// [`StoreError::Unsupported`].
pub async fn open_select_store(
    url: &StoreUrl,
    name: &str,
    geometry: Geometry,
) -> Result<Arc<dyn SelectStore>> {
    Ok(match crate::xor::open_computing(url, name, geometry, "homomorphic select").await? {
        crate::xor::Computing::Memory(s) => Arc::new(s),
        crate::xor::Computing::File(s) => Arc::new(s),
        crate::xor::Computing::Remote(s) => Arc::new(s),
    })
}

/// Every server-side computation of this crate at once ([`XorStore`] and [`SelectStore`]): what
/// the storage server offers on each array it serves.
pub trait ComputeStore: XorStore + SelectStore {}

impl<S: XorStore + SelectStore + ?Sized> ComputeStore for S {}

/// Opens (creating if needed) the array `name` at `url` as a store offering every computation:
/// the backends of [`open_select_store`].
pub async fn open_compute_store(
    url: &StoreUrl,
    name: &str,
    geometry: Geometry,
) -> Result<Arc<dyn ComputeStore>> {
    Ok(match crate::xor::open_computing(url, name, geometry, "server-side computation").await? {
        crate::xor::Computing::Memory(s) => Arc::new(s),
        crate::xor::Computing::File(s) => Arc::new(s),
        crate::xor::Computing::Remote(s) => Arc::new(s),
    })
}
