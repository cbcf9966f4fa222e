//! The block engine under the object layer: what stores the fixed-size logical blocks.
//!
//! The object layer talks to a [`SharedEngine`]: many requests call it at once. An engine that
//! serves one access at a time ([`BlockEngine`]) is shared through [`Serialized`], which queues
//! callers and groups their commits.
//!
//! The gateway runs on [`DurableTao`] (the concurrent TaoStore-style engine, the default) or on
//! [`DurablePathOram`] (the sequential Path ORAM), both crash-consistent. [`DirectEngine`]
//! exists only as the baseline of `blindfold bench gateway`: it serves the same object layer,
//! S3 front end and directory with the ORAM taken out, so the benchmark can measure what
//! obliviousness costs end to end.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::journal::{Mirrored, Tap};
use crate::{
    DurableObliviStore, DurablePathOram, DurableTao, DurableTee, ProxyError, Result, SealedDirect,
    VerifyReport,
};
use blindfold_oram::{BlockId, Op};
use futures::future::LocalBoxFuture;

/// Storage of fixed-size logical blocks that many requests use at once.
///
/// Batches name distinct blocks (an engine may refuse a batch that repeats one). Writes become
/// durable at [`SharedEngine::commit`], which covers every write that completed before it was
/// called; the object layer commits before it publishes an object in the directory.
#[async_trait::async_trait]
pub trait SharedEngine: Send + Sync + std::fmt::Debug {
    /// Bytes per block.
    fn block_size(&self) -> usize;

    /// Short name for reports (`"path-oram"`, `"direct"`).
    fn kind(&self) -> &'static str;

    /// Whether the engine's trusted state survives a restart (false for the baseline).
    fn durable(&self) -> bool;

    /// Blocks an object stream hands the engine per call: larger batches mean fewer round
    /// trips, at the price of that many blocks of buffer per stream (and, for an engine that
    /// serves one batch at a time, of making other requests wait behind it).
    fn batch_blocks(&self) -> usize {
        16
    }

    /// Reads distinct blocks (zeros for blocks never written), in order.
    async fn read_many(&self, blocks: &[BlockId]) -> Result<Vec<Vec<u8>>>;

    /// Writes distinct blocks; durable after the next [`SharedEngine::commit`].
    async fn write_many(&self, blocks: Vec<(BlockId, Vec<u8>)>) -> Result<()>;

    /// Makes every write that completed before this call durable.
    async fn commit(&self) -> Result<()>;

    /// As [`SharedEngine::commit`], but may return before the commit's record is in the redo
    /// log's mirror (the gateway's store-side log): the writes are durable once the returned
    /// [`Mirrored::wait`] ends, or once a later entry of the same mirror is durable. By
    /// default, a whole commit and nothing left to wait for.
    async fn commit_queued(&self) -> Result<Mirrored> {
        self.commit().await?;
        Ok(Mirrored::default())
    }

    /// Commits and saves the whole trusted state (clean shutdown, no traffic).
    async fn shutdown(&self) -> Result<()>;

    /// Authenticates every stored cell; `progress(done, total)` is called as it goes.
    fn verify<'a>(
        &'a self,
        progress: &'a mut dyn FnMut(u64, u64),
    ) -> LocalBoxFuture<'a, Result<VerifyReport>>;

    /// The blocks that cannot be read while the cells `bad` are damaged (their current path
    /// crosses one of them), or `None` if the engine cannot tell (e.g. a recursive position
    /// map). Only after [`SharedEngine::verify`] (quiescent).
    async fn blocks_through(&self, _bad: &[u64]) -> Option<Vec<u64>> {
        None
    }

    /// The engine's state for the metrics (stash, subtree, trusted memory); cheap, never
    /// waits for the engine.
    fn gauges(&self) -> EngineGauges {
        EngineGauges::default()
    }

    /// Paths of a sweep that rewrites every stored cell (0 if the engine cannot sweep).
    async fn sweep_paths(&self) -> u64 {
        0
    }

    /// Reads and writes back the sweep's paths `range`, in order, re-sealing every cell on
    /// them under the current key (a key rotation, see [`crate::rotation`]). Which paths it
    /// touches depends only on `range`. Durable after the next [`SharedEngine::commit`].
    async fn sweep(&self, _range: std::ops::Range<u64>) -> Result<()> {
        Err(ProxyError::State(format!("the {} engine cannot sweep", self.kind())))
    }

    /// One step of a growth to `blocks` logical blocks made in place, by an engine whose
    /// blocks live elsewhere (the load balancer over ORAM nodes), called on the quiet engine;
    /// returns what was done, for the operator. `None`: the engine grows by a rebuild into a
    /// new store array instead ([`crate::lifecycle::grow`]), as every engine of the catalogue.
    async fn grow_in_place(&self, _blocks: u64, _step: InPlaceGrowth) -> Option<Result<String>> {
        None
    }

    /// Where the engine's redo log can be mirrored (`--durability store`): every engine of the
    /// catalogue has one; `None` for an engine with no redo log of its own.
    async fn journal_tap(&self) -> Option<Tap> {
        None
    }
}

