use std::sync::Arc;

use blindfold_crypto::{CellAd, CellSealer};
use blindfold_oram::BlockId;
use blindfold_store::{CellId, Geometry, Store};

use crate::path::{open_cells, seal_cells, with_retry, write_sealed, RetryPolicy};
use crate::{ProxyError, Result, VerifyReport, VersionTable};

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

    /// Reads several blocks in one storage request (zeros for blocks never written).
    pub async fn read_many(&mut self, blocks: &[BlockId]) -> Result<Vec<Vec<u8>>> {
        let cells: Vec<CellId> = blocks.iter().map(|b| CellId(b.0)).collect();
        for &c in &cells {
            self.store.geometry().check_cell(c)?;
        }
        let store = Arc::clone(&self.store);
        let fetched = with_retry(RetryPolicy::default(), || store.read(&cells)).await?;
        let plain = open_cells(&self.sealer, &self.versions, &cells, fetched)?;
        Ok(plain
            .into_iter()
            .map(|p| p.unwrap_or_else(|| vec![0u8; self.block_size as usize]))
            .collect())
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

    /// Writes several blocks: seals each under its next version and sends them to the store
    /// in one batch.
    pub async fn write_many(&mut self, blocks: Vec<(BlockId, Vec<u8>)>) -> Result<()> {
        let g = self.store.geometry();
        let mut plain = Vec::with_capacity(blocks.len());
        for (block, data) in blocks {
            g.check_cell(CellId(block.0))?;
            if data.len() != self.block_size as usize {
                return Err(blindfold_oram::OramError::WrongBlockSize {
                    got: data.len(),
                    expected: self.block_size,
                }
                .into());
            }
            plain.push((CellId(block.0), data));
        }
        let sealed = seal_cells(&self.sealer, &mut self.versions, plain)?;
        write_sealed(&*self.store, RetryPolicy::default(), sealed).await
    }

    /// Flushes the store (its durability barrier).
    pub async fn flush(&self) -> Result<()> {
        let store = Arc::clone(&self.store);
        Ok(with_retry(RetryPolicy::default(), || store.flush()).await?)
    }

    /// Reads every written cell and authenticates it against the trusted versions;
    /// `progress(done, total)` is called as it goes.
    pub async fn verify(&self, mut progress: impl FnMut(u64, u64)) -> Result<VerifyReport> {
        let total = self.versions.len();
        let mut report = VerifyReport::default();
        let mut start = 0u64;
        while start < total {
            let cells: Vec<CellId> = (start..(start + 256).min(total)).map(CellId).collect();
            let store = Arc::clone(&self.store);
            let fetched = with_retry(RetryPolicy::default(), || store.read(&cells)).await?;
            for (cell, mut buf) in cells.iter().zip(fetched) {
                let version = self.versions.get(cell.0);
                if version == 0 {
                    report.never_written += 1;
                    continue;
                }
                let ad = CellAd { cell: cell.0, version, segment: 0 };
                match self.sealer.open_in_place(&ad, &mut buf) {
                    Ok(_) => report.cells_checked += 1,
                    Err(e) => report.failures.push((cell.0, e.to_string())),
                }
            }
            start += cells.len() as u64;
            progress(start, total);
        }
        Ok(report)
    }

    /// Bytes per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Bytes of trusted memory (the version table).
    pub fn trusted_bytes(&self) -> u64 {
        self.versions.trusted_bytes()
    }
}
