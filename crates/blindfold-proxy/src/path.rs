use std::sync::Arc;

use blindfold_crypto::CellSealer;
use blindfold_oram::path::BulkLoad;
use blindfold_oram::{BlockId, Op, PathOram, PathOramConfig, PathOramState, Progress};
use blindfold_store::{CellId, Geometry, Store};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::retry::{with_retry, write_sealed, RetryPolicy};
use crate::sealing::{check_geometry, open_cells, seal_cells};
use crate::{ProxyError, Result, VersionTable};

/// Cells sealed and written per batch by [`SealedPathOram::bulk_load`].
const BULK_BATCH: usize = 256;

/// Trusted state of a [`SealedPathOram`] between accesses.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SealedPathState {
    /// The scheme's state (position map, stashes, cached buckets).
    pub oram: PathOramState,
    /// Version of every cell.
    pub versions: VersionTable,
}

/// Path ORAM over a sealed store, one logical access at a time.
///
/// Each access runs one round per tree (the position-map trees, then the data tree); in each
/// round the path is read and opened, the scheme evicts, and the path is sealed and written
/// back, overlapping with the next round's read. Retryable storage errors are retried with
/// backoff; any other failure part-way through an access *poisons* the instance, because the
/// trusted state may no longer match the store — reload exported state to continue.
///
/// A fresh instance can be filled with initial contents by [`SealedPathOram::bulk_load`], which
/// writes every cell once instead of running one access per block.
pub struct SealedPathOram {
    oram: PathOram,
    store: Arc<dyn Store>,
    sealer: CellSealer,
    versions: VersionTable,
    retry: RetryPolicy,
    poisoned: bool,
}

