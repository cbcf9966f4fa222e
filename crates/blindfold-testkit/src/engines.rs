//! The engine conformance suite: one set of checks that every engine of the catalogue (and a
//! cluster of ORAM nodes behind its balancer) must pass, as [`crate::conformance`] is for
//! stores.
//!
//! The engine under test is a [`Subject`]: something that creates an engine over fresh stores,
//! reopens it over the stores that survived (after a clean stop or a crash), and, when it can,
//! reopens it under a new key with the old one being retired (a key rotation). The suite
//! reaches the stores only through the wrapper it hands the subject ([`Wrap`]): a store that
//! reorders replies, records the adversary's view, dies part-way, or tampers with what it
//! returns. [`CatalogueEngine`] is the subject of every engine in
//! [`blindfold_proxy::catalogue`], opened through [`open_engine`] exactly as the gateway opens
//! it.
//!
//! The checks (each a `pub async fn`; [`run_all`] runs them in turn) and what they hold an
//! engine to:
//!
//! * [`model`] — concurrent clients reading and writing batches against a `HashMap` model over
//!   a store that reorders replies; then a clean stop, a reopen, every block read back and
//!   every cell authenticated.
//! * [`crash`] — the store dies after `k` cell writes, for `k` spread over a whole cycle of
//!   writes and commits (recovery included): no acknowledged write is lost, nothing never
//!   written appears ([`CrashLedger`]); at the end every cell authenticates.
//! * [`fresh_after_crash`] — a block accessed just before a crash is not fetched again where
//!   the store saw it: the cells of the retried access overlap those of the crashed one no
//!   more than two accesses without a crash do, and what the reopen itself reads is only
//!   what the store saw read before.
//! * [`tamper`], [`swap`], [`rollback`] — the store flips a byte of every cell it returns,
//!   returns each cell's neighbour, or returns the cells as they were before a round of
//!   writes: reads are integrity errors ([`ProxyError::is_integrity`]) or the right data,
//!   never wrong data, and at least one is an error.
//! * [`abandoned`] — reads and writes dropped part-way (timeouts of a few milliseconds): never
//!   wrong data afterwards. The engine either goes on serving (every block holds its last
//!   completed write or one of the abandoned ones, new writes and commits work) or refuses
//!   until restarted, and the restart recovers what was committed. (Of the catalogue,
//!   TaoStore and Path ORAM take the second way, the others the first; the gateway runs
//!   engine calls in tasks of their own, so an abandoned S3 request never drops one.)
//! * [`trace`] — the store's view of three workloads (one block hammered, uniform random
//!   blocks, a sequential scan): the same requests per access (kind, count, bytes) and the
//!   same distribution of what the reads target (chi-square test of homogeneity).
//! * [`rotate`] — a key rotation's sweep (`sweep_paths`, `sweep`, two passes, as the gateway
//!   runs it) while clients read and write; afterwards the engine opens under the new key alone,
//!   the data is intact and every cell authenticates. Then a second rotation swept with no
//!   traffic at all, checked the same way: the sweep alone must re-seal every cell (under load,
//!   the clients' own accesses re-seal the paths they touch and can hide a sweep that does not).
//! * [`rebuild`], [`grow`] — `blindfold recover` from a clean stop's state and `blindfold grow`
//!   (to twice the blocks), through [`blindfold_proxy::lifecycle`]: nothing lost, every block
//!   written found, the new blocks zeros and writable, every cell authenticates. A subject that
//!   cannot be rebuilt must refuse and change nothing.
//!
//! Each failed check panics with a message naming it (`engine conformance check "…" failed on
//! <subject>: …`; a block the crash check finds wrong says `block N (engine conformance check
//! "crash" on <subject>) …`, from [`CrashLedger`]). Sizes are tiny (a few hundred blocks of
//! 64 bytes) so that every check runs in a second or two.
//!
//! Not here (yet): a rebuild from a snapshot older than the store (the lost run went on:
//! `crates/blindfold-proxy/tests/rebuild.rs` and the gateway's `recover` tests hold that), and
//! growing while serving (the gateway's `grow` tests). The engine-specific promise that no
//! *slot* is read twice between writes (ObliviStore's levels, the TEE design's queries) needs
//! to tell an access's reads from a shuffle's, which only the engine's own layout knows: a
//! subject may state it through [`Capabilities::fresh_reads`] (the catalogue's subjects do
//! not; `tee.rs` and `oblivistore.rs` keep those checks).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use blindfold_crypto::{MasterKey, StoreId};
use blindfold_oram::BlockId;
use blindfold_proxy::catalogue::{
    oram_geometry, physical_view, EngineParams, EngineStore, OramEngine, PhysicalView,
    PARAMS_VERSION,
};
use blindfold_proxy::engine::SharedEngine;
use blindfold_proxy::lifecycle::{self, open_engine};
use blindfold_proxy::rebuild::Rebuilt;
use blindfold_proxy::ProxyError;
use blindfold_store::{
    ByteRange, CellId, Geometry, JitterStore, MemoryStore, RecordingStore, Store, StoreUrl,
    TraceEvent, TraceOp,
};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{stats, CrashLedger, DyingStore};

/// How the suite wraps each store a subject opens: applied to every store array the engine
/// under test reads and writes (one per node in a cluster), once per engine opened.
pub type Wrap = Arc<dyn Fn(Arc<dyn Store>) -> Arc<dyn Store> + Send + Sync>;

/// The wrapper that adds nothing.
pub fn plain() -> Wrap {
    Arc::new(|s| s)
}

/// What a subject can do besides reading, writing and committing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Capabilities {
    /// Its trusted state survives a crash: [`Subject::reopen`] after the store died replays
    /// what was committed ([`crash`], [`fresh_after_crash`]).
    pub crash: bool,
    /// It can re-seal its cells under a new key ([`Subject::rotate`], [`rotate`]).
    pub rotate: bool,
    /// It can be rebuilt into a new store array and grown into a larger one
    /// ([`Subject::rebuild`], [`rebuild`], [`grow`]).
    pub rebuild: bool,
    /// What the store's cells mean to an observer: reads are compared by the target they
    /// reach (a tree's leaf, a flat store's cell). `None`: by cell.
    pub view: Option<PhysicalView>,
    /// A reopen after a crash reads only cells the store saw read before it (the tree engines
    /// repeat the accesses they revealed; engines that reshuffle or rebuild at a reopen read
    /// what their public schedule says instead).
    pub reopen_reads_seen: bool,
    /// The reads whose cells the engine promises never to read twice between two writes of
    /// them, across crashes too (a predicate on one store request), if it makes that promise.
    pub fresh_reads: Option<fn(&TraceEvent) -> bool>,
}

/// The engine under test: creates it over fresh stores and opens it again over what they
/// hold. Implementations keep the stores (in memory) and the trusted state between calls.
/// (Its futures need not be `Send`: run the suite on the test's own task.)
#[async_trait(?Send)]
pub trait Subject: Send + Sync {
    /// Name for the checks' messages.
    fn name(&self) -> String;
    /// Bytes per block.
    fn block_size(&self) -> usize;
    /// Logical blocks (`0..blocks`).
    fn blocks(&self) -> u64;
    /// What it can do.
    fn capabilities(&self) -> Capabilities;
    /// A fresh engine over fresh, empty stores (forgetting any earlier one), each store
    /// wrapped by `wrap`.
    async fn create(&self, wrap: Wrap) -> Arc<dyn SharedEngine>;
    /// The engine opened again over the stores as they are now and the trusted state (after a
    /// clean stop, or a crash: then it replays what was committed). An error if the store
    /// fails during the recovery.
    async fn reopen(&self, wrap: Wrap) -> Result<Arc<dyn SharedEngine>, ProxyError>;
    /// Opens the engine under a fresh key, with the current one as the key being retired (a
    /// key rotation under way); from then on [`Subject::reopen`] uses the new key alone.
    async fn rotate(&self, wrap: Wrap) -> Result<Arc<dyn SharedEngine>, ProxyError>;
    /// Rebuilds the stopped engine into fresh stores (`blindfold recover` from a clean stop's
    /// state) or, with `grow_to`, into stores for that many blocks (`blindfold grow`); from then
    /// on [`Subject::reopen`] opens the new stores. Only with [`Capabilities::rebuild`].
    async fn rebuild(&self, _wrap: Wrap, _grow_to: Option<u64>) -> Result<Rebuilt, ProxyError> {
        Err(ProxyError::Config(format!("{} cannot be rebuilt", self.name())))
    }
}

