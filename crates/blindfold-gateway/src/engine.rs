//! The gateway's wrappers around its block engine (the engine contract itself, [`SharedEngine`],
//! and the engines behind it live in `blindfold_proxy::engine`):
//!
//! * [`Watched`] — reports the engine's traffic to the observer and stops the gateway on the
//!   first error after which the engine refuses work;
//! * [`Swappable`] — lets `grow` and `recover` put a rebuilt engine in place while serving.

use std::sync::Arc;

use blindfold_oram::BlockId;
pub use blindfold_proxy::engine::{
    BlockEngine, DirectEngine, EngineGauges, Serialized, SharedEngine,
};
use blindfold_proxy::{ProxyError, Result, VerifyReport};
use futures::future::LocalBoxFuture;

use crate::observe::Observer;
/// Passes every call to an engine and reports, once, the first error after which the engine
/// refuses further work: an integrity violation or a poisoned driver. The serving process
/// watches [`Watched::subscribe`] and stops rather than answer every later request with an
/// error.
#[derive(Debug)]
pub struct Watched {
    inner: Arc<dyn SharedEngine>,
    tripped: tokio::sync::watch::Sender<Option<String>>,
    observer: Arc<Observer>,
}

impl Watched {
    /// Watches `inner`.
    pub fn new(inner: Arc<dyn SharedEngine>) -> Self {
        Self::observed(inner, Arc::new(Observer::new()))
    }

    /// Watches `inner` and reports its block traffic, commits and errors to `observer`.
    pub fn observed(inner: Arc<dyn SharedEngine>, observer: Arc<Observer>) -> Self {
        Self { inner, tripped: tokio::sync::watch::channel(None).0, observer }
    }

    /// Receives the first fatal error's message (`None` while there is none).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.tripped.subscribe()
    }

    fn note<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            if e.is_integrity() {
                self.observer.integrity_error();
            }
            // A disk that stayed full poisons the engine too (the access stopped half-way):
            // its message, which says what to do, is the one to keep.
            if e.is_integrity() || matches!(e, ProxyError::Poisoned | ProxyError::DiskFull(_)) {
                self.observer.set_poisoned();
                let msg = e.to_string();
                let full = matches!(e, ProxyError::DiskFull(_));
                self.tripped.send_if_modified(|v| {
                    if v.is_none() {
                        if full {
                            tracing::error!(error = %msg, "the engine stopped: its disk stayed full");
                        } else {
                            tracing::error!(error = %msg, "the engine stopped: its trusted state may no longer match the store");
                        }
                        *v = Some(msg);
                        true
                    } else {
                        false
                    }
                });
            }
        }
        r
    }
}

#[async_trait::async_trait]
impl SharedEngine for Watched {
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    async fn blocks_through(&self, bad: &[u64]) -> Option<Vec<u64>> {
        self.inner.blocks_through(bad).await
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn durable(&self) -> bool {
        self.inner.durable()
    }

    fn batch_blocks(&self) -> usize {
        self.inner.batch_blocks()
    }

    fn gauges(&self) -> EngineGauges {
        self.inner.gauges()
    }

    async fn read_many(&self, blocks: &[BlockId]) -> Result<Vec<Vec<u8>>> {
        self.observer.blocks(blocks.iter().map(|b| b.0), false, self.inner.block_size());
        self.note(self.inner.read_many(blocks).await)
    }

    async fn write_many(&self, blocks: Vec<(BlockId, Vec<u8>)>) -> Result<()> {
        self.observer.blocks(blocks.iter().map(|b| b.0 .0), true, self.inner.block_size());
        self.note(self.inner.write_many(blocks).await)
    }

    async fn commit(&self) -> Result<()> {
        let started = std::time::Instant::now();
        let r = self.note(self.inner.commit().await);
        if r.is_ok() {
            self.observer.commit(started.elapsed());
        }
        r
    }

    async fn commit_queued(&self) -> Result<blindfold_proxy::Mirrored> {
        let started = std::time::Instant::now();
        let r = self.note(self.inner.commit_queued().await);
        if r.is_ok() {
            self.observer.commit(started.elapsed());
        }
        r
    }

    async fn shutdown(&self) -> Result<()> {
        self.inner.shutdown().await
    }

    async fn sweep_paths(&self) -> u64 {
        self.inner.sweep_paths().await
    }

    async fn journal_tap(&self) -> Option<blindfold_proxy::Tap> {
        self.inner.journal_tap().await
    }

    async fn sweep(&self, range: std::ops::Range<u64>) -> Result<()> {
        self.note(self.inner.sweep(range).await)
    }

    fn verify<'a>(
        &'a self,
        progress: &'a mut dyn FnMut(u64, u64),
    ) -> LocalBoxFuture<'a, Result<VerifyReport>> {
        self.inner.verify(progress)
    }
}

