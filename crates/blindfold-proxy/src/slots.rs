//! Two copies per cell, so a commit never overwrites the committed state.
//!
//! A durable engine whose store holds two *slots* per cell writes each commit's cells into the
//! slot that does **not** hold the committed copy, flushes the store, and only then logs a
//! small commit record naming the cells, their versions and their new slots. Until that record
//! is durable the committed copies are untouched, so a crash at any instant leaves a store
//! that matches the last durable commit; after it, the record says where every cell's newest
//! copy is. The redo log therefore never carries cell contents: local writes per commit fall
//! from the whole dirty set to a few bytes per cell, and the local disk leaves the critical
//! path.
//!
//! Layout: logical cell `c` of an `n`-cell engine lives at store cell `c` (slot 0) or `c + n`
//! (slot 1), so a store written by the single-copy layout of earlier versions is exactly slot
//! 0 of the two-slot one. Which slot is current is trusted state ([`SlotMap`], one bit per
//! cell, in the checkpoint and the commit records).
//!
//! # What the store learns
//!
//! Which slot a read goes to is the parity of the number of committed writes of that cell. The
//! store saw every write, so this tells it only whether a write it saw was committed, which
//! differs from "every write" only for the writes of a commit cut short by a crash (which it
//! can cause, and which the next start repeats into the same slots).

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use blindfold_store::{ByteRange, CellId, Geometry, Store};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use crate::{ProxyError, Result};

/// Which slot holds each cell's committed copy: one bit per cell.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "SlotMapRepr")]
pub struct SlotMap {
    cells: u64,
    #[serde(with = "serde_bytes")]
    bits: Vec<u8>,
}

#[derive(Deserialize)]
struct SlotMapRepr {
    cells: u64,
    #[serde(with = "serde_bytes")]
    bits: Vec<u8>,
}

impl TryFrom<SlotMapRepr> for SlotMap {
    type Error = String;
    fn try_from(r: SlotMapRepr) -> std::result::Result<Self, String> {
        if r.bits.len() as u64 != r.cells.div_ceil(8) {
            return Err(format!("slot map: {} bytes for {} cells", r.bits.len(), r.cells));
        }
        Ok(Self { cells: r.cells, bits: r.bits })
    }
}

impl SlotMap {
    /// Every cell's committed copy in slot 0.
    pub fn new(cells: u64) -> Self {
        Self { cells, bits: vec![0; cells.div_ceil(8) as usize] }
    }

    /// Cells covered.
    pub fn len(&self) -> u64 {
        self.cells
    }

    /// Whether no cell is covered.
    pub fn is_empty(&self) -> bool {
        self.cells == 0
    }

    /// The slot (0 or 1) of `cell`'s committed copy.
    pub fn get(&self, cell: u64) -> u8 {
        (self.bits[(cell / 8) as usize] >> (cell % 8)) & 1
    }

    /// Records that `cell`'s committed copy is in `slot` (0 or 1).
    pub fn set(&mut self, cell: u64, slot: u8) {
        let byte = &mut self.bits[(cell / 8) as usize];
        let bit = 1u8 << (cell % 8);
        if slot & 1 == 1 {
            *byte |= bit;
        } else {
            *byte &= !bit;
        }
    }

    /// Bytes of trusted memory used.
    pub fn trusted_bytes(&self) -> u64 {
        self.bits.len() as u64
    }
}

/// The store shape an engine of `cells` cells of `cell_size` bytes needs with two slots.
pub fn slotted_geometry(logical: Geometry) -> Result<Geometry> {
    let cells = logical.cell_count().checked_mul(2).ok_or_else(|| ProxyError::Geometry {
        found: "-".into(),
        needed: format!("two slots of {} cells", logical.cell_count()),
    })?;
    Ok(Geometry::new(cells, logical.cell_size())?)
}

/// A store of `n` logical cells over an inner store of `2n`: reads go to each cell's committed
/// slot; writes go to the other slot and wait as *pending* until [`SlottedStore::publish`]
/// makes them the committed copies (after the commit record naming them is durable).
#[derive(Debug)]
pub struct SlottedStore {
    inner: Arc<dyn Store>,
    logical: Geometry,
    map: RwLock<SlotMap>,
    /// Cells written since the last publish, with the slot they were written to.
    pending: Mutex<BTreeMap<u64, u8>>,
}

impl SlottedStore {
    /// Wraps `inner`, which must hold exactly two slots of `map.len()` cells.
    pub fn new(inner: Arc<dyn Store>, map: SlotMap) -> Result<Self> {
        let g = inner.geometry();
        if map.is_empty() || g.cell_count() != map.len().saturating_mul(2) {
            return Err(ProxyError::Geometry {
                found: format!("{} cells", g.cell_count()),
                needed: format!("{} cells (two slots of {})", map.len() * 2, map.len()),
            });
        }
        let logical = Geometry::new(map.len(), g.cell_size())?;
        Ok(Self { inner, logical, map: RwLock::new(map), pending: Mutex::new(BTreeMap::new()) })
    }

    fn phys(&self, cell: u64, slot: u8) -> CellId {
        CellId(cell + u64::from(slot & 1) * self.logical.cell_count())
    }

    /// The committed slot map.
    pub fn map(&self) -> SlotMap {
        self.map.read().clone()
    }

    /// The cells written since the last publish and the slots they went to, sorted by cell.
    pub fn pending(&self) -> Vec<(u64, u8)> {
        self.pending.lock().iter().map(|(&c, &s)| (c, s)).collect()
    }

    /// The slot a write of each of `cells` goes to now (the one not holding its committed
    /// copy), in the order given.
    pub fn free_slots(&self, cells: &[u64]) -> Vec<(u64, u8)> {
        let map = self.map.read();
        cells.iter().map(|&c| (c, 1 - map.get(c))).collect()
    }