fn fail(check: &str, subject: &dyn Subject, msg: impl std::fmt::Display) -> ! {
    panic!("engine conformance check {check:?} failed on {}: {msg}", subject.name())
}

/// Block contents that name their write: `tag` and its complement, then zeros.
pub fn data(block_size: usize, tag: u64) -> Vec<u8> {
    let mut d = vec![0u8; block_size];
    d[..8].copy_from_slice(&tag.to_le_bytes());
    d[8..16].copy_from_slice(&(!tag).to_le_bytes());
    d
}

/// The tag of block contents made by [`data`] (for messages).
fn tag(d: &[u8]) -> Option<u64> {
    d.get(..8).map(|h| u64::from_le_bytes(h.try_into().expect("8 bytes")))
}

fn ids(blocks: &[u64]) -> Vec<BlockId> {
    blocks.iter().map(|&b| BlockId(b)).collect()
}

/// A stop without a clean shutdown, as `kill -9` at this instant would: every store handle
/// of the engine dies (its background work can reach nothing any more), then it is dropped.
struct Lifelines(Mutex<Vec<Arc<DyingStore>>>);

impl Lifelines {
    fn new() -> Arc<Self> {
        Arc::new(Self(Mutex::new(Vec::new())))
    }

    /// `inner`, wrapped so that its stores die after `cell_writes` more cell writes (or when
    /// [`Lifelines::kill`] is called).
    fn wrap(self: &Arc<Self>, inner: Wrap, cell_writes: i64) -> Wrap {
        let me = Arc::clone(self);
        Arc::new(move |s| {
            let dying = Arc::new(DyingStore::new(inner(s), cell_writes));
            me.0.lock().push(Arc::clone(&dying));
            dying as Arc<dyn Store>
        })
    }

    fn dead(&self) -> bool {
        self.0.lock().iter().any(|d| d.is_dead())
    }