/// An engine that can be replaced while the gateway serves (a growth of the store, see
/// [`crate::grow`]). Every call holds a shared lock for its whole length; [`Swappable::exclusive`]
/// waits for the calls in flight, holds back new ones (the lock is fair: a waiting exclusive
/// holder goes before later calls) and hands over the engine, which is then quiet until it is
/// replaced or the lock is released.
#[derive(Debug)]
pub struct Swappable {
    inner: tokio::sync::RwLock<Arc<dyn SharedEngine>>,
    block_size: usize,
    kind: &'static str,
    durable: bool,
    batch_blocks: usize,
}

impl Swappable {
    /// Serves through `inner` until it is replaced.
    pub fn new(inner: Arc<dyn SharedEngine>) -> Self {
        Self {
            block_size: inner.block_size(),
            kind: inner.kind(),
            durable: inner.durable(),
            batch_blocks: inner.batch_blocks(),
            inner: tokio::sync::RwLock::new(inner),
        }
    }

    /// The engine, to itself: no call reaches it while the guard lives. Assigning through the
    /// guard replaces it (with an engine of the same block size and kind).
    pub async fn exclusive(&self) -> tokio::sync::RwLockWriteGuard<'_, Arc<dyn SharedEngine>> {
        self.inner.write().await
    }
}

#[async_trait::async_trait]
impl SharedEngine for Swappable {
    fn block_size(&self) -> usize {
        self.block_size
    }

    fn kind(&self) -> &'static str {
        self.kind
    }

    fn durable(&self) -> bool {
        self.durable
    }

    fn batch_blocks(&self) -> usize {
        self.batch_blocks
    }

    fn gauges(&self) -> EngineGauges {
        // Never waits: during a swap the gauges read as empty.
        self.inner.try_read().map(|e| e.gauges()).unwrap_or_default()
    }

    async fn blocks_through(&self, bad: &[u64]) -> Option<Vec<u64>> {
        self.inner.read().await.blocks_through(bad).await
    }

    async fn read_many(&self, blocks: &[BlockId]) -> Result<Vec<Vec<u8>>> {
        self.inner.read().await.read_many(blocks).await
    }

    async fn write_many(&self, blocks: Vec<(BlockId, Vec<u8>)>) -> Result<()> {
        self.inner.read().await.write_many(blocks).await
    }

    async fn commit(&self) -> Result<()> {
        self.inner.read().await.commit().await
    }

    async fn commit_queued(&self) -> Result<blindfold_proxy::Mirrored> {
        self.inner.read().await.commit_queued().await
    }

    async fn shutdown(&self) -> Result<()> {
        self.inner.read().await.shutdown().await
    }

    async fn sweep_paths(&self) -> u64 {
        self.inner.read().await.sweep_paths().await
    }

    async fn journal_tap(&self) -> Option<blindfold_proxy::Tap> {
        self.inner.read().await.journal_tap().await
    }

    async fn sweep(&self, range: std::ops::Range<u64>) -> Result<()> {
        self.inner.read().await.sweep(range).await
    }

    fn verify<'a>(
        &'a self,
        progress: &'a mut dyn FnMut(u64, u64),
    ) -> LocalBoxFuture<'a, Result<VerifyReport>> {
        Box::pin(async move {
            let engine = self.inner.read().await;
            engine.verify(progress).await
        })
    }
}