/// The two steps of a growth in place ([`SharedEngine::grow_in_place`]), between which the
/// gateway records the new capacity: a crash before that record leaves an engine that has
/// room to spare; after it, the engine opens at the recorded size and finishes the growth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InPlaceGrowth {
    /// Make room for the new size where the blocks live; the engine serves on at its size.
    MakeRoom,
    /// Serve the new size.
    Adopt,
}

fn check_distinct(blocks: impl Iterator<Item = BlockId>) -> Result<()> {
    let mut seen: Vec<u64> = blocks.map(|b| b.0).collect();
    seen.sort_unstable();
    if seen.windows(2).any(|w| w[0] == w[1]) {
        return Err(ProxyError::State("a batch of block accesses names a block twice".into()));
    }
    Ok(())
}

/// Shares a one-access-at-a-time [`BlockEngine`]: callers queue for it (fairly, in arrival
/// order), a batch runs without interleaving, and commits are grouped — a commit that finds
/// its writes already covered by another caller's commit returns at once, so concurrent PUTs
/// share one redo-log sync and one store write of their paths' common top.
#[derive(Debug)]
pub struct Serialized<E> {
    inner: tokio::sync::Mutex<E>,
    block_size: usize,
    kind: &'static str,
    durable: bool,
    /// Write batches completed (counted under the lock).
    written: AtomicU64,
    /// Value of `written` that the last commit covered.
    committed: AtomicU64,
    /// The engine's gauges when the lock was last free.
    gauges: parking_lot::Mutex<EngineGauges>,
}

impl<E: BlockEngine> Serialized<E> {
    /// Shares `engine`.
    pub fn new(engine: E) -> Self {
        Self {
            block_size: engine.block_size(),
            kind: engine.kind(),
            durable: engine.durable(),
            inner: tokio::sync::Mutex::new(engine),
            written: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            gauges: parking_lot::Mutex::new(EngineGauges::default()),
        }
    }
}

#[async_trait::async_trait]
impl<E: BlockEngine + Sync> SharedEngine for Serialized<E> {
    fn block_size(&self) -> usize {
        self.block_size
    }

    async fn blocks_through(&self, bad: &[u64]) -> Option<Vec<u64>> {
        self.inner.lock().await.blocks_through(bad)
    }

    fn gauges(&self) -> EngineGauges {
        let mut cached = self.gauges.lock();
        if let Ok(e) = self.inner.try_lock() {
            *cached = e.gauges();
        }
        *cached
    }

    fn kind(&self) -> &'static str {
        self.kind
    }

    fn durable(&self) -> bool {
        self.durable
    }

    async fn read_many(&self, blocks: &[BlockId]) -> Result<Vec<Vec<u8>>> {
        check_distinct(blocks.iter().copied())?;
        self.inner.lock().await.read_many(blocks).await
    }

    async fn write_many(&self, blocks: Vec<(BlockId, Vec<u8>)>) -> Result<()> {
        check_distinct(blocks.iter().map(|b| b.0))?;
        let mut e = self.inner.lock().await;
        e.write_many(blocks).await?;
        self.written.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn commit(&self) -> Result<()> {
        let mine = self.written.load(Ordering::SeqCst);
        if self.committed.load(Ordering::SeqCst) >= mine {
            return Ok(());
        }
        let mut e = self.inner.lock().await;
        if self.committed.load(Ordering::SeqCst) >= mine {
            return Ok(()); // another caller's commit covered these writes while we queued
        }
        // Writes only happen under the lock: everything counted so far is in this commit.
        let covered = self.written.load(Ordering::SeqCst);
        e.commit().await?;
        self.committed.store(covered, Ordering::SeqCst);
        Ok(())
    }

    async fn shutdown(&self) -> Result<()> {
        let mut e = self.inner.lock().await;
        e.commit().await?;
        e.checkpoint()
    }

    async fn sweep_paths(&self) -> u64 {
        self.inner.lock().await.sweep_paths()
    }

    async fn journal_tap(&self) -> Option<Tap> {
        self.inner.lock().await.journal_tap()
    }

    async fn sweep(&self, range: std::ops::Range<u64>) -> Result<()> {
        let mut e = self.inner.lock().await;
        e.sweep(range).await?;
        // Counted as a write, so that the next commit covers it.
        self.written.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn verify<'a>(
        &'a self,
        progress: &'a mut dyn FnMut(u64, u64),
    ) -> LocalBoxFuture<'a, Result<VerifyReport>> {
        Box::pin(async move {
            let mut e = self.inner.lock().await;
            e.verify(progress).await
        })
    }
}