    async fn kill(&self, engine: Arc<dyn SharedEngine>) {
        for d in self.0.lock().drain(..) {
            d.kill();
        }
        drop(engine);
        // Background work of the dropped engine meets the dead store and stops.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Records what reaches the stores, per store (request order within each).
#[derive(Default)]
struct Recorders(Mutex<Vec<Arc<Recorder>>>);

type Recorder = RecordingStore<Arc<dyn Store>>;

impl Recorders {
    fn wrap(self: &Arc<Self>, inner: Wrap) -> Wrap {
        let me = Arc::clone(self);
        Arc::new(move |s| {
            let rec = Arc::new(RecordingStore::new(inner(s)));
            me.0.lock().push(Arc::clone(&rec));
            rec as Arc<dyn Store>
        })
    }

    /// Cells of every store recorded, counted as [`placed`] counts them.
    fn placed_cells(&self, view: Option<PhysicalView>) -> u64 {
        let all: HashSet<(usize, u64)> = self
            .0
            .lock()
            .iter()
            .enumerate()
            .flat_map(|(i, r)| (0..r.geometry().cell_count()).map(move |c| (i, c)))
            .map(|(i, c)| (i, placed(view, CellId(c))))
            .collect();
        all.len() as u64
    }

    /// Cells of the largest store recorded.
    fn cells(&self) -> u64 {
        self.0.lock().iter().map(|r| r.geometry().cell_count()).max().unwrap_or(0)
    }

    /// Every store's events since the last call, store after store.
    fn take(&self) -> Vec<TraceEvent> {
        self.0.lock().iter().flat_map(|r| r.take_trace()).collect()
    }
}

async fn verify_clean(check: &str, subject: &dyn Subject, engine: &dyn SharedEngine) {
    let report = engine
        .verify(&mut |_, _| {})
        .await
        .unwrap_or_else(|e| fail(check, subject, format!("verify returned an error: {e}")));
    if !report.failures.is_empty() {
        fail(check, subject, format!("verify found damaged cells: {:?}", report.failures));
    }
}

async fn read_all(
    check: &str,
    subject: &dyn Subject,
    engine: &dyn SharedEngine,
    model: &HashMap<u64, Vec<u8>>,
    when: &str,
) {
    let bs = subject.block_size();
    let all: Vec<u64> = (0..subject.blocks()).collect();
    for chunk in all.chunks(16) {
        let got = engine
            .read_many(&ids(chunk))
            .await
            .unwrap_or_else(|e| fail(check, subject, format!("{when}: read failed: {e}")));
        for (b, d) in chunk.iter().zip(got) {
            let want = model.get(b).cloned().unwrap_or_else(|| vec![0; bs]);
            if d != want {
                fail(
                    check,
                    subject,
                    format!("{when}: block {b} holds {:?}, not {:?}", tag(&d), tag(&want)),
                );
            }
        }
    }
}

/// Concurrent clients (each its own blocks, all reading one block nobody writes) against a
/// `HashMap` model over a store that reorders replies; then a clean stop, a reopen, a full
/// read-back and `verify`.
pub async fn model(subject: &dyn Subject) {
    const CHECK: &str = "model";
    const CLIENTS: u64 = 4;
    let bs = subject.block_size();
    let blocks = subject.blocks();
    let jitter: Wrap =
        Arc::new(|s| Arc::new(JitterStore::new(s, Duration::from_micros(200), 7)) as _);
    let engine = subject.create(jitter).await;
    let shared = blocks - 1;
    engine
        .write_many(vec![(BlockId(shared), data(bs, 4242))])
        .await
        .unwrap_or_else(|e| fail(CHECK, subject, format!("write failed: {e}")));
    let client = |c: u64| {
        let engine = Arc::clone(&engine);
        async move {
            let mut rng = ChaCha8Rng::seed_from_u64(c);
            let mine: Vec<u64> = (0..shared).filter(|b| b % CLIENTS == c).collect();
            let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
            for step in 0..60u64 {
                // Hot blocks as often as the rest, so a block is read right after its write.
                let mut pick: Vec<u64> = (0..rng.gen_range(1..4))
                    .map(|_| {
                        mine[rng.gen_range(
                            0..mine.len().min(if step % 2 == 0 { 4 } else { usize::MAX }),
                        )]
                    })
                    .collect();
                pick.sort_unstable();
                pick.dedup();
                if rng.gen_bool(0.5) {
                    let writes: Vec<(BlockId, Vec<u8>)> = pick
                        .iter()
                        .map(|&b| (BlockId(b), data(bs, (c << 40) | (step << 20) | b)))
                        .collect();
                    for (b, d) in &writes {
                        model.insert(b.0, d.clone());
                    }
                    engine.write_many(writes).await.unwrap_or_else(|e| {
                        fail(CHECK, subject, format!("client {c}: write failed: {e}"))
                    });
                } else {
                    pick.push(shared);
                    let got = engine.read_many(&ids(&pick)).await.unwrap_or_else(|e| {
                        fail(CHECK, subject, format!("client {c}: read failed: {e}"))
                    });
                    for (b, d) in pick.iter().zip(got) {
                        let want = if *b == shared {
                            data(bs, 4242)
                        } else {
                            model.get(b).cloned().unwrap_or_else(|| vec![0; bs])
                        };
                        if d != want {
                            fail(
                                CHECK,
                                subject,
                                format!(
                                    "client {c} step {step}: block {b} reads {:?}, the model \
                                     holds {:?}",
                                    tag(&d),
                                    tag(&want)
                                ),
                            );
                        }
                    }
                }
                if step % 15 == 14 {
                    engine.commit().await.unwrap_or_else(|e| {
                        fail(CHECK, subject, format!("client {c}: commit failed: {e}"))
                    });
                }
            }
            model
        }
    };
    let models = futures::future::join_all((0..CLIENTS).map(client)).await;
    let mut all: HashMap<u64, Vec<u8>> = models.into_iter().flatten().collect();
    all.insert(shared, data(bs, 4242));
    read_all(CHECK, subject, &*engine, &all, "after the clients").await;
    engine
        .shutdown()
        .await
        .unwrap_or_else(|e| fail(CHECK, subject, format!("shutdown failed: {e}")));
    drop(engine);
    let engine = subject
        .reopen(plain())
        .await
        .unwrap_or_else(|e| fail(CHECK, subject, format!("reopening failed: {e}")));
    read_all(CHECK, subject, &*engine, &all, "after a clean stop and a reopen").await;
    verify_clean(CHECK, subject, &*engine).await;
    engine.shutdown().await.unwrap_or_else(|e| fail(CHECK, subject, format!("shutdown: {e}")));
}

/// Cell writes per store of one trial's workload in [`crash`] without a crash (measured).
async fn cycle_cell_writes(subject: &dyn Subject, ops: u64) -> u64 {
    let counted = Arc::new(Recorders::default());
    let engine = subject.create(counted.wrap(plain())).await;
    let mut ledger = CrashLedger::new(subject.block_size());
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    crash_workload(subject, &*engine, &mut ledger, &mut rng, 0, ops).await;
    engine.shutdown().await.expect("a clean stop");
    let stores = counted.0.lock().len().max(1) as u64;
    let writes: u64 = counted
        .take()
        .iter()
        .filter(|e| e.op == TraceOp::Write)
        .map(|e| e.cells.len() as u64)
        .sum();
    writes / stores
}

/// Trials of [`crash`].
const CRASH_TRIALS: u64 = 16;
/// Writes of one trial of [`crash`].
const CRASH_OPS: u64 = 120;

/// One trial's writes and commits; returns whether the store died.
async fn crash_workload(
    subject: &dyn Subject,
    engine: &dyn SharedEngine,
    ledger: &mut CrashLedger,
    rng: &mut ChaCha8Rng,
    trial: u64,
    ops: u64,
) -> bool {
    let bs = subject.block_size();
    let died = ledger
        .write_and_commit(
            ops,
            subject.blocks(),
            rng,
            |i| data(bs, (trial << 32) | (i + 1)),
            |b, d| async move { engine.write_many(vec![(BlockId(b), d)]).await.is_ok() },
            || async { engine.commit().await.is_ok() },
        )
        .await;
    if !died && engine.shutdown().await.is_ok() {
        ledger.committed();
        false
    } else {
        ledger.crashed();
        true
    }
}

/// Checks `trace` against the subject's promise that some reads never read a cell twice
/// between writes of it.
fn check_fresh_reads(
    check: &str,
    subject: &dyn Subject,
    trace: &[TraceEvent],
    read: &mut HashSet<u64>,
) {
    let Some(fresh) = subject.capabilities().fresh_reads else { return };
    for e in trace {
        if e.op == TraceOp::Write {
            for c in &e.cells {
                read.remove(&c.0);
            }
        } else if fresh(e) {
            for c in &e.cells {
                if !read.insert(c.0) {
                    fail(check, subject, format!("cell {} read twice between writes", c.0));
                }
            }
        }
    }
}

/// The store dies after `k` cell writes, for `k` spread over a whole cycle of writes, commits
/// and a clean stop (and the recovery of the next trial); each trial reopens over what
/// survived. No acknowledged write is lost, nothing never written appears, and at the end
/// every cell authenticates. Trials are seeded, so a failure repeats.
pub async fn crash(subject: &dyn Subject) {
    crash_with(subject, CRASH_TRIALS, CRASH_OPS).await;
}

/// [`crash`] with `trials` trials of `ops` writes each (fewer for a slow subject).
pub async fn crash_with(subject: &dyn Subject, trials: u64, ops: u64) {
    const CHECK: &str = "crash";
    if !subject.capabilities().crash {
        return;
    }
    let cycle = cycle_cell_writes(subject, ops).await.max(trials);
    let recorders = Arc::new(Recorders::default());
    let engine = subject.create(recorders.wrap(plain())).await;
    engine.shutdown().await.unwrap_or_else(|e| fail(CHECK, subject, format!("shutdown: {e}")));
    drop(engine);
    let mut ledger = CrashLedger::new(subject.block_size());
    let mut rng = ChaCha8Rng::seed_from_u64(0xc4a5);
    let mut read_cells = HashSet::new();
    let mut crashes = 0;
    check_fresh_reads(CHECK, subject, &recorders.take(), &mut read_cells);
    for trial in 0..trials {
        // Spread over one cycle (plus a little, to die in the next trial's recovery too).
        let k = (trial * cycle * 11 / 10 / trials) as i64;
        let lives = Lifelines::new();
        let opened = subject.reopen(lives.wrap(recorders.wrap(plain()), k)).await;
        let engine = match opened {
            Ok(e) => e,
            Err(e) if lives.dead() => {
                let _ = e;
                crashes += 1;
                check_fresh_reads(CHECK, subject, &recorders.take(), &mut read_cells);
                continue;
            }
            Err(e) => fail(CHECK, subject, format!("trial {trial}: recovery failed: {e}")),
        };
        let when = format!(
            "(engine conformance check \"crash\" on {}) after crash {crashes}, trial {trial}, \
             k = {k}",
            subject.name()
        );
        for chunk in ledger.blocks().chunks(16) {
            let Ok(got) = engine.read_many(&ids(chunk)).await else { break };
            for (&b, d) in chunk.iter().zip(got) {
                ledger.recovered(b, d, &when);
            }
        }
        let died = crash_workload(subject, &*engine, &mut ledger, &mut rng, trial + 1, ops).await;
        crashes += u32::from(died);
        lives.kill(engine).await;
        check_fresh_reads(CHECK, subject, &recorders.take(), &mut read_cells);
    }
    if crashes < trials as u32 / 2 {
        fail(CHECK, subject, format!("the store died in only {crashes} of {trials} trials"));
    }
    let engine = subject
        .reopen(recorders.wrap(plain()))
        .await
        .unwrap_or_else(|e| fail(CHECK, subject, format!("the last reopen failed: {e}")));
    let when = format!("(engine conformance check \"crash\" on {}) at the end", subject.name());
    for chunk in ledger.blocks().chunks(16) {
        let got = engine
            .read_many(&ids(chunk))
            .await
            .unwrap_or_else(|e| fail(CHECK, subject, format!("read at the end: {e}")));
        for (&b, d) in chunk.iter().zip(got) {
            ledger.check(b, &d, &when);
        }
    }
    check_fresh_reads(CHECK, subject, &recorders.take(), &mut read_cells);
    verify_clean(CHECK, subject, &*engine).await;
}

/// A cell as an observer places it: with two copies of a tree, the copy does not matter.
fn placed(view: Option<PhysicalView>, c: CellId) -> u64 {
    match view {
        Some(PhysicalView::Tree { copy_cells, .. } | PhysicalView::Groups { copy_cells, .. })
            if copy_cells > 0 =>
        {
            c.0 % copy_cells
        }
        _ => c.0,
    }
}

fn cells_read(trace: &[TraceEvent], view: Option<PhysicalView>) -> HashSet<u64> {
    trace
        .iter()
        .filter(|e| e.op != TraceOp::Write && e.op != TraceOp::Flush)
        .flat_map(|e| e.cells.iter().map(|&c| placed(view, c)))
        .collect()
}

/// Obliviousness across crashes: each trial accesses a block (a read or a write), then either
/// crashes (no commit; the engine is gone) and reopens, or goes on; then accesses the same block
/// again (a client retrying). The cells the two accesses read must overlap no more after a
/// crash than without one (a re-fetched path overlaps wholly), and the reopen itself reads only
/// cells the store saw read before.
pub async fn fresh_after_crash(subject: &dyn Subject) {
    const CHECK: &str = "fresh after crash";
    const TRIALS: u64 = 48;
    if !subject.capabilities().crash {
        return;
    }
    let view = subject.capabilities().view;
    let bs = subject.block_size();
    let blocks = subject.blocks();
    let recorders = Arc::new(Recorders::default());
    let mut lives = Lifelines::new();
    let mut engine = subject.create(lives.wrap(recorders.wrap(plain()), i64::MAX)).await;
    let all: Vec<u64> = (0..blocks).collect();
    for chunk in all.chunks(16) {
        let w = chunk.iter().map(|&b| (BlockId(b), data(bs, b))).collect();
        engine.write_many(w).await.unwrap_or_else(|e| fail(CHECK, subject, e));
    }
    engine.commit().await.unwrap_or_else(|e| fail(CHECK, subject, e));
    let mut rng = ChaCha8Rng::seed_from_u64(0xf4e5);
    let mut seen: HashSet<u64> = cells_read(&recorders.take(), view);
    let (mut crashed, mut calm, mut sizes) = (Vec::new(), Vec::new(), Vec::new());
    let mut model: HashMap<u64, Vec<u8>> = all.iter().map(|&b| (b, data(bs, b))).collect();
    for trial in 0..TRIALS {
        let x = rng.gen_range(0..blocks);
        let write = (trial / 2) % 2 == 1;
        let value = data(bs, (trial + 1) << 32 | x);
        let access = |engine: Arc<dyn SharedEngine>, value: Vec<u8>| async move {
            if write {
                engine.write_many(vec![(BlockId(x), value)]).await.map(|_| ())
            } else {
                engine.read_many(&[BlockId(x)]).await.map(|_| ())
            }
        };
        access(Arc::clone(&engine), value.clone())
            .await
            .unwrap_or_else(|e| fail(CHECK, subject, format!("trial {trial}: {e}")));
        let first = cells_read(&recorders.take(), view);
        seen.extend(first.iter().copied());
        let crash = trial % 2 == 0;
        if crash {
            lives.kill(engine).await;
            lives = Lifelines::new();
            engine = subject
                .reopen(lives.wrap(recorders.wrap(plain()), i64::MAX))
                .await
                .unwrap_or_else(|e| fail(CHECK, subject, format!("trial {trial}: reopen: {e}")));
            let during = cells_read(&recorders.take(), view);
            // Either only what the store saw read, or everything (a rebuild, which shows
            // nothing of the workload).
            let everything = recorders.placed_cells(view);
            if let Some(c) = during.difference(&seen).next() {
                if subject.capabilities().reopen_reads_seen && (during.len() as u64) < everything {
                    fail(
                        CHECK,
                        subject,
                        format!(
                            "trial {trial}: the reopen read cell {c}, which no access had read \
                             (and {} of the {everything} cells, not all)",
                            during.len()
                        ),
                    );
                }
            }
            seen.extend(during);
        }
        access(Arc::clone(&engine), value.clone())
            .await
            .unwrap_or_else(|e| fail(CHECK, subject, format!("trial {trial}: {e}")));
        if write {
            model.insert(x, value);
        }
        let second = cells_read(&recorders.take(), view);
        seen.extend(second.iter().copied());
        sizes.push(first.len().max(second.len()));
        let overlap = first.intersection(&second).count();
        if crash { &mut crashed } else { &mut calm }.push(overlap as f64);
        engine.commit().await.unwrap_or_else(|e| fail(CHECK, subject, e));
        seen.extend(cells_read(&recorders.take(), view));
    }
    read_all(CHECK, subject, &*engine, &model, "at the end").await;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (c, n) = (mean(&crashed), mean(&calm));
    let size = sizes.iter().sum::<usize>() as f64 / sizes.len() as f64;
    // Several standard errors of the difference of two means of small counts; a re-fetch
    // overlaps by the whole access every time.
    if c > n + 1.0 + 0.1 * size || c > 0.75 * size.max(1.0) {
        fail(
            CHECK,
            subject,
            format!(
                "the retried access overlaps the crashed one in {c:.2} cells on average, two \
                 accesses without a crash in {n:.2} (an access reads {size:.1})"
            ),
        );
    }
    engine.shutdown().await.unwrap_or_else(|e| fail(CHECK, subject, e));
}

/// What a [`TamperStore`] does to what it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tamper {
    /// Returns what is stored.
    Honest,
    /// Flips the last byte of every cell (or range) returned.
    Flip,
    /// Returns, for cell `c`, what cell `c ^ 1` holds: every cell swapped with its neighbour.
    Swap,
    /// Returns every cell as it was when rolled back ([`TamperStore::set`]), whatever was
    /// written since.
    Rollback,
}

/// A store that lies about what it holds, once told to: flips bytes, swaps cells, or rolls
/// back to an earlier copy of every cell. Writes reach the store below.
#[derive(Debug)]
pub struct TamperStore {
    inner: Arc<dyn Store>,
    mode: Mutex<Tamper>,
    old: Mutex<Vec<Vec<u8>>>,
}

impl TamperStore {
    /// `inner`, honest until told otherwise.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self { inner, mode: Mutex::new(Tamper::Honest), old: Mutex::new(Vec::new()) }
    }