impl std::fmt::Debug for SealedPathOram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedPathOram")
            .field("oram", &self.oram)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl SealedPathOram {
    /// The store shape this configuration needs: one cell per bucket of every tree.
    pub fn geometry(config: &PathOramConfig) -> Result<Geometry> {
        let cell = config.bucket_bytes() + CellSealer::OVERHEAD;
        let cell = u32::try_from(cell).map_err(|_| ProxyError::Geometry {
            found: "-".into(),
            needed: format!("cells of {cell} bytes"),
        })?;
        Ok(Geometry::new(config.total_cells(), cell)?)
    }

    /// A new, empty ORAM on a store of exactly [`SealedPathOram::geometry`]'s shape.
    pub fn new(config: PathOramConfig, store: Arc<dyn Store>, sealer: CellSealer) -> Result<Self> {
        Self::with_oram(PathOram::new(config), store, sealer)
    }

    /// Drives an existing scheme instance (for example a seeded one).
    pub fn with_oram(oram: PathOram, store: Arc<dyn Store>, sealer: CellSealer) -> Result<Self> {
        let versions = VersionTable::new(oram.config().total_cells());
        Self::assemble(oram, store, sealer, versions)
    }

    /// Continues from exported trusted state.
    pub fn from_state(
        state: SealedPathState,
        store: Arc<dyn Store>,
        sealer: CellSealer,
        rng: ChaCha20Rng,
    ) -> Result<Self> {
        let oram = PathOram::from_state(state.oram, rng)?;
        if state.versions.len() != oram.config().total_cells() {
            return Err(ProxyError::State(format!(
                "version table covers {} cells, the configuration has {}",
                state.versions.len(),
                oram.config().total_cells()
            )));
        }
        Self::assemble(oram, store, sealer, state.versions)
    }

    fn assemble(
        oram: PathOram,
        store: Arc<dyn Store>,
        sealer: CellSealer,
        versions: VersionTable,
    ) -> Result<Self> {
        check_geometry(store.geometry(), Self::geometry(oram.config())?)?;
        Ok(Self { oram, store, sealer, versions, retry: RetryPolicy::default(), poisoned: false })
    }

    /// Exports the trusted state (between accesses).
    pub fn export_state(&self) -> Result<SealedPathState> {
        if self.poisoned {
            return Err(ProxyError::Poisoned);
        }
        Ok(SealedPathState { oram: self.oram.export_state()?, versions: self.versions.clone() })
    }

    /// The scheme (configuration, statistics).
    pub fn oram(&self) -> &PathOram {
        &self.oram
    }

    /// The store this instance writes to.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Bytes of trusted memory: the scheme's state plus the version table.
    pub fn trusted_bytes(&self) -> u64 {
        self.oram.trusted_bytes() + self.versions.trusted_bytes()
    }

    /// Reads a block (zeros if never written).
    pub async fn read(&mut self, block: BlockId) -> Result<Vec<u8>> {
        self.access(block, Op::Read).await
    }

    /// Writes a block.
    pub async fn write(&mut self, block: BlockId, data: Vec<u8>) -> Result<()> {
        self.access(block, Op::Write(data)).await.map(drop)
    }

    /// Performs several accesses in order; returns each block's contents before its access.
    pub async fn batch(&mut self, ops: Vec<(BlockId, Op)>) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::with_capacity(ops.len());
        for (block, op) in ops {
            out.push(self.access(block, op).await?);
        }
        Ok(out)
    }

    /// One logical access; returns the block's contents before it.
    pub async fn access(&mut self, block: BlockId, op: Op) -> Result<Vec<u8>> {
        if self.poisoned {
            return Err(ProxyError::Poisoned);
        }
        // Invalid requests are refused here, before anything changes.
        let read = self.oram.start(block, op)?;
        match self.run(read).await {
            Ok(data) => {
                self.oram.check_stash()?;
                Ok(data)
            }
            Err(e) => {
                self.oram.abort();
                self.poisoned = true;
                tracing::warn!(error = %e, "ORAM access failed part-way; instance poisoned");
                Err(e)
            }
        }
    }

    /// Fills a fresh ORAM so that every block `i` holds `data(BlockId(i))` (exactly
    /// `block_size` bytes each), as if each had been written, but with every cell of the store
    /// written once instead of one access per block. Cells are sealed and written in batches;
    /// `progress(cells_done, total_cells)` is called before the first batch and after each.
    ///
    /// Refused (without poisoning) unless no access was ever made. Any failure part-way —
    /// storage, sealing, a block of the wrong size — poisons the instance, as for an access.
    /// Blocks that do not fit in the tree stay in the stash; if that exceeds the stash bound,
    /// the load completes and [`blindfold_oram::OramError::StashOverflow`] is returned.
    ///
    /// # Security
    ///
    /// The store sees every cell written exactly once (under version 1 for a fresh store), in
    /// an order and in batches fixed by the configuration alone; nothing is read.
    pub async fn bulk_load<F: FnMut(BlockId) -> Vec<u8>>(
        &mut self,
        mut data: F,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<()> {
        if self.poisoned {
            return Err(ProxyError::Poisoned);
        }
        let mut load = self.oram.bulk_load()?;
        let total = load.total_cells();
        progress(0, total);
        match self.run_bulk_load(&mut load, &mut data, &mut progress).await {
            Ok(()) => {
                tracing::debug!(cells = total, "bulk load complete");
                self.oram.check_stash()?;
                Ok(())
            }
            Err(e) => {
                self.oram.abort();
                self.poisoned = true;
                tracing::warn!(error = %e, "bulk load failed part-way; instance poisoned");
                Err(e)
            }
        }
    }

    // Generic rather than `dyn` so that the future is `Send` whenever the closures are.
    async fn run_bulk_load<F, P>(
        &mut self,
        load: &mut BulkLoad,
        data: &mut F,
        progress: &mut P,
    ) -> Result<()>
    where
        F: FnMut(BlockId) -> Vec<u8>,
        P: FnMut(u64, u64),
    {
        let store = Arc::clone(&self.store);
        loop {
            let step = self.oram.bulk_load_step(load, data, BULK_BATCH)?;
            let Some(batch) = step else { return Ok(()) };
            let sealed = seal_cells(&self.sealer, &mut self.versions, batch)?;
            write_sealed(&*store, self.retry, sealed).await?;
            progress(load.cells_done(), load.total_cells());
        }
    }

    async fn run(&mut self, mut read: Vec<CellId>) -> Result<Vec<u8>> {
        let store = Arc::clone(&self.store);
        let retry = self.retry;
        let mut fetched = with_retry(retry, || store.read(&read)).await?;
        loop {
            let plain = open_cells(&self.sealer, &self.versions, &read, fetched)?;
            match self.oram.feed(plain)? {
                Progress::Continue { writes, read: next } => {
                    let sealed = seal_cells(&self.sealer, &mut self.versions, writes)?;
                    let write = write_sealed(&*store, retry, sealed);
                    let fetch = with_retry(retry, || store.read(&next));
                    let (w, r) = tokio::join!(write, fetch);
                    w?;
                    fetched = r?;
                    read = next;
                }
                Progress::Done { writes, data } => {
                    let sealed = seal_cells(&self.sealer, &mut self.versions, writes)?;
                    write_sealed(&*store, retry, sealed).await?;
                    return Ok(data);
                }
            }
        }
    }
}
