//! The top of the tree kept in trusted memory: cells that every path crosses are never fetched
//! from or written to the store.
//!
//! The top `k` levels of a Path ORAM tree (heap order: cells `0 .. 2^k - 1`) lie on every
//! path, so keeping them in the gateway hides nothing the store would otherwise learn (every
//! access reads and writes all of them) and saves `k` buckets of traffic and a share of the
//! requests on every access. The pinned cells are a prefix of the heap order, so a budget
//! between two whole levels pins the left part of the next level too: a path to a leaf under
//! that part skips one more bucket in the store. Which buckets a path skips depends only on
//! its leaf, which the store learns from the buckets it reads anyway. [`PinnedStore`] serves
//! those cells from memory, still sealed, and passes every other cell through. The pinned
//! cells are trusted state: a durable engine logs the ones a commit changed in its commit
//! record and all of them in its checkpoint. (The TaoStore engine keeps them open and logs
//! them by block instead; it seals the changed ones into this store only when a verify reads
//! them, and a checkpoint holds them by block.)

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use blindfold_store::{ByteRange, CellId, Geometry, Store};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use crate::{ProxyError, Result};

/// The pinned cells of a durable engine, as its checkpoint holds them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedCells {
    /// Cells kept in memory: `0 .. count`, the tree top in heap order (whole levels and
    /// possibly the left part of the next one).
    pub count: u64,
    /// Each pinned cell's sealed bytes (empty: never written); `None` after a rebuild, which
    /// wrote them to the store: the next start reads them from there once.
    pub cells: Option<Vec<serde_bytes::ByteBuf>>,
}

impl PinnedCells {
    /// Cells pinned with `levels` whole levels.
    pub fn for_levels(levels: u32) -> u64 {
        if levels == 0 {
            0
        } else {
            (1u64 << levels.min(63)) - 1
        }
    }
}

/// A store whose cells below [`PinnedStore::count`] live in memory; see the module
/// documentation.
#[derive(Debug)]
pub struct PinnedStore {
    inner: Arc<dyn Store>,
    count: u64,
    cells: RwLock<Vec<Vec<u8>>>,
    /// Pinned cells written since the last [`PinnedStore::take_dirty`].
    dirty: Mutex<BTreeSet<u64>>,
    /// Pinned cells whose sealed copy was let go because the engine holds them open
    /// ([`PinnedStore::release`]): reading one is an error until it is written or restored.
    held: Mutex<BTreeSet<u64>>,
}

impl PinnedStore {
    /// Pins cells `0 .. pinned.count` over `inner`. Pinned cells not in `pinned` (after a
    /// rebuild) are read from `inner` now, once, in cell order.
    pub async fn new(inner: Arc<dyn Store>, pinned: PinnedCells) -> Result<Self> {
        let count = pinned.count;
        let g = inner.geometry();
        if count >= g.cell_count() {
            return Err(ProxyError::State(format!(
                "{count} pinned cells leave none of the {}-cell tree in the store",
                g.cell_count()
            )));
        }
        let cells = match pinned.cells {
            Some(cells) => {
                let size = g.cell_size() as usize;
                if cells.len() as u64 != count
                    || cells.iter().any(|c| !c.is_empty() && c.len() != size)
                {
                    return Err(ProxyError::State(format!(
                        "pinned cells: {} of them for {count}, or of the wrong size",
                        cells.len(),
                    )));
                }
                cells.into_iter().map(|c| c.into_vec()).collect()
            }
            None => {
                let ids: Vec<CellId> = (0..count).map(CellId).collect();
                let mut cells = Vec::with_capacity(ids.len());
                for chunk in ids.chunks(256) {
                    cells.extend(inner.read(chunk).await?);
                }
                cells
            }
        };
        Ok(Self {
            inner,
            count,
            cells: RwLock::new(cells),
            dirty: Mutex::new(BTreeSet::new()),
            held: Mutex::new(BTreeSet::new()),
        })
    }

    /// Number of pinned cells.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Every pinned cell, for a checkpoint. Fails while a cell is held open
    /// ([`PinnedStore::release`]): restore it first.
    pub fn export(&self) -> Result<PinnedCells> {
        self.export_open(&[])
    }

    /// As [`PinnedStore::export`], for a checkpoint that holds the cells `open` (sorted) open
    /// itself: those are left empty here, whether held or not.
    pub fn export_open(&self, open: &[u64]) -> Result<PinnedCells> {
        let is_open = |c: u64| open.binary_search(&c).is_ok();
        if let Some(c) = self.held.lock().iter().find(|&&c| !is_open(c)) {
            return Err(ProxyError::State(format!(
                "pinned cell {c} is held open by the engine: seal it before a checkpoint"
            )));
        }
        let cells = self.cells.read();
        Ok(PinnedCells {
            count: self.count,
            cells: Some(
                (0..self.count)
                    .zip(cells.iter())
                    .map(|(i, c)| {
                        if is_open(i) {
                            serde_bytes::ByteBuf::new()
                        } else {
                            serde_bytes::ByteBuf::from(c.clone())
                        }
                    })
                    .collect(),
            ),
        })
    }