    /// Keeps a copy of every cell as it is now, for a later [`Tamper::Rollback`].
    pub async fn snapshot(&self) -> blindfold_store::Result<()> {
        let all: Vec<CellId> = (0..self.inner.geometry().cell_count()).map(CellId).collect();
        let mut cells = Vec::new();
        for chunk in all.chunks(256) {
            cells.extend(self.inner.read(chunk).await?);
        }
        *self.old.lock() = cells;
        Ok(())
    }

    /// From now on, lies as `mode` says.
    pub fn set(&self, mode: Tamper) {
        *self.mode.lock() = mode;
    }

    fn partner(&self, c: CellId) -> CellId {
        let p = c.0 ^ 1;
        CellId(if p < self.inner.geometry().cell_count() { p } else { c.0 })
    }
}

#[async_trait]
impl Store for TamperStore {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, cells: &[CellId]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        let mode = *self.mode.lock();
        match mode {
            Tamper::Honest => self.inner.read(cells).await,
            Tamper::Flip => {
                let mut out = self.inner.read(cells).await?;
                for c in &mut out {
                    if let Some(b) = c.last_mut() {
                        *b ^= 1;
                    }
                }
                Ok(out)
            }
            Tamper::Swap => {
                let swapped: Vec<CellId> = cells.iter().map(|&c| self.partner(c)).collect();
                self.inner.read(&swapped).await
            }
            Tamper::Rollback => {
                let now = self.inner.read(cells).await?;
                let old = self.old.lock();
                Ok(cells
                    .iter()
                    .zip(now)
                    .map(|(c, n)| old.get(c.0 as usize).cloned().unwrap_or(n))
                    .collect())
            }
        }
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        let cells: Vec<CellId> = ranges.iter().map(|r| r.cell).collect();
        let whole = self.read(&cells).await?;
        Ok(ranges
            .iter()
            .zip(whole)
            .map(|(r, c)| c[r.offset as usize..(r.offset + r.len) as usize].to_vec())
            .collect())
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> blindfold_store::Result<()> {
        self.inner.write(cells).await
    }

    async fn flush(&self) -> blindfold_store::Result<()> {
        self.inner.flush().await
    }

    fn writes_may_be_retried(&self) -> bool {
        self.inner.writes_may_be_retried()
    }
}

/// An engine over tamperable stores with every block written several times and committed;
/// its model and the stores.
async fn written(
    subject: &dyn Subject,
) -> (Arc<dyn SharedEngine>, HashMap<u64, Vec<u8>>, Arc<Mutex<Vec<Arc<TamperStore>>>>) {
    let bs = subject.block_size();
    let stores: Arc<Mutex<Vec<Arc<TamperStore>>>> = Arc::default();
    let keep = Arc::clone(&stores);
    let wrap: Wrap = Arc::new(move |s| {
        let t = Arc::new(TamperStore::new(s));
        keep.lock().push(Arc::clone(&t));
        t as Arc<dyn Store>
    });
    let engine = subject.create(wrap).await;
    let mut model = HashMap::new();
    let all: Vec<u64> = (0..subject.blocks()).collect();
    for round in 0..3u64 {
        for chunk in all.chunks(16) {
            let w: Vec<(BlockId, Vec<u8>)> =
                chunk.iter().map(|&b| (BlockId(b), data(bs, round << 32 | b))).collect();
            model.extend(w.iter().map(|(b, d)| (b.0, d.clone())));
            engine.write_many(w).await.expect("writes before tampering");
        }
        engine.commit().await.expect("a commit before tampering");
    }
    (engine, model, stores)
}

