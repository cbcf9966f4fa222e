use std::sync::Arc;

use blindfold_crypto::CellSealer;
use blindfold_oram::BlockId;
use blindfold_store::{CellId, Geometry, Store};

use crate::path::{open_cells, seal_cells, with_retry, write_sealed, RetryPolicy};
use crate::{ProxyError, Result, VersionTable};

/// The baseline without ORAM: block `i` is sealed (with the same AEAD, versions and integrity)
/// and kept in cell `i`. The store sees exactly which block is read or written; this exists so
/// benchmarks can report what obliviousness costs over plain encrypted storage.
pub struct SealedDirect {
    store: Arc<dyn Store>,
    sealer: CellSealer,
    versions: VersionTable,
    block_size: u32,
}

impl std::fmt::Debug for SealedDirect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedDirect").field("store", &self.store).finish_non_exhaustive()
    }
}

impl SealedDirect {
    /// The store shape for `blocks` blocks of `block_size` bytes.
    pub fn geometry(blocks: u64, block_size: u32) -> Result<Geometry> {
        Ok(Geometry::new(blocks, block_size + CellSealer::OVERHEAD as u32)?)
    }

    /// A new, empty baseline store.
    pub fn new(store: Arc<dyn Store>, sealer: CellSealer, block_size: u32) -> Result<Self> {
        let g = store.geometry();
        if g.cell_size() as usize != block_size as usize + CellSealer::OVERHEAD {
            return Err(ProxyError::Geometry {
                found: format!("cells of {} bytes", g.cell_size()),
                needed: format!("cells of {} bytes", block_size as usize + CellSealer::OVERHEAD),
            });
        }
        let versions = VersionTable::new(g.cell_count());
        Ok(Self { store, sealer, versions, block_size })
    }

    /// Reads a block (zeros if never written).
    pub async fn read(&mut self, block: BlockId) -> Result<Vec<u8>> {
        self.store.geometry().check_cell(CellId(block.0))?;
        let cells = [CellId(block.0)];
        let store = Arc::clone(&self.store);
        let fetched = with_retry(RetryPolicy::default(), || store.read(&cells)).await?;
        let mut plain = open_cells(&self.sealer, &self.versions, &cells, fetched)?;
        Ok(plain.pop().flatten().unwrap_or_else(|| vec![0u8; self.block_size as usize]))
    }

    /// Writes a block.
    pub async fn write(&mut self, block: BlockId, data: Vec<u8>) -> Result<()> {
        self.store.geometry().check_cell(CellId(block.0))?;
        if data.len() != self.block_size as usize {
            return Err(blindfold_oram::OramError::WrongBlockSize {
                got: data.len(),
                expected: self.block_size,
            }
            .into());
        }
        let sealed = seal_cells(&self.sealer, &mut self.versions, vec![(CellId(block.0), data)])?;
        write_sealed(&*self.store, RetryPolicy::default(), sealed).await
    }

    /// Bytes of trusted memory (the version table).
    pub fn trusted_bytes(&self) -> u64 {
        self.versions.trusted_bytes()
    }
}
