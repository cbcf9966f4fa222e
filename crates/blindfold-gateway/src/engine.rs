//! The block engine under the object layer: what stores the fixed-size logical blocks.
//!
//! The gateway runs on [`DurablePathOram`], the crash-consistent Path ORAM. [`DirectEngine`]
//! exists only as the baseline of `blindfold bench gateway`: it serves the same object layer,
//! S3 front end and directory with the ORAM taken out, so the benchmark can measure what
//! obliviousness costs end to end.

use blindfold_oram::BlockId;
use blindfold_proxy::{DurablePathOram, Result, SealedDirect, VerifyReport};
use futures::future::LocalBoxFuture;

/// Storage of fixed-size logical blocks, as the object layer uses it.
///
/// Writes become durable at [`BlockEngine::commit`]; the object layer commits before it
/// publishes an object in the directory.
#[async_trait::async_trait]
pub trait BlockEngine: Send + std::fmt::Debug {
    /// Bytes per block.
    fn block_size(&self) -> usize;

    /// Short name for reports (`"path-oram"`, `"direct"`).
    fn kind(&self) -> &'static str;

    /// Whether the engine's trusted state survives a restart (false for the baseline).
    fn durable(&self) -> bool;

    /// Reads a block (zeros if never written).
    async fn read(&mut self, block: BlockId) -> Result<Vec<u8>>;

    /// Writes a block; durable after the next [`BlockEngine::commit`].
    async fn write(&mut self, block: BlockId, data: Vec<u8>) -> Result<()>;

    /// Makes every write so far durable.
    async fn commit(&mut self) -> Result<()>;

    /// Saves the whole trusted state (clean shutdown). Only with nothing pending.
    fn checkpoint(&mut self) -> Result<()>;

    /// Authenticates every stored cell; `progress(done, total)` is called as it goes.
    fn verify<'a>(
        &'a mut self,
        progress: &'a mut dyn FnMut(u64, u64),
    ) -> LocalBoxFuture<'a, Result<VerifyReport>>;
}

#[async_trait::async_trait]
impl BlockEngine for DurablePathOram {
    fn block_size(&self) -> usize {
        self.oram().config().block_size() as usize
    }

    fn kind(&self) -> &'static str {
        "path-oram"
    }

    fn durable(&self) -> bool {
        true
    }

    async fn read(&mut self, block: BlockId) -> Result<Vec<u8>> {
        DurablePathOram::read(self, block).await
    }

    async fn write(&mut self, block: BlockId, data: Vec<u8>) -> Result<()> {
        DurablePathOram::write(self, block, data).await
    }

    async fn commit(&mut self) -> Result<()> {
        DurablePathOram::commit(self).await
    }

    fn checkpoint(&mut self) -> Result<()> {
        DurablePathOram::checkpoint(self)
    }

    fn verify<'a>(
        &'a mut self,
        progress: &'a mut dyn FnMut(u64, u64),
    ) -> LocalBoxFuture<'a, Result<VerifyReport>> {
        Box::pin(DurablePathOram::verify(self, progress))
    }
}

/// Blocks written in one batch by [`DirectEngine`].
const DIRECT_BATCH: usize = 256;

/// **Benchmark baseline only — neither oblivious nor crash-consistent.**
///
/// Block `i` is sealed (same AEAD, versions and integrity checks as the ORAM's cells) and kept
/// in cell `i` of the store, so the store sees exactly which block every request touches.
/// Writes are buffered and sent in batches of 256 cells (as the ORAM's commit batches them);
/// [`BlockEngine::commit`] writes the buffer and flushes the store. The cell versions live
/// only in memory and are never saved ([`BlockEngine::checkpoint`] does nothing), so a data
/// directory served by this engine cannot be reopened: the gateway refuses to start it on
/// anything but a fresh data directory.
#[derive(Debug)]
pub struct DirectEngine {
    inner: SealedDirect,
    pending: Vec<(BlockId, Vec<u8>)>,
}

impl DirectEngine {
    /// Wraps a fresh [`SealedDirect`] store.
    pub fn new(inner: SealedDirect) -> Self {
        Self { inner, pending: Vec::new() }
    }

    async fn write_pending(&mut self) -> Result<()> {
        if !self.pending.is_empty() {
            let batch = std::mem::take(&mut self.pending);
            self.inner.write_many(batch).await?;
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl BlockEngine for DirectEngine {
    fn block_size(&self) -> usize {
        self.inner.block_size() as usize
    }

    fn kind(&self) -> &'static str {
        "direct"
    }

    fn durable(&self) -> bool {
        false
    }

    async fn read(&mut self, block: BlockId) -> Result<Vec<u8>> {
        if let Some((_, data)) = self.pending.iter().rev().find(|(b, _)| *b == block) {
            return Ok(data.clone());
        }
        self.inner.read(block).await
    }

    async fn write(&mut self, block: BlockId, data: Vec<u8>) -> Result<()> {
        self.pending.retain(|(b, _)| *b != block);
        self.pending.push((block, data));
        if self.pending.len() >= DIRECT_BATCH {
            self.write_pending().await?;
        }
        Ok(())
    }

    async fn commit(&mut self) -> Result<()> {
        self.write_pending().await?;
        self.inner.flush().await
    }

    fn checkpoint(&mut self) -> Result<()> {
        Ok(())
    }

    fn verify<'a>(
        &'a mut self,
        progress: &'a mut dyn FnMut(u64, u64),
    ) -> LocalBoxFuture<'a, Result<VerifyReport>> {
        Box::pin(async move {
            self.commit().await?;
            self.inner.verify(progress).await
        })
    }
}