/// Reads every block one by one: each read is the model's data or an error, the first error
/// an integrity error; returns how many blocks read as errors.
async fn reads_never_wrong(
    check: &str,
    subject: &dyn Subject,
    engine: &dyn SharedEngine,
    model: &HashMap<u64, Vec<u8>>,
) -> u64 {
    let mut errors = 0;
    for b in 0..subject.blocks() {
        match engine.read_many(&[BlockId(b)]).await {
            Ok(got) => {
                if got[0] != model[&b] {
                    fail(
                        check,
                        subject,
                        format!(
                            "block {b} read as {:?} (the engine wrote {:?}): wrong data instead \
                             of an integrity error",
                            tag(&got[0]),
                            tag(&model[&b])
                        ),
                    );
                }
            }
            Err(e) => {
                // (An engine whose background work met the damage first has stopped.)
                if errors == 0 && !e.is_integrity() && !matches!(e, ProxyError::Poisoned) {
                    fail(check, subject, format!("block {b}: {e} is not an integrity error"));
                }
                errors += 1;
            }
        }
    }
    errors
}

async fn tampered(check: &str, subject: &dyn Subject, mode: Tamper) {
    let (engine, mut model, stores) = written(subject).await;
    if mode == Tamper::Rollback {
        let all = stores.lock().clone();
        for s in all {
            s.snapshot().await.expect("a snapshot");
        }
        // Newer versions of every block, moved around by many accesses.
        let bs = subject.block_size();
        let all: Vec<u64> = (0..subject.blocks()).collect();
        for round in 10..13u64 {
            for chunk in all.chunks(16) {
                let w: Vec<(BlockId, Vec<u8>)> =
                    chunk.iter().map(|&b| (BlockId(b), data(bs, round << 32 | b))).collect();
                model.extend(w.iter().map(|(b, d)| (b.0, d.clone())));
                engine.write_many(w).await.expect("writes before the rollback");
            }
            engine.commit().await.expect("a commit before the rollback");
        }
    }
    for s in stores.lock().iter() {
        s.set(mode);
    }
    let errors = reads_never_wrong(check, subject, &*engine, &model).await;
    if errors == 0 {
        fail(check, subject, format!("every block read back under {mode:?}: nothing detected"));
    }
}

/// The store flips a byte of every cell it returns: integrity errors, never wrong data.
pub async fn tamper(subject: &dyn Subject) {
    tampered("tamper", subject, Tamper::Flip).await;
}

/// The store answers each cell with its neighbour's contents: integrity errors, never
/// wrong data.
pub async fn swap(subject: &dyn Subject) {
    tampered("swap", subject, Tamper::Swap).await;
}

/// The store answers with the cells as they were several rounds of writes ago: integrity
/// errors, never old data.
pub async fn rollback(subject: &dyn Subject) {
    tampered("rollback", subject, Tamper::Rollback).await;
}

/// Per block, every value it was given (zeros first), the first it may hold now (its last
/// completed write) and the first it may hold after a crash (its last write completed before
/// a commit).
#[derive(Default)]
struct Possible(HashMap<u64, (Vec<Vec<u8>>, usize, usize)>);

impl Possible {
    fn entry(&mut self, b: u64, bs: usize) -> &mut (Vec<Vec<u8>>, usize, usize) {
        self.0.entry(b).or_insert_with(|| (vec![vec![0; bs]], 0, 0))
    }

    fn completed(&mut self, b: u64, d: &[u8], bs: usize) {
        let e = self.entry(b, bs);
        let at = e.0.iter().rposition(|o| o == d).expect("noted before it was sent");
        e.1 = e.1.max(at);
    }

    fn committed(&mut self) {
        for e in self.0.values_mut() {
            e.2 = e.1;
        }
    }

    /// The first value `b` may hold now (see [`Possible::may_hold_since`]).
    fn live(&self, b: u64) -> usize {
        self.0.get(&b).map_or(0, |e| e.1)
    }

    fn may_hold(&self, b: u64, d: &[u8], crashed: bool) -> bool {
        let from = self.0.get(&b).map_or(0, |e| if crashed { e.2 } else { e.1 });
        self.may_hold_since(b, d, from)
    }

    /// Whether `d` is the value numbered `from` of `b` or a later one (a read that started
    /// when `from` was live).
    fn may_hold_since(&self, b: u64, d: &[u8], from: usize) -> bool {
        match self.0.get(&b) {
            Some((values, _, _)) => values[from..].iter().any(|v| v == d),
            None => d.iter().all(|&x| x == 0),
        }
    }
}

/// Reads and writes dropped part-way (a timeout of 0 to 3 ms around each engine call, from
/// several clients at once), as a caller that gives up on a request does: the engine never
/// answers wrong data after that. It either goes on serving — every block holds its last
/// completed write or one of the dropped writes after it, and new writes and a commit read
/// back — or refuses with errors until it is restarted; then (engines that survive a crash)
/// the restart recovers every write committed before.
///
/// (Engines need not finish an access whose future was dropped: the gateway runs every engine
/// call in a task of its own so that an abandoned S3 request never stops one mid-access.
/// What this check holds them to is failing safe when a caller does not.)
pub async fn abandoned(subject: &dyn Subject) {
    const CHECK: &str = "abandoned";
    let bs = subject.block_size();
    let blocks = subject.blocks();
    let lives = Lifelines::new();
    let jitter: Wrap =
        Arc::new(|s| Arc::new(JitterStore::new(s, Duration::from_micros(300), 11)) as _);
    let engine = subject.create(lives.wrap(jitter, i64::MAX)).await;
    let possible = Mutex::new(Possible::default());
    let (mut done, mut dropped, mut refused) = (0u32, 0u32, 0u32);
    let mut rng = ChaCha8Rng::seed_from_u64(0xab);
    for round in 0..16u64 {
        let mut calls = Vec::new();
        for c in 0..4u64 {
            let b: Vec<u64> = {
                let mut v: Vec<u64> =
                    (0..rng.gen_range(1..4)).map(|_| rng.gen_range(0..blocks)).collect();
                v.sort_unstable();
                v.dedup();
                v
            };
            let write = rng.gen_bool(0.5);
            // Half the calls get all the time they need.
            let limit = if rng.gen_bool(0.5) {
                Duration::from_secs(10)
            } else {
                Duration::from_micros(rng.gen_range(0..3000))
            };
            let engine = Arc::clone(&engine);
            let possible = &possible;
            calls.push(async move {
                let w: Vec<(BlockId, Vec<u8>)> = b
                    .iter()
                    .map(|&x| (BlockId(x), data(bs, (round << 40) | (c << 32) | (x + 1))))
                    .collect();
                let starts: Vec<usize> = {
                    let mut p = possible.lock();
                    if write {
                        for (x, d) in &w {
                            p.entry(x.0, bs).0.push(d.clone());
                        }
                    }
                    b.iter().map(|&x| p.live(x)).collect()
                };
                let r = tokio::time::timeout(limit, async {
                    if write {
                        engine.write_many(w.clone()).await.map(|_| None)
                    } else {
                        engine.read_many(&ids(&b)).await.map(Some)
                    }
                })
                .await;
                match r {
                    Ok(Ok(got)) => {
                        let mut p = possible.lock();
                        for (x, d) in &w {
                            if write {
                                p.completed(x.0, d, bs);
                            }
                        }
                        for ((x, d), from) in b.iter().zip(got.unwrap_or_default()).zip(starts) {
                            if !p.may_hold_since(*x, &d, from) {
                                fail(
                                    CHECK,
                                    subject,
                                    format!(
                                        "round {round}: block {x} reads {:?}, none of the \
                                         values it may hold",
                                        tag(&d)
                                    ),
                                );
                            }
                        }
                        0
                    }
                    Ok(Err(_)) => 2,
                    Err(_) => 1,
                }
            });
        }
        for outcome in futures::future::join_all(calls).await {
            match outcome {
                0 => done += 1,
                1 => dropped += 1,
                _ => refused += 1,
            }
        }
        if round % 4 == 3 && engine.commit().await.is_ok() {
            possible.lock().committed();
        }
    }
    // The check means something only if calls were dropped, and some were answered after one
    // was (completed, or refused by an engine that fails safe). Under a loaded machine the
    // first call dropped can come before any completes; an engine that then refuses everything
    // has still been checked.
    if dropped == 0 || done + refused == 0 {
        fail(
            CHECK,
            subject,
            format!(
                "{done} calls completed, {refused} were refused and {dropped} were dropped: \
                 adjust the timeouts"
            ),
        );
    }
    let mut possible = possible.into_inner();
    // Still serving: every block holds one of its possible values, new writes read back.
    let all: Vec<u64> = (0..blocks).collect();
    let mut serving = refused == 0;
    if serving {
        for chunk in all.chunks(16) {
            let Ok(got) = engine.read_many(&ids(chunk)).await else {
                serving = false;
                break;
            };
            for (b, d) in chunk.iter().zip(got) {
                if !possible.may_hold(*b, &d, false) {
                    fail(
                        CHECK,
                        subject,
                        format!("block {b} reads {:?}, none of the values it may hold", tag(&d)),
                    );
                }
            }
        }
    }
    let engine = if serving {
        engine
    } else if subject.capabilities().crash {
        // It stopped: a restart recovers what was committed.
        lives.kill(engine).await;
        let engine = subject
            .reopen(plain())
            .await
            .unwrap_or_else(|e| fail(CHECK, subject, format!("restarting: {e}")));
        for chunk in all.chunks(16) {
            let got = engine
                .read_many(&ids(chunk))
                .await
                .unwrap_or_else(|e| fail(CHECK, subject, format!("read after a restart: {e}")));
            for (b, d) in chunk.iter().zip(got) {
                if !possible.may_hold(*b, &d, true) {
                    fail(
                        CHECK,
                        subject,
                        format!(
                            "after a restart block {b} reads {:?}, none of the values it may \
                             hold",
                            tag(&d)
                        ),
                    );
                }
            }
        }
        engine
    } else {
        return;
    };
    let mut model = HashMap::new();
    for chunk in all.chunks(16) {
        let w: Vec<(BlockId, Vec<u8>)> =
            chunk.iter().map(|&b| (BlockId(b), data(bs, (99 << 40) | b))).collect();
        model.extend(w.iter().map(|(b, d)| (b.0, d.clone())));
        engine.write_many(w).await.unwrap_or_else(|e| fail(CHECK, subject, format!("write: {e}")));
    }
    engine.commit().await.unwrap_or_else(|e| fail(CHECK, subject, format!("commit: {e}")));
    possible.committed();
    read_all(CHECK, subject, &*engine, &model, "after the drops and new writes").await;
    engine.shutdown().await.unwrap_or_else(|e| fail(CHECK, subject, format!("shutdown: {e}")));
}

