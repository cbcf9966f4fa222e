//! [`XorStore`]: the first *server-side computation* capability — the store XORs byte ranges of
//! several cells together and returns one buffer (XOR Ring ORAM's online read, seed 002
//! Algorithm 7).
//!
//! Capabilities are separate traits on top of [`Store`], so the trust boundary stays small and a
//! backend that cannot compute (an object store) simply does not implement them. Later powers
//! plug in the same way: Onion ORAM's homomorphic select (`SelectStore`, feature `select`) is
//! one, and the trusted component of the TEE design (`TeeStore`) another, each implemented by
//! the backends and wrappers that can offer it and forwarded by the remote protocol as more
//! operations.

use std::sync::Arc;

use async_trait::async_trait;

use crate::{
    ByteRange, CountingStore, FaultStore, FileStore, Geometry, LatencyStore, MemoryStore,
    RecordingStore, RemoteStore, Result, Store, StoreError, StoreUrl,
};

/// A store that can XOR byte ranges of its cells and return only the result.
///
/// Contract (checked by `blindfold_testkit::conformance::run_xor`):
///
/// * every range must lie inside its cell ([`StoreError::RangeOutOfCell`],
///   [`StoreError::OutOfRange`]) and all ranges must have the same length
///   ([`StoreError::InvalidRequest`]); a bad batch fails whole;
/// * the result is the byte-wise XOR of the ranges as [`Store::read_ranges`] would return them,
///   as long as the first range (empty for an empty batch);
/// * a range may appear more than once (it then cancels out).
///
/// # Security
///
/// The store learns exactly what a [`Store::read_ranges`] of the same ranges would tell it
/// (which cells, offsets and lengths), and sends back one range's worth of bytes instead of all
/// of them. Wrappers record and count it as its own kind of request.
#[async_trait]
pub trait XorStore: Store {
    /// XORs `ranges` (all of the same length) together and returns the result.
    async fn read_xor(&self, ranges: &[ByteRange]) -> Result<Vec<u8>>;
}

/// Checks an XOR batch against `geometry`: every range inside its cell, all of one length.
/// Returns that length (0 for an empty batch).
pub fn check_xor(geometry: &Geometry, ranges: &[ByteRange]) -> Result<u32> {
    for r in ranges {
        geometry.check_range(r)?;
    }
    let len = ranges.first().map_or(0, |r| r.len);
    if let Some(bad) = ranges.iter().find(|r| r.len != len) {
        return Err(StoreError::InvalidRequest(format!(
            "XOR of ranges of different lengths ({len} and {} bytes)",
            bad.len
        )));
    }
    Ok(len)
}

/// XORs equally long buffers into one (the computation every backend shares).
pub fn xor_buffers(len: u32, buffers: impl IntoIterator<Item = Vec<u8>>) -> Vec<u8> {
    let mut out = vec![0u8; len as usize];
    for b in buffers {
        xor_into(&mut out, &b);
    }
    out
}

/// `acc ^= other`, byte by byte, over the shorter of the two.
pub fn xor_into(acc: &mut [u8], other: &[u8]) {
    // Word at a time: the compiler vectorises this loop.
    let mut a = acc.chunks_exact_mut(8);
    let mut b = other.chunks_exact(8);
    for (x, y) in (&mut a).zip(&mut b) {
        let v =
            u64::from_ne_bytes(x.try_into().unwrap()) ^ u64::from_ne_bytes(y.try_into().unwrap());
        x.copy_from_slice(&v.to_ne_bytes());
    }
    for (x, y) in a.into_remainder().iter_mut().zip(b.remainder()) {
        *x ^= y;
    }
}

/// The computation done locally on the backend's own ranged read: correct for any store, and
/// what the memory and file backends (and the storage server) do.
pub async fn xor_by_reading<S: Store + ?Sized>(store: &S, ranges: &[ByteRange]) -> Result<Vec<u8>> {
    let len = check_xor(&store.geometry(), ranges)?;
    let parts = store.read_ranges(ranges).await?;
    Ok(xor_buffers(len, parts))
}

#[async_trait]
impl XorStore for MemoryStore {
    async fn read_xor(&self, ranges: &[ByteRange]) -> Result<Vec<u8>> {
        xor_by_reading(self, ranges).await
    }
}

#[async_trait]
impl XorStore for FileStore {
    async fn read_xor(&self, ranges: &[ByteRange]) -> Result<Vec<u8>> {
        xor_by_reading(self, ranges).await
    }
}

#[async_trait]
impl<S: XorStore + ?Sized> XorStore for Arc<S> {
    async fn read_xor(&self, ranges: &[ByteRange]) -> Result<Vec<u8>> {
        (**self).read_xor(ranges).await
    }
}