    /// Lets go of the sealed copies of `cells`, which the engine above holds open from now on
    /// and never reads from here again; their memory is freed. They come back sealed by a
    /// write or [`PinnedStore::restore`] (before a checkpoint, say). A cell written since the
    /// last [`PinnedStore::take_dirty`] is not let go: its copy is still to be logged.
    pub fn release(&self, cells: &[u64]) {
        let dirty = self.dirty.lock();
        let mut held = self.held.lock();
        let mut pinned = self.cells.write();
        for &c in cells {
            if c < self.count() && !dirty.contains(&c) {
                pinned[c as usize] = Vec::new();
                held.insert(c);
            }
        }
    }

    /// The cells let go of ([`PinnedStore::release`]) and not sealed again since, sorted.
    pub fn held(&self) -> Vec<u64> {
        self.held.lock().iter().copied().collect()
    }

    /// An error for a read of `cell` if it is held open.
    fn check_not_held(&self, held: &BTreeSet<u64>, cell: u64) -> blindfold_store::Result<()> {
        if held.contains(&cell) {
            return Err(blindfold_store::StoreError::InvalidRequest(format!(
                "pinned cell {cell} is held open by the engine; its sealed copy was let go"
            )));
        }
        Ok(())
    }

    /// The pinned cells written since the last call, with their bytes, sorted.
    pub fn take_dirty(&self) -> Vec<(u64, Vec<u8>)> {
        let dirty = std::mem::take(&mut *self.dirty.lock());
        let cells = self.cells.read();
        dirty.into_iter().map(|c| (c, cells[c as usize].clone())).collect()
    }

    /// Puts in cells sealed outside the store's write path — those a replayed commit record
    /// logged, or an open tree top sealed for a verify — without marking them written.
    pub fn restore(&self, logged: Vec<(u64, Vec<u8>)>) -> Result<()> {
        let size = self.inner.geometry().cell_size() as usize;
        let mut held = self.held.lock();
        let mut cells = self.cells.write();
        for (c, data) in logged {
            if c >= self.count() || data.len() != size {
                return Err(ProxyError::State(format!("logged pinned cell {c} out of range")));
            }
            cells[c as usize] = data;
            held.remove(&c);
        }
        Ok(())
    }

    /// Bytes of trusted memory held.
    pub fn trusted_bytes(&self) -> u64 {
        self.cells.read().iter().map(|c| c.len() as u64).sum()
    }

    /// Checks a batch, keeps the cells of the pinned top (`own` makes each one's buffer) and
    /// returns the others, for the store below.
    fn keep_pinned<B: AsRef<Vec<u8>>>(
        &self,
        cells: Vec<(CellId, B)>,
        own: impl Fn(B) -> Vec<u8>,
    ) -> blindfold_store::Result<Vec<(CellId, B)>> {
        let g = self.inner.geometry();
        let count = self.count();
        let mut outside = Vec::with_capacity(cells.len());
        let mut dirty = self.dirty.lock();
        let mut held = self.held.lock();
        let mut pinned = self.cells.write();
        for (c, data) in cells {
            g.check_write(c, data.as_ref())?;
            if c.0 < count {
                pinned[c.0 as usize] = own(data);
                dirty.insert(c.0);
                held.remove(&c.0);
            } else {
                outside.push((c, data));
            }
        }
        Ok(outside)
    }
}

#[async_trait]
impl Store for PinnedStore {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, cells: &[CellId]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        let g = self.inner.geometry();
        let count = self.count();
        let outside: Vec<CellId> = cells.iter().copied().filter(|c| c.0 >= count).collect();
        let mut fetched = if outside.is_empty() {
            Vec::new().into_iter()
        } else {
            self.inner.read(&outside).await?.into_iter()
        };
        let held = self.held.lock();
        let pinned = self.cells.read();
        cells
            .iter()
            .map(|c| {
                g.check_cell(*c)?;
                Ok(if c.0 < count {
                    self.check_not_held(&held, c.0)?;
                    let cell = &pinned[c.0 as usize];
                    if cell.is_empty() {
                        vec![0; g.cell_size() as usize]
                    } else {
                        cell.clone()
                    }
                } else {
                    fetched.next().expect("one fetched cell per cell outside the top")
                })
            })
            .collect()
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        let count = self.count();
        let outside: Vec<ByteRange> =
            ranges.iter().copied().filter(|r| r.cell.0 >= count).collect();
        let mut fetched = if outside.is_empty() {
            Vec::new().into_iter()
        } else {
            self.inner.read_ranges(&outside).await?.into_iter()
        };
        let g = self.inner.geometry();
        let held = self.held.lock();
        let pinned = self.cells.read();
        ranges
            .iter()
            .map(|r| {
                if r.cell.0 >= count {
                    return Ok(fetched.next().expect("one fetched range per range outside"));
                }
                g.check_range(r)?;
                self.check_not_held(&held, r.cell.0)?;
                let cell = &pinned[r.cell.0 as usize];
                let (from, to) = (r.offset as usize, (r.offset + r.len) as usize);
                Ok(if cell.is_empty() { vec![0; to - from] } else { cell[from..to].to_vec() })
            })
            .collect()
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> blindfold_store::Result<()> {
        let outside = self.keep_pinned(cells, |d| d)?;
        if outside.is_empty() {
            return Ok(());
        }
        self.inner.write(outside).await
    }

