//! The engine conformance suite watched failing: a correct engine (Path ORAM from the
//! catalogue) wrapped so that it breaks one promise, and the check of that promise must catch
//! it, naming itself. One broken engine per family of checks: the model (lost writes), crashes
//! (commits that commit nothing), tampering (integrity errors answered with zeros), the trace
//! (a read of a cell chosen by the block), abandoned requests (garbage left by a dropped write)
//! rotation (a sweep that re-seals nothing), and rebuilding and growing (a block lost).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use blindfold_oram::BlockId;
use blindfold_proxy::catalogue::OramEngine;
use blindfold_proxy::engine::{EngineGauges, SharedEngine};
use blindfold_proxy::rebuild::Rebuilt;
use blindfold_proxy::{ProxyError, VerifyReport};
use blindfold_store::{CellId, Store, TraceOp};
use blindfold_testkit::engines::{self, Capabilities, CatalogueEngine, Subject, Wrap};
use futures::future::LocalBoxFuture;
use parking_lot::Mutex;

/// What is wrong with the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
    /// Every fifth batch of writes is dropped, and reported done.
    LosesWrites,
    /// `commit` returns at once without making anything durable.
    ForgetsCommits,
    /// An integrity error is answered with a block of zeros.
    HidesDamage,
    /// Every access also reads the one cell whose target follows from the block.
    Leaks,
    /// A write whose caller drops it part-way leaves garbage in its blocks.
    SpoilsDroppedWrites,
    /// A rotation's sweep returns at once, re-sealing nothing.
    SkipsSweeps,
    /// Block 0 reads as zeros, as after a rebuild or growth that dropped it (the engine is
    /// created and written, never read, before the rebuild checks rebuild it).
    LosesBlockZero,
    /// Nothing wrong with the engine, but the subject promises what Path ORAM does not keep:
    /// that no read reads a cell twice between writes of it (every path reads the root).
    OverPromises,
}

/// Writes garbage over `blocks` when dropped armed (a write abandoned part-way).
struct Spoiler {
    inner: Arc<dyn SharedEngine>,
    blocks: Vec<BlockId>,
    armed: bool,
}

impl Drop for Spoiler {
    fn drop(&mut self) {
        if self.armed {
            let inner = Arc::clone(&self.inner);
            let garbage =
                self.blocks.iter().map(|&b| (b, vec![0xab; inner.block_size()])).collect();
            tokio::spawn(async move {
                let _ = inner.write_many(garbage).await;
            });
        }
    }
}

#[derive(Debug)]
struct Broken {
    inner: Arc<dyn SharedEngine>,
    flaw: Flaw,
    store: Option<Arc<dyn Store>>,
    /// For [`Flaw::Leaks`]: a cell reaching each target of the store's view.
    leak_cells: Vec<u64>,
    writes: AtomicU64,
}

impl Broken {
    async fn leak(&self, blocks: &[BlockId]) {
        if let (Flaw::Leaks, Some(store)) = (self.flaw, &self.store) {
            for b in blocks {
                let cell = self.leak_cells[(b.0 as usize) % self.leak_cells.len()];
                let _ = store.read(&[CellId(cell)]).await;
            }
        }
    }
}