/// Accesses per workload in [`trace`].
const TRACE_ACCESSES: u64 = 300;
/// Bins of the targets' histogram in [`trace`].
const TRACE_BINS: u64 = 8;

/// Which block the `i`-th access of a workload asks for.
#[derive(Clone, Copy, Debug)]
enum Workload {
    Hammer,
    Uniform,
    Scan,
}

/// The store's view of a workload: per kind of request, requests and bytes; and the bin of
/// each read's target.
struct View {
    requests: HashMap<TraceOp, (u64, u64)>,
    bins: Vec<u64>,
}

async fn trace_of(subject: &dyn Subject, w: Workload, accesses: u64) -> View {
    let bs = subject.block_size();
    let blocks = subject.blocks();
    let recorders = Arc::new(Recorders::default());
    let engine = subject.create(recorders.wrap(plain())).await;
    let all: Vec<u64> = (0..blocks).collect();
    for chunk in all.chunks(16) {
        let w = chunk.iter().map(|&b| (BlockId(b), data(bs, b))).collect();
        engine.write_many(w).await.expect("the first writes");
    }
    engine.commit().await.expect("a commit");
    recorders.take();
    let mut rng = ChaCha8Rng::seed_from_u64(0x7ace);
    for i in 0..accesses {
        let b = match w {
            Workload::Hammer => 3 % blocks,
            Workload::Uniform => rng.gen_range(0..blocks),
            Workload::Scan => i % blocks,
        };
        if i % 2 == 0 {
            engine.write_many(vec![(BlockId(b), data(bs, i << 32 | b))]).await.expect("a write");
        } else {
            engine.read_many(&[BlockId(b)]).await.expect("a read");
        }
        if i % 20 == 19 {
            engine.commit().await.expect("a commit");
        }
    }
    engine.shutdown().await.expect("a clean stop");
    let trace = recorders.take();
    let view = subject.capabilities().view;
    let targets = view.map(|v| v.targets()).unwrap_or_else(|| recorders.cells().max(1));
    let mut requests: HashMap<TraceOp, (u64, u64)> = HashMap::new();
    let mut bins = Vec::new();
    for e in &trace {
        let r = requests.entry(e.op).or_default();
        r.0 += 1;
        r.1 += e.bytes;
        if matches!(e.op, TraceOp::Write | TraceOp::Flush | TraceOp::TeeEvict) {
            continue;
        }
        let target = e
            .cells
            .iter()
            .filter_map(|&c| match view {
                Some(v) => v.target_of(c),
                None => Some(c.0),
            })
            .max();
        if let Some(t) = target {
            bins.push(t.min(targets - 1) * TRACE_BINS / targets.max(1));
        }
    }
    View { requests, bins }
}

/// What the store sees of three workloads — one block hammered, uniform random blocks, a
/// sequential scan (alternating writes and reads, a commit every 20) — must not tell them
/// apart: per kind of request the same number of requests and bytes (within 15 %, the
/// engines' own randomness; flushes within 50 %), and the reads' targets distributed alike (a chi-square test of
/// homogeneity over the three, at significance 10⁻⁵).
pub async fn trace(subject: &dyn Subject) {
    trace_with(subject, TRACE_ACCESSES).await;
}

/// [`trace`] with `accesses` accesses per workload (fewer for a slow subject; the reads must
/// still fill every bin of the test's table with five or more).
pub async fn trace_with(subject: &dyn Subject, accesses: u64) {
    const CHECK: &str = "trace";
    let mut views = Vec::new();
    for w in [Workload::Hammer, Workload::Uniform, Workload::Scan] {
        views.push((w, trace_of(subject, w, accesses).await));
    }
    let (_, base) = &views[1];
    for (w, v) in &views {
        let ops: HashSet<TraceOp> =
            v.requests.keys().chain(base.requests.keys()).copied().collect();
        for op in ops {
            let (n, bytes) = v.requests.get(&op).copied().unwrap_or_default();
            let (bn, bbytes) = base.requests.get(&op).copied().unwrap_or_default();
            // Flushes carry no address: how many there are follows how the engine groups its
            // log syncs, which follows timing (seen: 175 to 256 per 300 accesses in one engine
            // and workload). They are held to a looser bound.
            let slack = if op == TraceOp::Flush { 0.5 } else { 0.15 };
            let close = |a: u64, b: u64| a.abs_diff(b) as f64 <= slack * a.max(b) as f64 + 2.0;
            if !close(n, bn) || !close(bytes, bbytes) {
                fail(
                    CHECK,
                    subject,
                    format!(
                        "{op:?} requests: {n} moving {bytes} bytes under {w:?}, {bn} moving \
                         {bbytes} under Uniform (all: {:?} and {:?})",
                        v.requests, base.requests
                    ),
                );
            }
        }
    }
    let pairs =
        views.iter().enumerate().flat_map(|(i, (_, v))| v.bins.iter().map(move |&b| (i as u64, b)));
    let test = stats::independence(pairs, 3, TRACE_BINS);
    if test.p_value < 1e-5 {
        let hist: Vec<(Workload, Vec<u64>)> = views
            .iter()
            .map(|(w, v)| (*w, stats::histogram(v.bins.iter().copied(), TRACE_BINS)))
            .collect();
        fail(
            CHECK,
            subject,
            format!(
                "the reads' targets depend on the workload (chi² {:.1}, p = {:.2e}): {hist:?}",
                test.statistic, test.p_value
            ),
        );
    }
}