#[async_trait]
impl<S: XorStore + ?Sized> XorStore for Box<S> {
    async fn read_xor(&self, ranges: &[ByteRange]) -> Result<Vec<u8>> {
        (**self).read_xor(ranges).await
    }
}

#[async_trait]
impl<S: XorStore> XorStore for CountingStore<S> {
    async fn read_xor(&self, ranges: &[ByteRange]) -> Result<Vec<u8>> {
        self.count_xor(ranges.len());
        let out = self.inner().read_xor(ranges).await?;
        self.count_xor_bytes(out.len());
        Ok(out)
    }
}

#[async_trait]
impl<S: XorStore> XorStore for RecordingStore<S> {
    async fn read_xor(&self, ranges: &[ByteRange]) -> Result<Vec<u8>> {
        self.record_xor(ranges);
        self.inner().read_xor(ranges).await
    }
}

#[async_trait]
impl<S: XorStore> XorStore for LatencyStore<S> {
    async fn read_xor(&self, ranges: &[ByteRange]) -> Result<Vec<u8>> {
        let up = ranges.len() as u64 * crate::LinkConfig::ADDRESS_BYTES;
        self.across_link(up, self.inner().read_xor(ranges), |r| {
            r.as_ref().map_or(0, |b| b.len() as u64)
        })
        .await
    }
}

#[async_trait]
impl<S: XorStore> XorStore for FaultStore<S> {
    async fn read_xor(&self, ranges: &[ByteRange]) -> Result<Vec<u8>> {
        self.before_read("read_xor").await?;
        self.inner().read_xor(ranges).await
    }
}

/// Opens (creating if needed) the array `name` at `url` as a store that can XOR on its side:
/// like [`open_store`](crate::open_store), for the backends that offer [`XorStore`] — `memory:`,
/// `file:` (computed locally) and `remote://` (computed by the storage server). Others fail
/// with [`StoreError::Unsupported`].
pub async fn open_xor_store(
    url: &StoreUrl,
    name: &str,
    geometry: Geometry,
) -> Result<Arc<dyn XorStore>> {
    Ok(match open_computing(url, name, geometry, "server-side XOR").await? {
        Computing::Memory(s) => Arc::new(s),
        Computing::File(s) => Arc::new(s),
        Computing::Remote(s) => Arc::new(s),
    })
}

/// A backend that can compute on its side, as [`open_computing`] opens it; each capability's
/// opener turns it into its own trait object.
#[derive(Debug)]
pub(crate) enum Computing {
    Memory(MemoryStore),
    File(FileStore),
    Remote(RemoteStore),
}

/// Opens the array `name` at `url` on a backend that computes (`memory:`, `file:`, `remote://`);
/// others fail with [`StoreError::Unsupported`] naming `what` they cannot do.
pub(crate) async fn open_computing(
    url: &StoreUrl,
    name: &str,
    geometry: Geometry,
    what: &str,
) -> Result<Computing> {
    crate::url::check_name(name)?;
    match url {
        StoreUrl::Memory => Ok(Computing::Memory(MemoryStore::new(geometry))),
        StoreUrl::File { dir, sync } => {
            let path = dir.join(format!("{name}.cells"));
            let sync = *sync;
            let opened = tokio::task::spawn_blocking(move || {
                FileStore::create_or_open(path, geometry, sync)
            })
            .await;
            match opened {
                Ok(store) => Ok(Computing::File(store?)),
                Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
                Err(join) => Err(StoreError::io(
                    format!("opening store {name:?} in {}", dir.display()),
                    std::io::Error::new(std::io::ErrorKind::Interrupted, join.to_string()),
                )),
            }
        }
        StoreUrl::Remote { addr, key_file } => {
            let key = key_file.as_deref().map(crate::remote::AuthKey::load).transpose()?;
            Ok(Computing::Remote(RemoteStore::open(addr, key, name, geometry).await?))
        }
        // Object stores and Redis cannot compute on their side.
        #[allow(unreachable_patterns)]
        other => Err(StoreError::Unsupported(format!(
            "{what} on {other} (use memory:, file: or remote://)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xor_into_handles_tails() {
        for n in [0usize, 1, 7, 8, 9, 31] {
            let mut a: Vec<u8> = (0..n as u8).collect();
            let b: Vec<u8> = (0..n as u8).map(|x| x.wrapping_mul(37) ^ 0x5a).collect();
            let want: Vec<u8> = a.iter().zip(&b).map(|(x, y)| x ^ y).collect();
            xor_into(&mut a, &b);
            assert_eq!(a, want, "n = {n}");
        }
    }
}