/// Storage of fixed-size logical blocks, one access at a time (share it with [`Serialized`]).
///
/// Writes become durable at [`BlockEngine::commit`].
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

    /// Reads distinct blocks, in order; engines that can fetch them in fewer round trips
    /// override this.
    async fn read_many(&mut self, blocks: &[BlockId]) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::with_capacity(blocks.len());
        for &b in blocks {
            out.push(self.read(b).await?);
        }
        Ok(out)
    }

    /// See [`SharedEngine::blocks_through`].
    fn blocks_through(&self, _bad: &[u64]) -> Option<Vec<u64>> {
        None
    }

    /// See [`SharedEngine::gauges`].
    fn gauges(&self) -> EngineGauges {
        EngineGauges::default()
    }

    /// Writes distinct blocks; engines that can batch the work override this.
    async fn write_many(&mut self, blocks: Vec<(BlockId, Vec<u8>)>) -> Result<()> {
        for (b, data) in blocks {
            self.write(b, data).await?;
        }
        Ok(())
    }

    /// Makes every write so far durable.
    async fn commit(&mut self) -> Result<()>;

    /// Saves the whole trusted state (clean shutdown). Only with nothing pending.
    fn checkpoint(&mut self) -> Result<()>;

    /// See [`SharedEngine::sweep_paths`].
    fn sweep_paths(&self) -> u64 {
        0
    }

    /// See [`SharedEngine::sweep`].
    async fn sweep(&mut self, _range: std::ops::Range<u64>) -> Result<()> {
        Err(ProxyError::State(format!("the {} engine cannot sweep", self.kind())))
    }

    /// Where the engine's redo log can be mirrored (see [`SharedEngine::journal_tap`]).
    fn journal_tap(&self) -> Option<Tap> {
        None
    }

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

    fn journal_tap(&self) -> Option<Tap> {
        Some(self.tap())
    }

    fn blocks_through(&self, bad: &[u64]) -> Option<Vec<u64>> {
        DurablePathOram::blocks_through(self, bad)
    }

    fn gauges(&self) -> EngineGauges {
        let oram = self.oram();
        EngineGauges {
            stash: oram.stash_sizes().iter().sum::<usize>() as u64,
            stash_max: oram.stats().max_stash as u64,
            subtree: 0,
            trusted_bytes: self.trusted_bytes(),
        }
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

    async fn read_many(&mut self, blocks: &[BlockId]) -> Result<Vec<Vec<u8>>> {
        self.access_many(blocks.iter().map(|&b| (b, Op::Read)).collect()).await
    }

    async fn write_many(&mut self, blocks: Vec<(BlockId, Vec<u8>)>) -> Result<()> {
        self.access_many(blocks.into_iter().map(|(b, d)| (b, Op::Write(d))).collect()).await?;
        Ok(())
    }

    async fn commit(&mut self) -> Result<()> {
        DurablePathOram::commit(self).await
    }

    fn checkpoint(&mut self) -> Result<()> {
        DurablePathOram::checkpoint(self)
    }

    fn sweep_paths(&self) -> u64 {
        DurablePathOram::sweep_paths(self)
    }

    async fn sweep(&mut self, range: std::ops::Range<u64>) -> Result<()> {
        DurablePathOram::sweep(self, range).await
    }

    fn verify<'a>(
        &'a mut self,
        progress: &'a mut dyn FnMut(u64, u64),
    ) -> LocalBoxFuture<'a, Result<VerifyReport>> {
        Box::pin(DurablePathOram::verify(self, progress))
    }
}

