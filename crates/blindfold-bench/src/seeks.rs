//! [`SeekCountingStore`]: counts the disk seeks a store's request pattern would cost, the
//! measure of seed 001's Figure 7 ("average number of seeks per ORAM operation").
//!
//! A request (one [`Store::read`], [`Store::read_ranges`] or [`Store::write`] call) names a
//! batch of cells that the store may serve in any order, so a disk under it sorts them (an
//! elevator) and seeks once per maximal run of contiguous cell ids: `[7, 3, 4, 9, 8]` is the
//! runs `3–4` and `7–9`, two seeks. A cell named twice is read once. Ranged reads count the
//! cells they touch. Flushes are not seeks.

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use blindfold_store::{ByteRange, CellId, Geometry, Result, Store};
use serde::Serialize;

/// Totals seen by a [`SeekCountingStore`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SeekCounts {
    /// Read calls (whole cells and ranges).
    pub read_requests: u64,
    /// Write calls.
    pub write_requests: u64,
    /// Cells named by reads, duplicates included.
    pub cells_read: u64,
    /// Cells named by writes, duplicates included.
    pub cells_written: u64,
    /// Bytes returned by reads.
    pub bytes_read: u64,
    /// Bytes sent by writes.
    pub bytes_written: u64,
    /// Seeks: maximal runs of contiguous cell ids, summed over requests.
    pub seeks: u64,
}

impl SeekCounts {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &SeekCounts) -> SeekCounts {
        SeekCounts {
            read_requests: self.read_requests - earlier.read_requests,
            write_requests: self.write_requests - earlier.write_requests,
            cells_read: self.cells_read - earlier.cells_read,
            cells_written: self.cells_written - earlier.cells_written,
            bytes_read: self.bytes_read - earlier.bytes_read,
            bytes_written: self.bytes_written - earlier.bytes_written,
            seeks: self.seeks - earlier.seeks,
        }
    }

    /// Both together (the stores of several nodes).
    pub fn plus(&self, o: &SeekCounts) -> SeekCounts {
        SeekCounts {
            read_requests: self.read_requests + o.read_requests,
            write_requests: self.write_requests + o.write_requests,
            cells_read: self.cells_read + o.cells_read,
            cells_written: self.cells_written + o.cells_written,
            bytes_read: self.bytes_read + o.bytes_read,
            bytes_written: self.bytes_written + o.bytes_written,
            seeks: self.seeks + o.seeks,
        }
    }
}

/// Maximal runs of contiguous ids among `cells` (sorted, duplicates merged): the seeks a disk
/// serving them as one batch makes.
pub fn seeks(cells: impl IntoIterator<Item = u64>) -> u64 {
    let mut ids: Vec<u64> = cells.into_iter().collect();
    ids.sort_unstable();
    ids.dedup();
    let mut runs = 0;
    let mut prev: Option<u64> = None;
    for id in ids {
        if prev.is_none_or(|p| p + 1 != id) {
            runs += 1;
        }
        prev = Some(id);
    }
    runs
}

#[derive(Debug, Default)]
struct Counters {
    read_requests: AtomicU64,
    write_requests: AtomicU64,
    cells_read: AtomicU64,
    cells_written: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    seeks: AtomicU64,
}

/// Wraps a store and counts its requests, cells, bytes and seeks (see the [module](self)).
#[derive(Debug)]
pub struct SeekCountingStore<S> {
    inner: S,
    c: Counters,
}

impl<S: Store> SeekCountingStore<S> {
    /// Counts what goes to `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner, c: Counters::default() }
    }

    /// The totals so far.
    pub fn counts(&self) -> SeekCounts {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SeekCounts {
            read_requests: l(&self.c.read_requests),
            write_requests: l(&self.c.write_requests),
            cells_read: l(&self.c.cells_read),
            cells_written: l(&self.c.cells_written),
            bytes_read: l(&self.c.bytes_read),
            bytes_written: l(&self.c.bytes_written),
            seeks: l(&self.c.seeks),
        }
    }

    fn add(a: &AtomicU64, v: u64) {
        a.fetch_add(v, Ordering::Relaxed);
    }
}

#[async_trait]
impl<S: Store> Store for SeekCountingStore<S> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>> {
        Self::add(&self.c.read_requests, 1);
        Self::add(&self.c.cells_read, cells.len() as u64);
        Self::add(&self.c.seeks, seeks(cells.iter().map(|c| c.0)));
        let out = self.inner.read(cells).await?;
        Self::add(&self.c.bytes_read, out.iter().map(|b| b.len() as u64).sum());
        Ok(out)
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        Self::add(&self.c.read_requests, 1);
        Self::add(&self.c.cells_read, ranges.len() as u64);
        Self::add(&self.c.seeks, seeks(ranges.iter().map(|r| r.cell.0)));
        let out = self.inner.read_ranges(ranges).await?;
        Self::add(&self.c.bytes_read, out.iter().map(|b| b.len() as u64).sum());
        Ok(out)
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        Self::add(&self.c.write_requests, 1);
        Self::add(&self.c.cells_written, cells.len() as u64);
        Self::add(&self.c.seeks, seeks(cells.iter().map(|c| c.0 .0)));
        Self::add(&self.c.bytes_written, cells.iter().map(|c| c.1.len() as u64).sum());
        self.inner.write(cells).await
    }

    async fn flush(&self) -> Result<()> {
        self.inner.flush().await
    }
}

#[cfg(test)]
mod tests {
    use blindfold_store::MemoryStore;

    use super::*;

    #[test]
    fn runs_of_contiguous_ids() {
        assert_eq!(seeks([]), 0);
        assert_eq!(seeks([5]), 1);
        assert_eq!(seeks([1, 2, 3, 4]), 1);
        assert_eq!(seeks([7, 3, 4, 9, 8]), 2);
        assert_eq!(seeks([1, 3, 5, 7]), 4);
        assert_eq!(seeks([2, 2, 3, 3]), 1);
        assert_eq!(seeks([10, 0, 11, 1, 12, 20]), 3);
    }

    #[tokio::test]
    async fn counts_a_hand_made_pattern() {
        let g = Geometry::new(64, 16).unwrap();
        let s = SeekCountingStore::new(MemoryStore::new(g));
        let cell = |i: u64| (CellId(i), vec![i as u8; 16]);
        // One run of 8 cells: 1 seek.
        s.write((0..8).map(cell).collect()).await.unwrap();
        // 20, 21 | 30 | 40, 41, 42: 3 seeks.
        s.write([42, 20, 30, 41, 21, 40].into_iter().map(cell).collect()).await.unwrap();
        // 0–3 and 5: 2 seeks.
        s.read(&[CellId(3), CellId(0), CellId(5), CellId(1), CellId(2)]).await.unwrap();
        // 63: 1 seek.
        s.read_ranges(&[ByteRange { cell: CellId(63), offset: 4, len: 8 }]).await.unwrap();
        s.flush().await.unwrap();
        let c = s.counts();
        assert_eq!(
            c,
            SeekCounts {
                read_requests: 2,
                write_requests: 2,
                cells_read: 6,
                cells_written: 14,
                bytes_read: 5 * 16 + 8,
                bytes_written: 14 * 16,
                seeks: 7,
            }
        );
        let before = c;
        s.read(&[CellId(9), CellId(11)]).await.unwrap();
        assert_eq!(s.counts().since(&before).seeks, 2);
        assert_eq!(s.counts().since(&before).plus(&before), s.counts());
    }
}
