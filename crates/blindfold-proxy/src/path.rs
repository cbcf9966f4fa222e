use std::sync::Arc;
use std::time::Duration;

use blindfold_crypto::{CellAd, CellSealer, CryptoError};
use blindfold_oram::path::BulkLoad;
use blindfold_oram::{BlockId, Op, PathOram, PathOramConfig, PathOramState, Progress};
use blindfold_store::{CellId, Geometry, Store, StoreError};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::error::integrity;
use crate::{ProxyError, Result, VersionTable};

/// Bytes in front of the ciphertext in a sealed cell (key epoch and nonce); the rest of
/// [`CellSealer::OVERHEAD`] is the tag at the end.
const SEAL_HEADER: usize = CellSealer::OVERHEAD - 16;

/// Cells sealed and written per batch by [`SealedPathOram::bulk_load`].
const BULK_BATCH: usize = 256;

/// How often a retryable storage error is retried before the access fails.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RetryPolicy {
    pub attempts: u32,
    pub first_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { attempts: 4, first_backoff: Duration::from_millis(5) }
    }
}

pub(crate) async fn with_retry<T, F, Fut>(policy: RetryPolicy, mut f: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut backoff = policy.first_backoff;
    let mut attempt = 1;
    loop {
        match f().await {
            Err(e) if e.is_retryable() && attempt < policy.attempts => {
                tracing::debug!(attempt, error = %e, "retrying storage request");
                tokio::time::sleep(backoff).await;
                backoff *= 2;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Opens fetched cells against the trusted versions. Cells at version 0 were never written:
/// their contents are ignored (the read was still issued, so the store saw nothing special).
/// Refuses a store whose cells are of another size than `needed`'s, or fewer.
pub(crate) fn check_geometry(found: Geometry, needed: Geometry) -> Result<()> {
    crate::error::check_array(found, needed, "the store")
}

pub(crate) fn open_cells(
    sealer: &CellSealer,
    versions: &VersionTable,
    cells: &[CellId],
    fetched: Vec<Vec<u8>>,
) -> Result<Vec<Option<Vec<u8>>>> {
    let mut out = Vec::with_capacity(cells.len());
    for (cell, buf) in cells.iter().zip(fetched) {
        let version = versions.get(cell.0);
        if version == 0 {
            out.push(None);
            continue;
        }
        out.push(Some(open_cell(sealer, *cell, version, versions.epoch(cell.0), buf)?));
    }
    Ok(out)
}

/// Seals plaintext cells under their next versions and records those versions.
pub(crate) fn seal_cells(
    sealer: &CellSealer,
    versions: &mut VersionTable,
    plain: Vec<(CellId, Vec<u8>)>,
) -> Result<Vec<(CellId, Vec<u8>)>> {
    let mut out = Vec::with_capacity(plain.len());
    for (cell, data) in plain {
        let version = versions.next(cell.0);
        let sealed = seal_cell(sealer, cell, version, &data)?;
        versions.record(cell.0, version, &sealed);
        out.push((cell, sealed));
    }
    Ok(out)
}

/// Seals one plaintext cell under `version` (which the caller records as the cell's version).
pub(crate) fn seal_cell(
    sealer: &CellSealer,
    cell: CellId,
    version: u64,
    data: &[u8],
) -> Result<Vec<u8>> {
    let ad = CellAd { cell: cell.0, version, segment: 0 };
    let mut sealed = vec![0u8; data.len() + CellSealer::OVERHEAD];
    sealer.seal_into(&ad, data, &mut sealed).map_err(ProxyError::Crypto)?;
    Ok(sealed)
}

/// Refuses a sealed cell whose header names another key epoch than `epoch` (the one its
/// trusted version was sealed under), unless that is [`VersionTable::ANY_EPOCH`].
pub(crate) fn check_epoch(cell: u64, epoch: u32, sealed: &[u8]) -> Result<()> {
    if epoch == VersionTable::ANY_EPOCH || crate::versions::sealed_epoch(sealed) == Some(epoch) {
        return Ok(());
    }
    Err(ProxyError::Integrity { cell, source: CryptoError::Integrity { cell, segment: 0 } })
}

/// Opens one fetched cell sealed under `version` (non-zero) and key epoch `epoch` (see
/// [`check_epoch`]) and returns its plaintext.
pub(crate) fn open_cell(
    sealer: &CellSealer,
    cell: CellId,
    version: u64,
    epoch: u32,
    mut buf: Vec<u8>,
) -> Result<Vec<u8>> {
    check_epoch(cell.0, epoch, &buf)?;
    let ad = CellAd { cell: cell.0, version, segment: 0 };
    let len =
        sealer.open_in_place(&ad, &mut buf).map_err(|source| integrity(cell.0, source))?.len();
    buf.truncate(SEAL_HEADER + len);
    buf.drain(..SEAL_HEADER);
    Ok(buf)
}

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

/// Writes sealed cells, retrying a failed batch whole (writes are idempotent).
pub(crate) async fn write_sealed(
    store: &dyn Store,
    retry: RetryPolicy,
    sealed: Vec<(CellId, Vec<u8>)>,
) -> Result<()> {
    if sealed.is_empty() {
        return Ok(());
    }
    if !store.writes_may_be_retried() {
        // Nothing to keep for a retry: the buffers go to the store as they are.
        return Ok(store.write(sealed).await?);
    }
    match store.write(sealed.clone()).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_retryable() => {
            tracing::debug!(error = %e, "retrying storage write");
            Ok(with_retry(retry, || store.write(sealed.clone())).await?)
        }
        Err(e) => Err(e.into()),
    }
}