/// The TaoStore engine serves many requests by itself: no queue in front of it.
#[async_trait::async_trait]
impl SharedEngine for DurableTao {
    fn block_size(&self) -> usize {
        self.engine().config().block_size() as usize
    }

    async fn journal_tap(&self) -> Option<Tap> {
        Some(self.tap())
    }

    async fn blocks_through(&self, bad: &[u64]) -> Option<Vec<u64>> {
        Some(self.engine().blocks_through(bad))
    }

    fn gauges(&self) -> EngineGauges {
        let e = self.engine();
        EngineGauges {
            stash: e.stash_len() as u64,
            stash_max: e.stats().max_stash as u64,
            subtree: e.subtree_len() as u64,
            trusted_bytes: self.trusted_bytes(),
        }
    }

    fn kind(&self) -> &'static str {
        "tao"
    }

    fn batch_blocks(&self) -> usize {
        64 // requests run concurrently: a bigger batch costs nobody else a wait
    }

    fn durable(&self) -> bool {
        true
    }

    async fn read_many(&self, blocks: &[BlockId]) -> Result<Vec<Vec<u8>>> {
        DurableTao::read_many(self, blocks).await
    }

    async fn write_many(&self, blocks: Vec<(BlockId, Vec<u8>)>) -> Result<()> {
        DurableTao::write_many(self, blocks).await
    }

    async fn commit(&self) -> Result<()> {
        DurableTao::commit(self).await
    }

    async fn commit_queued(&self) -> Result<Mirrored> {
        DurableTao::commit_queued(self).await
    }

    async fn sweep_paths(&self) -> u64 {
        DurableTao::sweep_paths(self)
    }

    async fn sweep(&self, range: std::ops::Range<u64>) -> Result<()> {
        DurableTao::sweep(self, range).await
    }

    async fn shutdown(&self) -> Result<()> {
        DurableTao::shutdown(self).await
    }

    fn verify<'a>(
        &'a self,
        progress: &'a mut dyn FnMut(u64, u64),
    ) -> LocalBoxFuture<'a, Result<VerifyReport>> {
        Box::pin(DurableTao::verify(self, progress))
    }
}

/// [`SharedEngine`] for an engine that serves many requests by itself (its own `read_many`,
/// `write_many`, `commit`, `shutdown`, `verify`, `block_cells`, `config` and `stats`).
macro_rules! concurrent_engine {
    ($engine:ty, $kind:expr, $gauges:expr) => {
        #[async_trait::async_trait]
        impl SharedEngine for $engine {
            fn block_size(&self) -> usize {
                self.config().block_size() as usize
            }

            async fn journal_tap(&self) -> Option<Tap> {
                Some(self.tap())
            }

            async fn blocks_through(&self, bad: &[u64]) -> Option<Vec<u64>> {
                let bad: std::collections::HashSet<u64> = bad.iter().copied().collect();
                Some(
                    self.block_cells()
                        .into_iter()
                        .filter(|(_, c)| bad.contains(&c.0))
                        .map(|(b, _)| b)
                        .collect(),
                )
            }

            fn gauges(&self) -> EngineGauges {
                let gauges: fn(&$engine) -> EngineGauges = $gauges;
                gauges(self)
            }

            fn kind(&self) -> &'static str {
                let kind: fn(&$engine) -> &'static str = $kind;
                kind(self)
            }

            fn batch_blocks(&self) -> usize {
                64
            }

            fn durable(&self) -> bool {
                true
            }

            async fn read_many(&self, blocks: &[BlockId]) -> Result<Vec<Vec<u8>>> {
                check_distinct(blocks.iter().copied())?;
                <$engine>::read_many(self, blocks).await
            }

            async fn write_many(&self, blocks: Vec<(BlockId, Vec<u8>)>) -> Result<()> {
                check_distinct(blocks.iter().map(|b| b.0))?;
                <$engine>::write_many(self, blocks).await
            }

            async fn commit(&self) -> Result<()> {
                <$engine>::commit(self).await
            }

            async fn sweep_paths(&self) -> u64 {
                <$engine>::sweep_paths(self)
            }

            async fn sweep(&self, range: std::ops::Range<u64>) -> Result<()> {
                <$engine>::sweep(self, range).await
            }

            async fn shutdown(&self) -> Result<()> {
                <$engine>::shutdown(self).await
            }

            fn verify<'a>(
                &'a self,
                progress: &'a mut dyn FnMut(u64, u64),
            ) -> LocalBoxFuture<'a, Result<VerifyReport>> {
                Box::pin(<$engine>::verify(self, progress))
            }
        }
    };
}