/// A key rotation while clients read and write: the engine is opened under a new key with
/// the old one retired, its sweep runs twice over every path (as the gateway's rotation does,
/// so that both slots of every cell are re-sealed), commits between; then it opens under the
/// new key alone, the data is intact, and every cell authenticates. Then once more with no
/// client traffic, so that only the sweep can have re-sealed the cells: with 80 accesses over a
/// small tree, the clients alone re-seal every path of Path ORAM's 32 in a few runs in a
/// hundred (2 of 100 here), and a sweep that re-seals nothing went unseen in one CI run of 2026-11-30.
pub async fn rotate(subject: &dyn Subject) {
    const CHECK: &str = "rotate";
    if !subject.capabilities().rotate {
        return;
    }
    let bs = subject.block_size();
    let blocks = subject.blocks();
    let engine = subject.create(plain()).await;
    let all: Vec<u64> = (0..blocks).collect();
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    for chunk in all.chunks(16) {
        let w: Vec<(BlockId, Vec<u8>)> = chunk.iter().map(|&b| (BlockId(b), data(bs, b))).collect();
        model.extend(w.iter().map(|(b, d)| (b.0, d.clone())));
        engine.write_many(w).await.unwrap_or_else(|e| fail(CHECK, subject, e));
    }
    let engine = rotated(subject, engine, "the new key").await;
    let paths = engine.sweep_paths().await;
    if paths == 0 {
        fail(CHECK, subject, "the engine says it can rotate but has no sweep");
    }
    let model = Mutex::new(model);
    let sweeper = sweep_twice(subject, &*engine, paths);
    let client = |c: u64| {
        let engine = Arc::clone(&engine);
        let model = &model;
        async move {
            let mut rng = ChaCha8Rng::seed_from_u64(c);
            for step in 0..40u64 {
                let b = rng.gen_range(0..blocks / 2) * 2 + c;
                if rng.gen_bool(0.5) {
                    let d = data(bs, (c << 40) | (step << 20) | b);
                    engine
                        .write_many(vec![(BlockId(b), d.clone())])
                        .await
                        .unwrap_or_else(|e| fail(CHECK, subject, e));
                    model.lock().insert(b, d);
                } else {
                    let got = engine
                        .read_many(&[BlockId(b)])
                        .await
                        .unwrap_or_else(|e| fail(CHECK, subject, e));
                    let want = model.lock()[&b].clone();
                    if got[0] != want {
                        fail(
                            CHECK,
                            subject,
                            format!(
                                "block {b} reads {:?} during the sweep, not {:?}",
                                tag(&got[0]),
                                tag(&want)
                            ),
                        );
                    }
                }
            }
        }
    };
    futures::join!(sweeper, client(0), client(1));
    let model = model.into_inner();
    let engine = reopened_alone(subject, engine, &model, "under the new key alone").await;
    let engine = rotated(subject, engine, "a second new key").await;
    let paths = engine.sweep_paths().await;
    sweep_twice(subject, &*engine, paths).await;
    let what = "under the second new key alone, after a sweep with no traffic";
    reopened_alone(subject, engine, &model, what).await;
}

/// The start of a rotation: `engine` stopped cleanly and opened again with a new key (`which`
/// names it), the old one retiring.
async fn rotated(
    subject: &dyn Subject,
    engine: Arc<dyn SharedEngine>,
    which: &str,
) -> Arc<dyn SharedEngine> {
    const CHECK: &str = "rotate";
    engine.shutdown().await.unwrap_or_else(|e| fail(CHECK, subject, e));
    drop(engine);
    subject
        .rotate(plain())
        .await
        .unwrap_or_else(|e| fail(CHECK, subject, format!("opening with {which}: {e}")))
}

/// The end of a rotation: `engine` stopped cleanly and opened again under the newest key
/// alone (`what` says which), every block reading as `model` says and every cell
/// authenticating. Returns the reopened engine.
async fn reopened_alone(
    subject: &dyn Subject,
    engine: Arc<dyn SharedEngine>,
    model: &HashMap<u64, Vec<u8>>,
    what: &str,
) -> Arc<dyn SharedEngine> {
    const CHECK: &str = "rotate";
    engine.shutdown().await.unwrap_or_else(|e| fail(CHECK, subject, e));
    drop(engine);
    let engine = subject
        .reopen(plain())
        .await
        .unwrap_or_else(|e| fail(CHECK, subject, format!("opening {what}: {e}")));
    read_all(CHECK, subject, &*engine, model, what).await;
    verify_clean(CHECK, subject, &*engine).await;
    engine
}

/// The rotation's sweep as the gateway runs it: every path twice, in eight steps a pass, a
/// commit after each.
async fn sweep_twice(subject: &dyn Subject, engine: &dyn SharedEngine, paths: u64) {
    const CHECK: &str = "rotate";
    let step = (paths / 8).max(1);
    for _pass in 0..2 {
        let mut at = 0;
        while at < paths {
            let end = (at + step).min(paths);
            engine
                .sweep(at..end)
                .await
                .unwrap_or_else(|e| fail(CHECK, subject, format!("sweep {at}..{end}: {e}")));
            engine.commit().await.unwrap_or_else(|e| fail(CHECK, subject, e));
            at = end;
            tokio::task::yield_now().await;
        }
    }
}

/// `blindfold recover` from a clean stop: every block written, stopped cleanly, rebuilt into a
/// fresh store array with fresh placement and a fresh key epoch. Nothing may be lost, every
/// block written must be found, and the rebuilt engine serves the same data and authenticates
/// every cell.
pub async fn rebuild(subject: &dyn Subject) {
    rebuilt(subject, "rebuild", None).await;
}

/// `blindfold grow`: every block written, stopped cleanly, grown into a store of twice the
/// blocks. Every block keeps its contents, the new blocks read as zeros and can be written, and
/// every cell authenticates.
pub async fn grow(subject: &dyn Subject) {
    rebuilt(subject, "grow", Some(subject.blocks() * 2)).await;
}

async fn rebuilt(subject: &dyn Subject, check: &str, grow_to: Option<u64>) {
    if !subject.capabilities().rebuild {
        refused(subject, check, grow_to).await;
        return;
    }
    let bs = subject.block_size();
    let blocks = subject.blocks();
    let engine = subject.create(plain()).await;
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    // Every other block, so that blocks never written are in the rebuilt tree too.
    let written: Vec<u64> = (0..blocks).step_by(2).collect();
    for chunk in written.chunks(16) {
        let w: Vec<(BlockId, Vec<u8>)> = chunk.iter().map(|&b| (BlockId(b), data(bs, b))).collect();
        model.extend(w.iter().map(|(b, d)| (b.0, d.clone())));
        engine.write_many(w).await.unwrap_or_else(|e| fail(check, subject, e));
    }
    engine.shutdown().await.unwrap_or_else(|e| fail(check, subject, e));
    drop(engine);
    let report = subject
        .rebuild(plain(), grow_to)
        .await
        .unwrap_or_else(|e| fail(check, subject, format!("rebuilding: {e}")));
    if !report.lost.is_empty() || !report.unreadable_cells.is_empty() {
        fail(
            check,
            subject,
            format!(
                "a clean stop's store lost blocks {:?} ({} unreadable cells)",
                report.lost,
                report.unreadable_cells.len()
            ),
        );
    }
    if report.blocks_found != written.len() as u64 {
        fail(
            check,
            subject,
            format!("found {} of the {} blocks written", report.blocks_found, written.len()),
        );
    }
    let engine = subject
        .reopen(plain())
        .await
        .unwrap_or_else(|e| fail(check, subject, format!("opening the rebuilt engine: {e}")));
    for b in 0..blocks {
        model.entry(b).or_insert_with(|| vec![0; bs]);
    }
    if let Some(to) = grow_to {
        let beyond: Vec<BlockId> = (blocks..to).map(BlockId).collect();
        for chunk in beyond.chunks(16) {
            let got = engine.read_many(chunk).await.unwrap_or_else(|e| fail(check, subject, e));
            if let Some((b, _)) = chunk.iter().zip(&got).find(|(_, d)| d.iter().any(|&x| x != 0)) {
                fail(check, subject, format!("block {} beyond the old capacity is not zeros", b.0));
            }
        }
        let last = to - 1;
        engine
            .write_many(vec![(BlockId(last), data(bs, last))])
            .await
            .unwrap_or_else(|e| fail(check, subject, format!("writing a new block: {e}")));
        engine.commit().await.unwrap_or_else(|e| fail(check, subject, e));
        model.insert(last, data(bs, last));
    }
    read_all(check, subject, &*engine, &model, "after the rebuild").await;
    verify_clean(check, subject, &*engine).await;
}

