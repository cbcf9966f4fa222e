//! [`SelectStore`]: the second server-side computation capability — Onion ORAM's homomorphic
//! select (seed 002 Algorithms 8–11). The client sends one Damgård–Jurik ciphertext per slot (an
//! encrypted unit vector) and the ranges holding the slots' data; the store raises each
//! selector element to each chunk of its slot's data, multiplies per chunk, and returns one slot's
//! worth of ciphertexts, which encrypt exactly the slot the client chose.
//!
//! Same shape as [`XorStore`](crate::XorStore): a trait on top of [`Store`], implemented by the
//! backends that compute locally (memory, file). Not yet: the wrappers' pass-through (counting,
//! recording, latency, faults), the remote protocol's operation code and `open_select_store` —
//! they come with the Onion ORAM engine that uses them.

use std::sync::Arc;

use async_trait::async_trait;
use blindfold_dj::{Ciphertext, DjError, Integer, PublicKey};

use crate::{ByteRange, FileStore, Geometry, MemoryStore, Result, Store, StoreError};

/// One homomorphic select over stored slots.
///
/// Slot `i` is `ranges[i]`; its bytes are read as consecutive `chunk_len`-byte big-endian
/// numbers, each of which must lie below `n^s` (for Onion ORAM they are the encodings of
/// layer-`(s-1)` ciphertexts, or raw data chunks at the bottom layer). The answer's chunk `j`
/// is `Π_i selector[i] ^ chunk_j(slot i) mod n^(s+1)`, a layer-`s` ciphertext.
#[derive(Clone, Debug)]
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

/// Checks, reads the ranges and computes the select off the async executor (each chunk costs
/// milliseconds): correct for any store, and what the memory and file backends do.
pub async fn select_by_reading<S: Store + ?Sized>(
    store: &S,
    request: &SelectRequest,
) -> Result<Vec<u8>> {
    check_select(&store.geometry(), request)?;
    let parts = store.read_ranges(&request.ranges).await?;
    let request = request.clone();
    match tokio::task::spawn_blocking(move || select_locally(&request, &parts)).await {
        Ok(result) => result,
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(join) => Err(invalid(format!("homomorphic select cancelled: {join}"))),
    }
}

#[async_trait]
impl SelectStore for MemoryStore {
    async fn read_select(&self, request: &SelectRequest) -> Result<Vec<u8>> {
        select_by_reading(self, request).await
    }
}

#[async_trait]
impl SelectStore for FileStore {
    async fn read_select(&self, request: &SelectRequest) -> Result<Vec<u8>> {
        select_by_reading(self, request).await
    }
}

#[async_trait]
impl<S: SelectStore + ?Sized> SelectStore for Arc<S> {
    async fn read_select(&self, request: &SelectRequest) -> Result<Vec<u8>> {
        (**self).read_select(request).await
    }
}

#[async_trait]
impl<S: SelectStore + ?Sized> SelectStore for Box<S> {
    async fn read_select(&self, request: &SelectRequest) -> Result<Vec<u8>> {
        (**self).read_select(request).await
    }
}