// The TEE engine serves many requests by itself, as the TaoStore engine does.
concurrent_engine!(DurableTee, |_| "tee", |e| {
    let s = e.stats();
    EngineGauges {
        stash: s.waiting as u64,
        stash_max: s.oram.max_waiting as u64,
        subtree: 0,
        trusted_bytes: s.trusted_bytes,
    }
});

// ObliviStore and CURIOUS: accesses to different partitions run at once, shuffles in the
// background; the eviction cache shows as the stash.
concurrent_engine!(
    DurableObliviStore,
    |e| match (e.config().path_shape(), e.config().is_curious()) {
        (Some(_), _) => "curious-path",
        (None, true) => "curious",
        (None, false) => "oblivistore",
    },
    |e| {
        let s = e.stats();
        EngineGauges {
            stash: s.cached as u64,
            stash_max: 0,
            subtree: 0,
            trusted_bytes: s.trusted_bytes,
        }
    }
);

/// **Benchmark baseline only — neither oblivious nor crash-consistent.**
///
/// Block `i` is sealed (same AEAD, versions and integrity checks as the ORAM's cells) and kept
/// in cell `i` of the store, so the store sees exactly which block every request touches.
/// Requests run concurrently (no queue), each batch is one store request, and
/// [`SharedEngine::commit`] flushes the store. The cell versions live only in memory and are
/// never saved, so a data directory served by this engine cannot be reopened: the gateway
/// refuses to start it on anything but a fresh data directory.
#[derive(Debug)]
pub struct DirectEngine {
    inner: SealedDirect,
}

impl DirectEngine {
    /// Wraps a fresh [`SealedDirect`] store.
    pub fn new(inner: SealedDirect) -> Self {
        Self { inner }
    }
}

#[async_trait::async_trait]
impl SharedEngine for DirectEngine {
    fn block_size(&self) -> usize {
        self.inner.block_size() as usize
    }

    fn kind(&self) -> &'static str {
        "direct"
    }

    fn batch_blocks(&self) -> usize {
        64 // as the concurrent ORAM engine: same round trips per object
    }

    fn durable(&self) -> bool {
        false
    }

    async fn read_many(&self, blocks: &[BlockId]) -> Result<Vec<Vec<u8>>> {
        self.inner.read_many(blocks).await
    }

    async fn write_many(&self, blocks: Vec<(BlockId, Vec<u8>)>) -> Result<()> {
        check_distinct(blocks.iter().map(|b| b.0))?;
        self.inner.write_many(blocks).await
    }

    async fn commit(&self) -> Result<()> {
        self.inner.flush().await
    }

    async fn shutdown(&self) -> Result<()> {
        self.inner.flush().await
    }

    fn verify<'a>(
        &'a self,
        progress: &'a mut dyn FnMut(u64, u64),
    ) -> LocalBoxFuture<'a, Result<VerifyReport>> {
        Box::pin(self.inner.verify(progress))
    }
}

/// Opens a block engine that keeps its blocks elsewhere than the data directory's store (the
/// load balancer over ORAM nodes, `blindfold-node`), from the ORAM state directory
/// (`<data-dir>/oram`), the parameters, the master key, during a key rotation the key being
/// retired (what it sealed must still open; the engine re-seals it under the master key), and
/// whether the data directory is being created. The gateway then opens no store array for the
/// engine (the store still holds the encrypted snapshot) and cannot grow it.
pub type EngineFactory = Box<
    dyn FnOnce(
            std::path::PathBuf,
            crate::EngineParams,
            std::sync::Arc<blindfold_crypto::MasterKey>,
            Option<std::sync::Arc<blindfold_crypto::MasterKey>>,
            bool,
        )
            -> futures::future::BoxFuture<'static, Result<std::sync::Arc<dyn SharedEngine>>>
        + Send,
>;

/// Engine state read when the metrics are scraped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineGauges {
    /// Blocks in the stash now.
    pub stash: u64,
    /// Largest stash seen.
    pub stash_max: u64,
    /// Buckets held in the concurrent engine's subtree now (0 for Path ORAM).
    pub subtree: u64,
    /// Bytes of trusted memory the engine's state takes.
    pub trusted_bytes: u64,
}