    async fn write_shared(
        &self,
        cells: Vec<(CellId, Arc<Vec<u8>>)>,
    ) -> blindfold_store::Result<()> {
        // A pinned cell is kept as its own buffer (copied if the caller still shares it);
        // the others go on shared.
        let outside = self.keep_pinned(cells, Arc::unwrap_or_clone)?;
        if outside.is_empty() {
            return Ok(());
        }
        self.inner.write_shared(outside).await
    }

    async fn flush(&self) -> blindfold_store::Result<()> {
        self.inner.flush().await
    }
    fn writes_may_be_retried(&self) -> bool {
        self.inner.writes_may_be_retried()
    }
}

#[cfg(test)]
mod tests {
    use blindfold_store::MemoryStore;

    use super::*;

    #[tokio::test]
    async fn top_cells_never_reach_the_store() {
        let inner = Arc::new(blindfold_store::RecordingStore::new(MemoryStore::new(
            Geometry::new(15, 4).unwrap(),
        )));
        let p =
            PinnedStore::new(inner.clone(), PinnedCells { count: 3, cells: Some(vec![]) }).await;
        assert!(p.is_err(), "three pinned cells need three entries");
        let p =
            PinnedStore::new(inner.clone(), PinnedCells { count: 3, cells: None }).await.unwrap();
        assert_eq!(p.count(), 3);
        inner.clear();
        p.write(vec![(CellId(1), vec![1; 4]), (CellId(9), vec![9; 4])]).await.unwrap();
        let got = p.read(&[CellId(0), CellId(1), CellId(9)]).await.unwrap();
        assert_eq!(got, vec![vec![0; 4], vec![1; 4], vec![9; 4]]);
        // The store saw cell 9 only.
        let seen: Vec<u64> =
            inner.take_trace().into_iter().flat_map(|e| e.cells).map(|c| c.0).collect();
        assert_eq!(seen, vec![9, 9]);
        assert_eq!(p.take_dirty(), vec![(1, vec![1; 4])]);
        assert!(p.take_dirty().is_empty());
        let saved = p.export().unwrap();
        let back = PinnedStore::new(inner.clone(), saved).await.unwrap();
        assert_eq!(back.read(&[CellId(1)]).await.unwrap(), vec![vec![1; 4]]);
        assert!(back.restore(vec![(3, vec![0; 4])]).is_err());
        assert!(PinnedStore::new(inner, PinnedCells { count: 15, cells: None }).await.is_err());
    }

    #[tokio::test]
    async fn a_released_cell_is_never_served_until_sealed_again() {
        let inner = Arc::new(MemoryStore::new(Geometry::new(15, 4).unwrap()));
        let p = PinnedStore::new(inner, PinnedCells { count: 3, cells: None }).await.unwrap();
        p.write(vec![(CellId(0), vec![7; 4]), (CellId(1), vec![1; 4])]).await.unwrap();
        // Written since the last take_dirty: still to be logged, so kept.
        p.release(&[1]);
        assert!(p.held().is_empty());
        p.take_dirty();
        p.release(&[1, 2]);
        assert_eq!(p.held(), vec![1, 2]);
        assert_eq!(p.trusted_bytes(), 4, "only cell 0 is still held sealed");
        // Neither a read nor a checkpoint may see a cell whose copy was let go (an empty
        // cell would read as an empty bucket).
        assert!(p.read(&[CellId(1)]).await.is_err());
        let range = ByteRange { cell: CellId(2), offset: 0, len: 2 };
        assert!(p.read_ranges(&[range]).await.is_err());
        assert!(p.export().unwrap_err().to_string().contains("held open"));
        assert_eq!(p.read(&[CellId(0)]).await.unwrap(), vec![vec![7; 4]]);
        // Sealed again by a restore or a write.
        p.restore(vec![(1, vec![2; 4])]).unwrap();
        p.write(vec![(CellId(2), vec![3; 4])]).await.unwrap();
        assert!(p.held().is_empty());
        let cells = p.export().unwrap().cells.unwrap();
        assert_eq!(cells[1].as_ref(), &[2; 4]);
        assert_eq!(cells[2].as_ref(), &[3; 4]);
    }
}