#[async_trait]
impl SharedEngine for Broken {
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    fn kind(&self) -> &'static str {
        "broken"
    }

    fn durable(&self) -> bool {
        true
    }

    async fn read_many(&self, blocks: &[BlockId]) -> blindfold_proxy::Result<Vec<Vec<u8>>> {
        self.leak(blocks).await;
        match self.inner.read_many(blocks).await {
            Err(e) if self.flaw == Flaw::HidesDamage && e.is_integrity() => {
                Ok(vec![vec![0; self.block_size()]; blocks.len()])
            }
            Ok(mut got) if self.flaw == Flaw::LosesBlockZero => {
                for (b, d) in blocks.iter().zip(&mut got) {
                    if b.0 == 0 {
                        d.fill(0);
                    }
                }
                Ok(got)
            }
            r => r,
        }
    }

    async fn write_many(&self, blocks: Vec<(BlockId, Vec<u8>)>) -> blindfold_proxy::Result<()> {
        let ids: Vec<BlockId> = blocks.iter().map(|(b, _)| *b).collect();
        self.leak(&ids).await;
        let n = self.writes.fetch_add(1, Ordering::SeqCst);
        if self.flaw == Flaw::LosesWrites && n % 5 == 4 {
            return Ok(());
        }
        let mut spoiler = Spoiler {
            inner: Arc::clone(&self.inner),
            blocks: ids,
            armed: self.flaw == Flaw::SpoilsDroppedWrites,
        };
        let r = self.inner.write_many(blocks).await;
        spoiler.armed = false;
        r
    }

    async fn commit(&self) -> blindfold_proxy::Result<()> {
        if self.flaw == Flaw::ForgetsCommits {
            return Ok(());
        }
        self.inner.commit().await
    }

    async fn shutdown(&self) -> blindfold_proxy::Result<()> {
        self.inner.shutdown().await
    }

    fn verify<'a>(
        &'a self,
        progress: &'a mut dyn FnMut(u64, u64),
    ) -> LocalBoxFuture<'a, blindfold_proxy::Result<VerifyReport>> {
        self.inner.verify(progress)
    }

    fn gauges(&self) -> EngineGauges {
        self.inner.gauges()
    }

    async fn sweep_paths(&self) -> u64 {
        self.inner.sweep_paths().await
    }

    async fn sweep(&self, range: std::ops::Range<u64>) -> blindfold_proxy::Result<()> {
        if self.flaw == Flaw::SkipsSweeps {
            return Ok(());
        }
        self.inner.sweep(range).await
    }
}

/// The store a broken engine's wrapper made, once it has.
type Kept = Mutex<Option<Arc<dyn Store>>>;

/// Path ORAM from the catalogue, broken by `flaw`.
struct BrokenSubject {
    inner: CatalogueEngine,
    flaw: Flaw,
}

impl BrokenSubject {
    fn new(flaw: Flaw) -> Self {
        Self::over(OramEngine::PathOram, flaw)
    }

    fn over(engine: OramEngine, flaw: Flaw) -> Self {
        Self { inner: CatalogueEngine::small(engine), flaw }
    }

    /// `wrap`, keeping the store it makes for the broken engine to read.
    fn keeping(wrap: Wrap) -> (Wrap, Arc<Kept>) {
        let slot: Arc<Kept> = Arc::default();
        let keep = Arc::clone(&slot);
        let wrap: Wrap = Arc::new(move |s| {
            let s = wrap(s);
            *keep.lock() = Some(Arc::clone(&s));
            s
        });
        (wrap, slot)
    }

    fn broken(&self, inner: Arc<dyn SharedEngine>, store: &Kept) -> Arc<dyn SharedEngine> {
        let store = store.lock().clone();
        let leak_cells = match (self.inner.capabilities().view, &store) {
            (Some(view), Some(store)) => {
                let mut by_target: HashMap<u64, u64> = HashMap::new();
                for c in 0..store.geometry().cell_count() {
                    if let Some(t) = view.target_of(CellId(c)) {
                        by_target.entry(t).or_insert(c);
                    }
                }
                (0..view.targets()).filter_map(|t| by_target.get(&t).copied()).collect()
            }
            _ => vec![0],
        };
        Arc::new(Broken { inner, flaw: self.flaw, store, leak_cells, writes: AtomicU64::new(0) })
    }
}

#[async_trait(?Send)]
impl Subject for BrokenSubject {
    fn name(&self) -> String {
        format!("{} broken by {:?}", self.inner.name(), self.flaw)
    }

    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    fn blocks(&self) -> u64 {
        self.inner.blocks()
    }

    fn capabilities(&self) -> Capabilities {
        let mut c = self.inner.capabilities();
        if self.flaw == Flaw::OverPromises {
            c.fresh_reads = Some(|e| e.op == TraceOp::Read);
        }
        c
    }