/// A subject that cannot be rebuilt or grown must refuse with an error and change nothing:
/// the engine opens again with what it held.
async fn refused(subject: &dyn Subject, check: &str, grow_to: Option<u64>) {
    let bs = subject.block_size();
    let engine = subject.create(plain()).await;
    let model: HashMap<u64, Vec<u8>> =
        (0..subject.blocks().min(16)).map(|b| (b, data(bs, b))).collect();
    let w = model.iter().map(|(&b, d)| (BlockId(b), d.clone())).collect();
    engine.write_many(w).await.unwrap_or_else(|e| fail(check, subject, e));
    engine.shutdown().await.unwrap_or_else(|e| fail(check, subject, e));
    drop(engine);
    if subject.rebuild(plain(), grow_to).await.is_ok() {
        fail(check, subject, "says it cannot be rebuilt, yet a rebuild succeeded");
    }
    let engine = subject
        .reopen(plain())
        .await
        .unwrap_or_else(|e| fail(check, subject, format!("opening after a refused rebuild: {e}")));
    read_all(check, subject, &*engine, &model, "after a refused rebuild").await;
}

/// Every check in turn.
pub async fn run_all(subject: &dyn Subject) {
    model(subject).await;
    crash(subject).await;
    fresh_after_crash(subject).await;
    tamper(subject).await;
    swap(subject).await;
    rollback(subject).await;
    abandoned(subject).await;
    trace(subject).await;
    rotate(subject).await;
    rebuild(subject).await;
    grow(subject).await;
}

/// An engine of the catalogue, created and reopened through [`open_engine`] over memory stores
/// as the gateway opens it (public parameters as `blindfold init` makes them, no tree top in
/// memory), in a temporary state directory.
pub struct CatalogueEngine {
    engine: OramEngine,
    params: EngineParams,
    state: Mutex<Option<CatalogueState>>,
}

impl std::fmt::Debug for CatalogueEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogueEngine").field("params", &self.params).finish_non_exhaustive()
    }
}

struct CatalogueState {
    dir: tempfile::TempDir,
    backing: Arc<MemoryStore>,
    key: MasterKey,
    /// The parameters now (a growth changes them).
    params: EngineParams,
}

impl CatalogueEngine {
    /// `engine` with `blocks` blocks of `block_size` bytes.
    pub fn new(engine: OramEngine, blocks: u64, block_size: u32) -> Self {
        let params = EngineParams {
            format: "blindfold-gateway".into(),
            version: PARAMS_VERSION,
            store: StoreUrl::Memory.to_string(),
            store_id: StoreId::random().to_hex(),
            block_size,
            blocks,
            z: 4,
            pad_objects: false,
            cache_levels: 0,
            cache_cells: 0,
            pack_levels: 0,
            engine,
            generation: 0,
        };
        Self { engine, params, state: Mutex::new(None) }
    }

    /// The suite's size for `engine`: 128 blocks of 64 bytes.
    pub fn small(engine: OramEngine) -> Self {
        Self::new(engine, 128, 64)
    }

    /// The engine's public parameters.
    pub fn params(&self) -> &EngineParams {
        &self.params
    }

    async fn open(
        &self,
        wrap: Wrap,
        creating: bool,
        new_key: Option<MasterKey>,
    ) -> Result<Arc<dyn SharedEngine>, ProxyError> {
        let (dir, backing, key, params) = {
            let mut state = self.state.lock();
            if creating {
                let geometry = oram_geometry(&self.params).expect("the suite's parameters");
                *state = Some(CatalogueState {
                    dir: tempfile::tempdir().expect("a temporary directory"),
                    backing: Arc::new(MemoryStore::new(geometry)),
                    key: MasterKey::generate(),
                    params: self.params.clone(),
                });
            }
            let s = state.as_ref().expect("create before reopen");
            (s.dir.path().to_path_buf(), Arc::clone(&s.backing), copy(&s.key), s.params.clone())
        };
        let geometry = backing.geometry();
        let store = wrap(backing as Arc<dyn Store>);
        let url = StoreUrl::Memory;
        let none = |s| s;
        let engine_store =
            EngineStore { store, url: &url, array: "oram", geometry, wrap_tee: &none };
        let (key, previous) = match &new_key {
            Some(new) => (copy(new), Some(key)),
            None => (key, None),
        };
        let (engine, _) =
            open_engine(&params, &dir, engine_store, &key, previous.as_ref(), creating).await?;
        if let Some(new) = new_key {
            self.state.lock().as_mut().expect("opened").key = new;
        }
        Ok(engine)
    }
}

/// A second copy of a key (the suite's own keys, in a test).
fn copy(key: &MasterKey) -> MasterKey {
    MasterKey::from_bytes(*key.expose_bytes())
}

#[async_trait(?Send)]
impl Subject for CatalogueEngine {
    fn name(&self) -> String {
        self.engine.to_string()
    }

    fn block_size(&self) -> usize {
        self.params.block_size as usize
    }

    fn blocks(&self) -> u64 {
        self.state.lock().as_ref().map_or(self.params.blocks, |s| s.params.blocks)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            crash: true,
            rotate: true,
            rebuild: true,
            view: physical_view(&self.params).ok(),
            // (The TEE engine reshuffles every node after a crash; the partition engines
            // rebuild their partitions.)
            reopen_reads_seen: matches!(self.engine, OramEngine::Tao | OramEngine::PathOram),
            fresh_reads: None,
        }
    }

    async fn create(&self, wrap: Wrap) -> Arc<dyn SharedEngine> {
        self.open(wrap, true, None)
            .await
            .unwrap_or_else(|e| panic!("creating the {} engine failed: {e}", self.engine))
    }

    async fn reopen(&self, wrap: Wrap) -> Result<Arc<dyn SharedEngine>, ProxyError> {
        self.open(wrap, false, None).await
    }

    async fn rotate(&self, wrap: Wrap) -> Result<Arc<dyn SharedEngine>, ProxyError> {
        self.open(wrap, false, Some(MasterKey::generate())).await
    }

    async fn rebuild(&self, wrap: Wrap, grow_to: Option<u64>) -> Result<Rebuilt, ProxyError> {
        let (dir, old, key, params) = {
            let state = self.state.lock();
            let s = state.as_ref().expect("create before rebuild");
            (s.dir.path().to_path_buf(), Arc::clone(&s.backing), copy(&s.key), s.params.clone())
        };
        // A new store array, as `recover` and `grow` make one (the next generation).
        let to = EngineParams {
            blocks: grow_to.unwrap_or(params.blocks),
            generation: params.generation + 1,
            ..params.clone()
        };
        let new = Arc::new(MemoryStore::new(oram_geometry(&to)?));
        let epoch = blindfold_proxy::rebuild::fresh_epoch();
        let (old_w, new_w) =
            (wrap(old as Arc<dyn Store>), wrap(Arc::clone(&new) as Arc<dyn Store>));
        let report = match grow_to {
            Some(_) => lifecycle::grow(&to, &dir, old_w, new_w, &key, epoch).await?,
            None => lifecycle::rebuild(&params, &dir, old_w, new_w, &key, epoch).await?,
        };
        let mut state = self.state.lock();
        let s = state.as_mut().expect("create before rebuild");
        s.backing = new;
        s.params = to;
        Ok(report)
    }
}