    /// Makes the pending writes the committed copies; call once the record naming them is
    /// durable.
    pub fn publish(&self) {
        let pending = std::mem::take(&mut *self.pending.lock());
        let mut map = self.map.write();
        for (cell, slot) in pending {
            map.set(cell, slot);
        }
    }

    /// Reads each cell's newest copy: the one written since the last publish if there is
    /// one, else the committed copy. (A [`crate::packed::PackedStore`] rewriting a group that a
    /// write of the same commit changed before must start from that write.)
    pub async fn read_newest(&self, cells: &[CellId]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        let phys: Vec<CellId> = {
            let map = self.map.read();
            let pending = self.pending.lock();
            cells
                .iter()
                .map(|c| {
                    self.logical.check_cell(*c)?;
                    let slot = pending.get(&c.0).copied().unwrap_or_else(|| map.get(c.0));
                    Ok(self.phys(c.0, slot))
                })
                .collect::<blindfold_store::Result<_>>()?
        };
        self.inner.read(&phys).await
    }

    /// Bytes of trusted memory used (the slot map).
    pub fn trusted_bytes(&self) -> u64 {
        self.map.read().trusted_bytes()
    }

    /// Checks a batch and addresses each cell to the slot that does not hold its committed
    /// copy, noting that slot as pending.
    fn to_free_slots<B: AsRef<Vec<u8>>>(
        &self,
        cells: Vec<(CellId, B)>,
    ) -> blindfold_store::Result<Vec<(CellId, B)>> {
        let map = self.map.read();
        let mut pending = self.pending.lock();
        let mut phys = Vec::with_capacity(cells.len());
        for (c, data) in cells {
            self.logical.check_write(c, data.as_ref())?;
            let slot = 1 - map.get(c.0);
            pending.insert(c.0, slot);
            phys.push((self.phys(c.0, slot), data));
        }
        Ok(phys)
    }
}

#[async_trait]
impl Store for SlottedStore {
    fn geometry(&self) -> Geometry {
        self.logical
    }

    async fn read(&self, cells: &[CellId]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        let phys: Vec<CellId> = {
            let map = self.map.read();
            cells
                .iter()
                .map(|c| {
                    self.logical.check_cell(*c)?;
                    Ok(self.phys(c.0, map.get(c.0)))
                })
                .collect::<blindfold_store::Result<_>>()?
        };
        self.inner.read(&phys).await
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        let phys: Vec<ByteRange> = {
            let map = self.map.read();
            ranges
                .iter()
                .map(|r| {
                    self.logical.check_cell(r.cell)?;
                    Ok(ByteRange { cell: self.phys(r.cell.0, map.get(r.cell.0)), ..*r })
                })
                .collect::<blindfold_store::Result<_>>()?
        };
        self.inner.read_ranges(&phys).await
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> blindfold_store::Result<()> {
        let phys = self.to_free_slots(cells)?;
        self.inner.write(phys).await
    }

    async fn write_shared(
        &self,
        cells: Vec<(CellId, Arc<Vec<u8>>)>,
    ) -> blindfold_store::Result<()> {
        let phys = self.to_free_slots(cells)?;
        self.inner.write_shared(phys).await
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

    #[test]
    fn slot_map_bits_and_hostile_encodings() {
        let mut m = SlotMap::new(13);
        m.set(12, 1);
        m.set(3, 1);
        m.set(3, 0);
        assert_eq!((0..13).map(|c| m.get(c)).collect::<Vec<_>>(), {
            let mut v = vec![0; 13];
            v[12] = 1;
            v
        });
        let back: SlotMap = bincode::deserialize(&bincode::serialize(&m).unwrap()).unwrap();
        assert_eq!(back, m);
        // A map whose bit vector does not match its cell count is refused, not indexed.
        let bad = bincode::serialize(&(1000u64, serde_bytes::ByteBuf::from(vec![0u8; 2])));
        assert!(bincode::deserialize::<SlotMap>(&bad.unwrap()).is_err());
    }

    #[tokio::test]
    async fn writes_go_to_the_other_slot_and_reads_follow_only_after_publish() {
        let inner = Arc::new(MemoryStore::new(Geometry::new(8, 4).unwrap()));
        let s = SlottedStore::new(inner.clone(), SlotMap::new(4)).unwrap();
        assert_eq!(s.geometry().cell_count(), 4);
        s.write(vec![(CellId(1), vec![1; 4])]).await.unwrap();
        // The committed copy (slot 0, never written) is still what reads see.
        assert_ne!(s.read(&[CellId(1)]).await.unwrap()[0], vec![1; 4]);
        assert_eq!(inner.read(&[CellId(5)]).await.unwrap()[0], vec![1; 4]);
        assert_eq!(s.pending(), vec![(1, 1)]);
        s.publish();
        assert!(s.pending().is_empty());
        assert_eq!(s.read(&[CellId(1)]).await.unwrap()[0], vec![1; 4]);
        // The next write goes back to slot 0, leaving slot 1 readable until published.
        s.write(vec![(CellId(1), vec![2; 4])]).await.unwrap();
        assert_eq!(s.read(&[CellId(1)]).await.unwrap()[0], vec![1; 4]);
        assert_eq!(inner.read(&[CellId(1)]).await.unwrap()[0], vec![2; 4]);
        // Out-of-range cells are refused, not mapped into the other slot.
        assert!(s.read(&[CellId(4)]).await.is_err());
        assert!(s.write(vec![(CellId(4), vec![0; 4])]).await.is_err());
        assert!(SlottedStore::new(inner, SlotMap::new(3)).is_err());
    }
}