    async fn create(&self, wrap: Wrap) -> Arc<dyn SharedEngine> {
        let (wrap, store) = Self::keeping(wrap);
        let engine = self.inner.create(wrap).await;
        self.broken(engine, &store)
    }

    async fn reopen(&self, wrap: Wrap) -> Result<Arc<dyn SharedEngine>, ProxyError> {
        let (wrap, store) = Self::keeping(wrap);
        let engine = self.inner.reopen(wrap).await?;
        Ok(self.broken(engine, &store))
    }

    async fn rotate(&self, wrap: Wrap) -> Result<Arc<dyn SharedEngine>, ProxyError> {
        let (wrap, store) = Self::keeping(wrap);
        let engine = self.inner.rotate(wrap).await?;
        Ok(self.broken(engine, &store))
    }

    async fn rebuild(&self, wrap: Wrap, grow_to: Option<u64>) -> Result<Rebuilt, ProxyError> {
        self.inner.rebuild(wrap, grow_to).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "engine conformance check \"model\" failed on path-oram broken by \
                           LosesWrites")]
async fn the_model_check_catches_lost_writes() {
    engines::model(&BrokenSubject::new(Flaw::LosesWrites)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "(engine conformance check \"crash\" on path-oram broken by \
                           ForgetsCommits)")]
async fn the_crash_check_catches_commits_that_commit_nothing() {
    engines::crash(&BrokenSubject::new(Flaw::ForgetsCommits)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "engine conformance check \"tamper\" failed on path-oram broken by \
                           HidesDamage")]
async fn the_tamper_check_catches_damage_answered_with_zeros() {
    engines::tamper(&BrokenSubject::new(Flaw::HidesDamage)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "engine conformance check \"rollback\" failed on path-oram broken by \
                           HidesDamage")]
async fn the_rollback_check_catches_damage_answered_with_zeros() {
    engines::rollback(&BrokenSubject::new(Flaw::HidesDamage)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "engine conformance check \"trace\" failed on path-oram broken by \
                           Leaks")]
async fn the_trace_check_catches_a_cell_read_per_block() {
    engines::trace(&BrokenSubject::new(Flaw::Leaks)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(
    expected = "engine conformance check \"abandoned\" failed on oblivistore broken by \
                           SpoilsDroppedWrites"
)]
async fn the_abandoned_check_catches_garbage_left_by_dropped_writes() {
    // (Over ObliviStore, which goes on serving after dropped calls: Path ORAM answers later
    // calls with errors, so the check restarts it and the garbage never lands.)
    let subject = BrokenSubject::over(OramEngine::ObliviStore, Flaw::SpoilsDroppedWrites);
    engines::abandoned(&subject).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "engine conformance check \"rotate\" failed on path-oram broken by \
                           SkipsSweeps")]
async fn the_rotate_check_catches_a_sweep_that_reseals_nothing() {
    engines::rotate(&BrokenSubject::new(Flaw::SkipsSweeps)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "engine conformance check \"rebuild\" failed on path-oram broken by \
                           LosesBlockZero: after the rebuild: block 0")]
async fn the_rebuild_check_catches_a_lost_block() {
    engines::rebuild(&BrokenSubject::new(Flaw::LosesBlockZero)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "engine conformance check \"grow\" failed on path-oram broken by \
                           LosesBlockZero: after the rebuild: block 0")]
async fn the_grow_check_catches_a_lost_block() {
    engines::grow(&BrokenSubject::new(Flaw::LosesBlockZero)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "engine conformance check \"crash\" failed on path-oram broken by \
                           OverPromises: cell")]
async fn the_crash_check_holds_a_subject_to_its_promise_of_fresh_reads() {
    engines::crash(&BrokenSubject::new(Flaw::OverPromises)).await;
}

/// The same wrapper with nothing broken passes the checks it is broken for above: the
/// failures are the flaws', not the wrapper's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wrapper_without_a_flaw_passes() {
    let subject = BrokenSubject::new(Flaw::HidesDamage);
    // HidesDamage changes nothing until the store lies: the model and crash checks pass.
    engines::model(&subject).await;
    engines::crash(&subject).await;
}
