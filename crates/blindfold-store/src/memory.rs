use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::RwLock;

use crate::{ByteRange, CellId, Geometry, Result, Store};

/// Number of independently locked shards; cell `i` lives in shard `i % SHARDS`.
const SHARDS: u64 = 64;

/// Cells held in this process's memory. Nothing survives the process; useful for tests,
/// benchmarks and as the reference backend of the conformance suite.
///
/// Memory is allocated lazily per shard on first write, so a large, mostly empty store costs
/// little until used.
pub struct MemoryStore {
    geometry: Geometry,
    shards: Vec<RwLock<Vec<u8>>>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").field("geometry", &self.geometry).finish()
    }
}

impl MemoryStore {
    /// An empty store of the given shape.
    pub fn new(geometry: Geometry) -> Self {
        let shards = (0..SHARDS).map(|_| RwLock::new(Vec::new())).collect();
        Self { geometry, shards }
    }

    fn shard_cells(&self, shard: u64) -> u64 {
        let n = self.geometry.cell_count();
        n / SHARDS + u64::from(shard < n % SHARDS)
    }

    fn locate(&self, cell: CellId) -> (usize, usize) {
        let shard = (cell.0 % SHARDS) as usize;
        let offset = (cell.0 / SHARDS) as usize * self.geometry.cell_size() as usize;
        (shard, offset)
    }

    /// Checks every cell of a batch, then copies each into its shard (a batch with any bad
    /// cell changes nothing).
    fn copy_in<B: AsRef<Vec<u8>>>(&self, cells: &[(CellId, B)]) -> Result<()> {
        for (c, data) in cells {
            self.geometry.check_write(*c, data.as_ref())?;
        }
        let size = self.geometry.cell_size() as usize;
        for (c, data) in cells {
            let (shard, base) = self.locate(*c);
            let mut guard = self.shards[shard].write();
            if guard.is_empty() {
                let cells_here = self.shard_cells(shard as u64) as usize;
                guard.resize(cells_here * size, 0);
            }
            guard[base..base + size].copy_from_slice(data.as_ref());
        }
        Ok(())
    }

    fn copy_out(&self, cell: CellId, offset: usize, len: usize) -> Vec<u8> {
        let (shard, base) = self.locate(cell);
        let guard = self.shards[shard].read();
        if guard.is_empty() {
            return vec![0u8; len];
        }
        guard[base + offset..base + offset + len].to_vec()
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>> {
        for &c in cells {
            self.geometry.check_cell(c)?;
        }
        let size = self.geometry.cell_size() as usize;
        Ok(cells.iter().map(|&c| self.copy_out(c, 0, size)).collect())
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        for r in ranges {
            self.geometry.check_range(r)?;
        }
        Ok(ranges
            .iter()
            .map(|r| self.copy_out(r.cell, r.offset as usize, r.len as usize))
            .collect())
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        self.copy_in(&cells)
    }

    async fn write_shared(&self, cells: Vec<(CellId, Arc<Vec<u8>>)>) -> Result<()> {
        self.copy_in(&cells)
    }

    async fn flush(&self) -> Result<()> {
        Ok(())
    }
    fn writes_may_be_retried(&self) -> bool {
        false // it never fails a write in a way a retry could mend
    }
}
